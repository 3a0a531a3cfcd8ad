"""MQAR cells trained together as one stacked model (:mod:`evalsuite.training.stack`).

Cells whose configs differ only in learning rate and training seed (same model, width, setting, recipe) are one
computation on different numbers: :func:`stack_groups` gathers them (at most ``size`` a stack) and
:func:`run_stack` trains a group as one model, each cell's record as its own run would write it (same fields, same
key; its ``provenance`` adds ``stack``, the number of cells trained together, and ``train_seconds`` is the stack's
time). A stack's snapshot (:func:`snapshot_name`, beside a list of its cells' keys) lets a stack cut short resume,
even after some of its cells have written their records.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import torch

from evalsuite.runs.store import atomic_write_json, config_hash
from evalsuite.tasks.mqar.cell import PROGRESS_EVERY, DataCache, run_cell, setup_cell, setup_record
from evalsuite.tasks.mqar.sweep import Cell, MQARSweep, cell_config, data_config
from evalsuite.training.train_stack import train_stack


def stack_key(config: dict) -> str:
    """What cells must share to train as one stack: a cell's config (:func:`cell_config`) but for its learning rate
    and training seed."""
    shared = {**config, "train": {k: v for k, v in config["train"].items() if k != "lr"}}
    shared.pop("init_seed")
    return config_hash(shared)


def stack_groups(configs: Sequence[dict], size: int) -> list[list[int]]:
    """Indices of ``configs`` (cells' configs, in run order) in stacks of at most ``size`` cells that share their
    :func:`stack_key`, in the order of their first cells."""
    groups: dict[str, list[list[int]]] = {}
    order: list[list[int]] = []
    for i, config in enumerate(configs):
        chunks = groups.setdefault(stack_key(config), [])
        if not chunks or len(chunks[-1]) >= size:
            chunks.append([])
            order.append(chunks[-1])
        chunks[-1].append(i)
    return order


def snapshot_name(keys: Sequence[str]) -> str:
    """The snapshot file of the stack of the cells keyed ``keys`` (its whole group): ``stack-<hash>.pt``; its
    cells' keys go beside it, in ``stack-<hash>.json``."""
    return f"stack-{config_hash({'cells': sorted(keys)})}.pt"


def resumable_members(snapshot: Path, pending: Sequence[str]) -> list[str] | None:
    """The keys of the cells a stack's snapshot trains, when it holds every cell of ``pending`` (the group's cells
    still without records); None when there is no such snapshot."""
    names = snapshot.with_suffix(".json")
    if not snapshot.exists() or not names.exists():
        return None
    members = json.loads(names.read_text())
    return members if set(pending) <= set(members) else None


def run_stack(
    sweep: MQARSweep,
    cells: Sequence[Cell],
    device: torch.device,
    data: dict[str, tuple[torch.Tensor, torch.Tensor]],
    attention: str = "auto",
    on_step: Callable[[int], None] | None = None,
    on_record: Callable[[int, dict], None] | None = None,
    cuda_graph: bool = False,
    compile: bool = False,
    snapshot: Path | None = None,
    snapshot_every_s: float | None = None,
) -> list[dict]:
    """Train ``cells`` (one :func:`stack_key`) as one stacked model on their shared ``data``; return their records,
    in order. ``on_record(i, record)`` as cell ``cells[i]`` finishes (a cell that stops early reports before the
    others end); ``snapshot``: the stack's snapshot file (:func:`snapshot_name`). Other arguments as
    :func:`run_cell`'s."""
    setups = [setup_cell(sweep, cell, device, data, attention) for cell in cells]
    records: list[dict | None] = [None] * len(cells)
    fields = {"attention": attention, "cuda_graph": cuda_graph, "compile": compile, "stack": len(cells)}

    def on_finish(c: int, result) -> None:
        records[c] = setup_record(setups[c], result, device, **fields)
        if on_record is not None:
            on_record(c, records[c])

    if snapshot is not None:
        snapshot.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(snapshot.with_suffix(".json"), [config_hash(s.config) for s in setups])
    train_stack([s.model for s in setups], [s.batches for s in setups], [s.train_config for s in setups],
                evaluate=[s.evaluate for s in setups], loss_fn=setups[0].loss_fn, on_step=on_step, on_finish=on_finish,
                cuda_graph=cuda_graph, compile=compile, snapshot=snapshot,
                snapshot_every_s=snapshot_every_s)  # fmt: skip
    if snapshot is not None:
        snapshot.with_suffix(".json").unlink(missing_ok=True)
    return records


class Unit(NamedTuple):
    """What one pool item trains: ``cells`` (one, or a stack), whether each one's record is wanted (``emit``: a
    resumed stack retrains cells that wrote theirs after its snapshot) and the stack's snapshot file name (None: a
    cell alone, whose snapshot is named by its key)."""

    cells: tuple[Cell, ...]
    emit: tuple[bool, ...]
    snapshot: str | None = None


def unit_handler(
    sweep_dict: dict,
    device: str,
    attention: str,
    cuda_graph: bool = False,
    compile: bool = False,
    snapshot_dir: str | None = None,
    snapshot_every_s: float | None = None,
) -> Callable[[Unit, Callable], list[dict]]:
    """A :func:`evalsuite.training.pool.run_pool` handler (built once per process; plain values, so it pickles into
    a worker): ``handler(unit, report) -> records``. One cell trains alone (:func:`run_cell`) and returns its record;
    more train as a stack (:func:`run_stack`), which reports each wanted record as its cell finishes and returns
    none. ``report`` gets cell steps (ints, every ``PROGRESS_EVERY`` steps) and those records (dicts). On CUDA each
    unit runs on a stream of its own, so units in threads of one process overlap on the GPU."""
    sweep = MQARSweep.from_dict(sweep_dict)
    dev = torch.device(device)
    cache = DataCache(dev)

    def handle(unit: Unit, report: Callable) -> list[dict]:
        wanted = sum(unit.emit)

        def on_step(step: int) -> None:
            if step % PROGRESS_EVERY == 0:
                report(PROGRESS_EVERY * wanted)

        first = unit.cells[0]
        data = cache.get(data_config(sweep, first.seq_len, first.num_kv_pairs))
        options = dict(on_step=on_step, cuda_graph=cuda_graph, compile=compile, snapshot_every_s=snapshot_every_s)
        stream = torch.cuda.stream(torch.cuda.Stream(dev)) if dev.type == "cuda" else contextlib.nullcontext()
        with stream:
            if len(unit.cells) == 1:
                return [run_cell(sweep, first, dev, data, attention, snapshot_dir=snapshot_dir, **options)]
            snapshot = None if snapshot_dir is None or unit.snapshot is None else Path(snapshot_dir) / unit.snapshot
            run_stack(sweep, unit.cells, dev, data, attention, snapshot=snapshot,
                      on_record=lambda i, r: unit.emit[i] and report(r), **options)  # fmt: skip
            return []

    return handle


def plan_units(sweep: MQARSweep, cells: Sequence[Cell], hashes: Sequence[str], pending: set[int], size: int,
               snapshot_dir: Path | None) -> list[tuple[tuple[int, ...], Unit]]:  # fmt: skip
    """The pool items of a run: ``(indices of the unit's cells in cells, unit)``, for the ``pending`` indices of
    ``cells``; stacks of up to ``size`` cells (:func:`stack_groups` over every cell, so that a group keeps its
    snapshot's name across reruns), a stack cut short resumed with its snapshot's cells (:func:`resumable_members`),
    cells alone with ``size`` 1."""
    if size <= 1:
        return [((i,), Unit((cells[i],), (True,))) for i in sorted(pending)]
    units = []
    for group in stack_groups([cell_config(sweep, c) for c in cells], size):
        todo = [i for i in group if i in pending]
        if not todo:
            continue
        name = snapshot_name([hashes[i] for i in group])
        members = None if snapshot_dir is None else resumable_members(snapshot_dir / name, [hashes[i] for i in todo])
        chosen = tuple(i for i in group if hashes[i] in members) if members else tuple(todo)
        unit = Unit(tuple(cells[i] for i in chosen), tuple(i in pending for i in chosen), name if chosen[1:] else None)
        units.append((chosen, unit))
    return units
