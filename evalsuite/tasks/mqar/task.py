"""The MQAR task on the runner (:func:`evalsuite.tasks.runner.run_task`): train every pending cell of a sweep.

MQAR needs no adapter: it trains its own models (``needs`` is empty, ``run_task(task, None, out_dir)``). A run
directory is a collection of cells from any sweep: rerunning a preset after a new architecture lands adds its rows,
and a sweep with other options gets its own directory name (:func:`default_run_dir`). So the run-level config is
constant (``{}``) and each record is keyed by the hash of its cell's config; the sweep goes into the summary.

``results.json`` (the runner's shape): ``records`` are the best accuracy over learning rates of every cell in the
directory; ``summary`` is ``{preset, sweep, cells: {total, finished, pending}, errors}``; ``provenance`` holds
what the records share (device, dtype, versions, ...) and, under ``summary``, where this summary was written.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import NamedTuple

import torch

from evalsuite.errors import UserError
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.provenance import device_name, provenance
from evalsuite.runs.rundir import RunDir, ShardFollower
from evalsuite.runs.store import config_hash
from evalsuite.runtime import resolve_device
from evalsuite.tasks.base import Plan, Task, check_known_options, register_task
from evalsuite.tasks.mqar.stack import Unit, plan_units, unit_handler
from evalsuite.tasks.mqar.sweep import (
    Cell,
    MQARSweep,
    cell_config,
    default_run_dir,
    hashes_at_smaller_budgets,
    load_preset,
    resolve_model,
    sweep_cells,
)
from evalsuite.tasks.mqar_summary import best_records, cell_key, finished_keys, latest_cells, shared_provenance
from evalsuite.tasks.runner import run_task
from evalsuite.training.pool import run_pool

SNAPSHOT_DIR = "partial"  # in the run directory: snapshots of cells in training (training.train.train's snapshot)
DEFAULT_PRESET = "ci"  # the sweep `evalsuite mqar` and `evalsuite run mqar` start from
# MQARTask's options besides the sweep (``evalsuite run mqar --set device=cpu``)
RUN_OPTIONS = ("device", "attention", "workers", "threads", "cuda_graph", "compile", "stack", "time_limit")
DEFAULT_STACK = 8  # cells per stack at most (``stack=True``)


@dataclass(frozen=True, kw_only=True)
class MQARPlan(Plan):
    """The sweep resolved for this machine: the device, whether steps are CUDA graphs and compiled, how many cells
    train as one stacked model at most (1: each alone), every cell in run order and its config hash (a cell's
    record key)."""

    device: torch.device
    cuda_graph: bool
    compile: bool
    stack: int
    cells: list[Cell]
    hashes: list[str]


class SweepOutcome(NamedTuple):
    """What a run of the sweep leaves for the aggregate: the latest record of every cell in the directory, and the
    error messages of the cells that failed (every rank's)."""

    rows: list[dict]
    errors: list[str]


@register_task
class MQARTask(Task):
    """A sweep of MQAR cells (``Config`` = :class:`MQARSweep`) and how to run it: ``device``, ``attention`` (checked
    against each model's family), ``workers`` (subprocesses training cells on the device), ``threads`` (cells trained
    at once in each worker, each on its own CUDA stream), ``cuda_graph`` (each training step replayed as one CUDA
    graph; default: on CUDA devices), ``compile`` (the forward and loss through ``torch.compile``; default: on CUDA
    devices), ``stack`` (cells that differ only in learning rate or seed train together as one stacked model,
    :mod:`evalsuite.tasks.mqar.stack`: True for stacks of up to :data:`DEFAULT_STACK` cells, an int for up to
    that many, False (the default) or 1 for each cell alone), ``time_limit`` (seconds, after which no new cell
    starts), ``preset`` (its name, for the default directory and the summary) and ``on_record(record)`` (called
    after each finished cell)."""

    name = "mqar"
    command = "mqar"
    needs = frozenset()
    Config = MQARSweep
    shards = True  # under torchrun each rank trains its own cells (its device: cuda:LOCAL_RANK)
    reuse_finished = False  # the run-level config is constant: a finished directory may still lack this sweep's cells

    def __init__(
        self,
        config: MQARSweep | None = None,
        *,
        device: str = "auto",
        attention: str = "auto",
        workers: int = 1,
        threads: int = 1,
        cuda_graph: bool | None = None,
        compile: bool | None = None,
        stack: bool | int = False,
        time_limit: float | None = None,
        preset: str | None = None,
        on_record=None,
    ):
        super().__init__(config)
        self.device, self.attention, self.workers, self.threads = device, attention, workers, threads
        self.cuda_graph, self.compile, self.stack = cuda_graph, compile, stack
        self.time_limit, self.preset, self.on_record = time_limit, preset, on_record

    @classmethod
    def from_options(cls, options: dict) -> MQARTask:
        """``evalsuite run mqar --set KEY=VALUE``: ``preset`` (default ci, as ``evalsuite mqar``), the options of
        :data:`RUN_OPTIONS`, and sweep fields applied over the preset."""
        check_known_options(cls.name, options, {f.name for f in fields(MQARSweep)} | {"preset", *RUN_OPTIONS})
        changes = dict(options)
        preset = changes.pop("preset", DEFAULT_PRESET)
        run_options = {k: changes.pop(k) for k in RUN_OPTIONS if k in changes}
        return cls(MQARSweep.from_dict({**load_preset(preset).to_dict(), **changes}), preset=preset, **run_options)

    # -- the plan, validated before the run directory is claimed ---------------------------------------------

    def prepare(self, adapter) -> MQARPlan:
        """Config ``{}``: a run directory collects cells of any sweep (see the module docstring). Checks the device,
        every model (a meta-device build at each width) and the attention backend of each family."""
        device = resolve_device(self.device)
        on_cuda = device.type == "cuda"
        cuda_graph = on_cuda if self.cuda_graph is None else self.cuda_graph
        compile = on_cuda if self.compile is None else self.compile
        if cuda_graph and not on_cuda:
            raise UserError(f"CUDA graphs need a CUDA device, not {device}")
        stack = self.stack
        if isinstance(stack, bool):
            stack = DEFAULT_STACK if stack else 1
        if not isinstance(stack, int) or stack < 1:
            raise UserError(f"stack must be a positive number of cells (or true/false), got {self.stack}")
        sweep = self.config
        cells = sweep_cells(sweep)
        cards = {name: resolve_model(name) for name in dict.fromkeys(c.model for c in cells)}
        for name, card in cards.items():
            for d in sweep.d_models:
                with torch.device("meta"):
                    module = card.with_config(sweep.overrides(name, d)).build_module()
                try:
                    module.set_attention_backend(self.attention, device)
                except UserError as e:
                    raise UserError(f"MQAR model {name}: {e}") from None
        hashes = [config_hash(cell_config(sweep, c, cards[c.model])) for c in cells]
        return MQARPlan(
            config={}, device=device, cuda_graph=cuda_graph, compile=compile, stack=stack, cells=cells, hashes=hashes
        )

    def default_dir(self, plan: MQARPlan, adapter, chash: str) -> Path:
        return default_run_dir(self.config, self.preset)

    def provenance_extra(self, plan: MQARPlan, outcome: SweepOutcome) -> dict:
        # the numbers come from the records: what they all share
        return {**shared_provenance(outcome.rows), "summary": provenance(device=device_name(plan.device))}

    # -- the work ----------------------------------------------------------------------------------------------

    def execute(self, plan: MQARPlan, adapter, run: RunDir, progress: bool = True) -> SweepOutcome | None:
        """Train this rank's share of the cells not in ``run`` yet, appending each record as it finishes; rank 0
        returns the latest record of every cell in the directory (this sweep's and any other's) and every rank's
        failed cells."""
        world = run.world
        # every rank works out the same reuses from records.jsonl; one writes them
        reused = self._reuse_early_stops(plan, run, write=world.is_main)
        done = finished_keys(run.records()) | reused
        pending = [(i, c) for i, (c, h) in enumerate(zip(plan.cells, plan.hashes, strict=True)) if h not in done]
        deadline = None if self.time_limit is None else time.time() + self.time_limit
        threads = torch.get_num_threads()
        if plan.device.type == "cpu" and self.config.cpu_threads:
            # Tiny models gain little from more threads, and OpenMP threads that wait on each other slow to a
            # crawl when other processes share the cores.
            torch.set_num_threads(self.config.cpu_threads)
        try:
            errors = self._train(plan, run, pending, deadline, progress)
        finally:
            torch.set_num_threads(threads)
        errors = world.gather(errors)  # every rank's failed cells, and their records in records.jsonl, on rank 0
        if not world.is_main:
            return None
        run.merge_shards(order=plan.hashes)
        return SweepOutcome(latest_cells(run.records()), [e for rank_errors in errors for e in rank_errors])

    def _reuse_early_stops(self, plan: MQARPlan, run: RunDir, write: bool = True) -> set[str]:
        """Record, for each pending cell, a run of it under a smaller step budget that stopped early (solved), as
        :func:`hashes_at_smaller_budgets` allows; the copy names its origin (``reused_from``). Returns the keys of
        the cells so recorded (``write=False``: only works them out)."""
        records = {cell_key(r): r for r in latest_cells(run.records())}
        solved = {k: r for k, r in records.items() if r.get("stopped_early") and (r.get("config") or {}).get("train")}
        budgets = sorted({r["config"]["train"]["max_steps"] for r in solved.values()})
        keys: set[str] = set()
        if not budgets:
            return keys
        for cell, chash in zip(plan.cells, plan.hashes, strict=True):
            if chash in records:
                continue
            for old, budget in hashes_at_smaller_budgets(self.config, cell, budgets).items():
                if old in solved:
                    config = cell_config(self.config, cell)
                    reused = {**solved[old], "key": chash, "config_hash": chash, "config": config}
                    if write:
                        run.append({**reused, "reused_from": {"key": old, "max_steps": budget}})
                    records[chash] = reused
                    keys.add(chash)
                    break
        return keys

    def _train(self, plan: MQARPlan, run: RunDir, pending: list[tuple[int, Cell]], deadline: float | None,
               progress: bool) -> list[str]:  # fmt: skip
        """Run this rank's share of the pending cells through the worker pool, alone or in stacks
        (:func:`~evalsuite.tasks.mqar.stack.plan_units`); the parent appends every record (no file locking).
        Returns the error messages of failed units (in subprocesses; in-process a failure raises). Rank 0's bar
        counts the steps of its own cells as they go and the cells other ranks finish, from their record files."""
        world = run.world
        steps, cells = self.config.max_steps, plan.cells
        snapshots = run.path / SNAPSHOT_DIR
        units = plan_units(self.config, cells, plan.hashes, {i for i, _ in pending}, plan.stack, snapshots)
        by_key = dict(zip(plan.hashes, cells, strict=True))
        advanced: dict[int, int] = {}
        finished = (len(cells) - len(pending)) * steps
        mine = world.shard([(u, unit) for u, (_, unit) in enumerate(units)])
        others = {plan.hashes[i] for i, _ in pending} - {plan.hashes[i] for u, _ in mine for i in units[u][0]}
        with progress_bar(len(cells) * steps, "mqar", enabled=progress, completed=finished) as bar:
            heartbeat = {"last": time.time(), "steps": finished}

            def credit(records: list[dict]) -> None:  # rank 0: cells the other ranks finished, from their files
                for record in records:
                    if record.get("key") in others:
                        others.discard(record["key"])
                        bar.advance(steps)

            def on_start(u: int) -> None:
                bar.update(description=f"mqar {unit_label(units[u][1])}")
                if not progress:  # a log instead of a bar: which cells run, and a heartbeat per minute below
                    print(f"mqar: start {unit_label(units[u][1])}", file=sys.stderr, flush=True)

            def on_progress(u: int, payload) -> None:
                if isinstance(payload, dict):  # a stacked cell's record, as it finishes
                    return add(u, payload)
                advanced[u] = advanced.get(u, 0) + payload
                bar.advance(payload)
                heartbeat["steps"] += payload
                if not progress and time.time() - heartbeat["last"] > 60:
                    heartbeat["last"] = time.time()
                    message = f"mqar: {heartbeat['steps']}/{len(cells) * steps} steps, {len(advanced)} units running"
                    print(message, file=sys.stderr, flush=True)

            def add(u: int, record: dict) -> None:
                run.append(record)
                if self.on_record is not None:
                    self.on_record(record)
                bar.update(description=f"mqar {cell_label(by_key[record['key']])}: {record['value']:.3f}")

            def on_result(u: int, records: list[dict]) -> None:
                for record in records:
                    add(u, record)
                left = steps * sum(units[u][1].emit) - advanced.pop(u, 0)
                bar.advance(left)
                heartbeat["steps"] += left

            following = world.size > 1 and world.is_main
            with ShardFollower(run.path, credit) if following else contextlib.nullcontext():
                errors = run_pool(
                    mine,
                    functools.partial(
                        unit_handler,
                        self.config.to_dict(),
                        str(plan.device),
                        self.attention,
                        plan.cuda_graph,
                        plan.compile,
                        str(snapshots),
                    ),
                    workers=self.workers,
                    threads=self.threads,
                    deadline=deadline,
                    torch_threads=max(1, torch.get_num_threads() // max(1, self.workers * self.threads)),
                    on_start=on_start,
                    on_progress=on_progress,
                    on_result=on_result,
                    on_error=lambda u, _message: u is not None and advanced.pop(u, None),
                )
                world.wait()  # for the other ranks' cells, the bar still moving
            return errors

    def aggregate(self, plan: MQARPlan, outcome: SweepOutcome, adapter, run: RunDir) -> tuple[list[dict], dict]:
        done = finished_keys(outcome.rows)
        pending = [asdict(c) for c, h in zip(plan.cells, plan.hashes, strict=True) if h not in done]
        total = len(plan.cells)
        summary = {
            "preset": self.preset,
            "sweep": self.config.to_dict(),
            "cells": {"total": total, "finished": total - len(pending), "pending": pending},
            "errors": outcome.errors,
        }
        return best_records(outcome.rows), summary


def unit_label(unit: Unit) -> str:
    """:func:`cell_label` of a unit's first cell, and how many more train with it."""
    more = f" (+{len(unit.cells) - 1} stacked)" if len(unit.cells) > 1 else ""
    return cell_label(unit.cells[0]) + more


def cell_label(c: Cell) -> str:
    """``model [variant] T=.. d=.. lr=.. seed=..`` for logs and the progress bar."""
    variant = f" [{c.variant}]" if c.variant else ""
    seed = f" seed={c.seed}" if c.seed is not None else ""
    return f"{c.model}{variant} T={c.seq_len} d={c.d_model} lr={c.lr:g}{seed}"


def run_mqar(
    sweep: MQARSweep,
    out_dir: Path | str | None = None,
    *,
    device: str = "auto",
    attention: str = "auto",
    workers: int = 1,
    threads: int = 1,
    cuda_graph: bool | None = None,
    compile: bool | None = None,
    stack: bool | int = False,
    time_limit: float | None = None,
    progress: bool = True,
    preset: str | None = None,
    on_record=None,
    repair: bool = False,
) -> dict:
    """Run (or resume) a sweep into ``out_dir`` (default: :func:`default_run_dir`); write ``results.json`` and
    return it. Options as :class:`MQARTask`'s; a spent ``time_limit`` leaves cells pending for a rerun; ``repair``:
    set aside corrupt record lines first (their cells train again)."""
    task = MQARTask(
        sweep,
        device=device,
        attention=attention,
        workers=workers,
        threads=threads,
        cuda_graph=cuda_graph,
        compile=compile,
        stack=stack,
        time_limit=time_limit,
        preset=preset,
        on_record=on_record,
    )
    return run_task(task, None, out_dir, progress, repair=repair)
