"""One MQAR cell: train a fresh model on one setting's data and return its record.

A cell is (model, d_model, seq_len, kv pairs, lr) of :mod:`evalsuite.tasks.mqar.sweep`. Its record is a long-format
row (``model, task, subtask, length, metric="accuracy", value, n``) plus the MQAR fields the report plots (width,
learning rate, state size) and the training history; ``key`` and ``config_hash`` are the hash of the cell's config.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from evalsuite.cards import ModelCard
from evalsuite.data.mqar import mqar_data
from evalsuite.runs.provenance import device_name, provenance
from evalsuite.runs.store import config_hash
from evalsuite.tasks.mqar.sweep import Cell, MQARSweep, cell_config, resolve_model
from evalsuite.training.train import (
    IGNORE_INDEX,
    TrainConfig,
    TrainResult,
    autocast,
    autocast_dtype,
    build_model,
    fixed_batches,
    gathered_cross_entropy,
    masked_accuracy,
    shuffled_batches,
    train,
)

PROGRESS_EVERY = 10  # optimizer steps per progress report from a cell (a worker's reports cross a process queue)
GATE_STATS_EXAMPLES = 64  # test examples the forget-gate statistics are taken on at each evaluation


@torch.no_grad()
def forget_gate_stats(model: torch.nn.Module, inputs: torch.Tensor) -> dict:
    """Per layer (in call order), the mean forget gate over positions, heads (and GSA's slots) and the memory time
    scale it implies, ``-1 / mean(log f)`` (the distance over which the average gate decays a key by 1/e, as the
    FoX paper's Appendix D counts it), on ``inputs [B, T]``. Data-dependent gates only: every module whose
    ``forget_gate()`` names one (FoX's full gate, GSA's slot gates ``log alpha = logsigmoid(.) / tau``); ``{}`` for
    models without one."""
    log_f: list[torch.Tensor] = []
    gates = [gate for module in model.modules() if hasattr(module, "forget_gate") and (gate := module.forget_gate())]
    hooks = [proj.register_forward_hook(lambda _m, _i, out, tau=tau: log_f.append(F.logsigmoid(out.float()) / tau))
             for proj, tau in gates]  # fmt: skip
    if not hooks:
        return {}
    was_training = model.training
    model.eval()
    try:
        model(inputs)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    means = [lf.mean().item() for lf in log_f]
    return {
        "forget_gate_mean": [round(lf.exp().mean().item(), 6) for lf in log_f],
        "forget_time_scale": [round(-1.0 / m, 3) if m < 0 else None for m in means],  # None: gates fully open
    }


def decode_state_size(model: torch.nn.Module, length: int, dtype: torch.dtype) -> dict | None:
    """Bytes a model keeps per sequence to decode the next token after ``length`` tokens, or None.

    Every :class:`evalsuite.models.base.CausalLM` reports it (``decode_state_size(length, dtype)`` returning
    ``{"kind", "elements", "bytes", "dtype"}``): ``kind="recurrent"`` for a fixed state, ``"kv-cache"`` for attention,
    whose state grows with ``length`` (as Zoology counts attention, arXiv:2312.04927). Other modules give None.
    """
    own = getattr(model, "decode_state_size", None)
    return own(length, dtype) if callable(own) else None


@dataclass
class CellSetup:
    """A cell ready to train: its fresh model on the device (with the attention backend), training settings, batches,
    evaluation and loss, and what its record needs (its card and hashed config)."""

    cell: Cell
    card: ModelCard
    config: dict
    model: torch.nn.Module
    train_config: TrainConfig
    amp_dtype: torch.dtype | None
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
    evaluate: Callable[[torch.nn.Module], dict]
    loss_fn: Callable


def setup_cell(sweep: MQARSweep, cell: Cell, device: torch.device, data: dict[str, tuple[torch.Tensor, torch.Tensor]],
               attention: str = "auto") -> CellSetup:  # fmt: skip
    """Build ``cell``'s model and its training run on ``data`` (``{"train"|"test": (inputs, labels)}``, each
    ``[N, seq_len]`` long on ``device``)."""
    card = resolve_model(cell.model)
    config = cell_config(sweep, cell, card)
    sweep, seed = sweep.for_variant(cell.variant), config["init_seed"]
    model = build_model(card, config["model"]["overrides"], seed=seed).to(device)
    model.set_attention_backend(attention, device)
    tcfg = sweep.train_config(cell.lr, cell.seq_len)
    amp_dtype = autocast_dtype(tcfg.amp, device)
    train_x, train_y = data["train"]
    test_x, test_y = data["test"]
    order_rng = np.random.default_rng([seed, cell.seq_len, cell.num_kv_pairs, 2])
    batches = shuffled_batches(train_x, train_y, sweep.batch_for(cell.seq_len), order_rng)
    test_batches = fixed_batches(test_x, test_y, sweep.eval_batch_size)

    def evaluate(m):  # accuracy, and how open FoX's and GSA's gates are (the gates' role in learning)
        with autocast(amp_dtype, device):  # as the accuracy is measured (FoX's Triton kernel takes bf16 only)
            gates = forget_gate_stats(m, test_x[:GATE_STATS_EXAMPLES])
        return {**masked_accuracy(m, test_batches(), amp_dtype), **gates}

    # Static shapes for the graph: every MQAR row has its kv pairs' queries labelled, the same count per setting.
    loss_fn = functools.partial(gathered_cross_entropy, labels_per_row=int((train_y != IGNORE_INDEX).sum(1).max()))
    return CellSetup(cell, card, config, model, tcfg, amp_dtype, batches, evaluate, loss_fn)


def setup_record(setup: CellSetup, result: TrainResult, device: torch.device, **provenance_fields) -> dict:
    """The record of a trained :class:`CellSetup` (:func:`cell_record`); ``provenance_fields``: how it trained."""
    state = decode_state_size(setup.model, setup.cell.seq_len, setup.amp_dtype or torch.float32)
    dtype = "bfloat16 autocast" if setup.amp_dtype is not None else "float32"
    prov = provenance(device=device_name(device), dtype=dtype, seed=setup.config["init_seed"], **provenance_fields)
    return cell_record(setup.cell, setup.config, setup.card.architecture, setup.model, result, state, prov)


def run_cell(
    sweep: MQARSweep,
    cell: Cell,
    device: torch.device,
    data: dict[str, tuple[torch.Tensor, torch.Tensor]],
    attention: str = "auto",
    on_step: Callable[[int], None] | None = None,
    cuda_graph: bool = False,
    compile: bool = False,
    snapshot_dir: Path | None = None,
    snapshot_every_s: float | None = None,
) -> dict:
    """Train one fresh model on one cell's data (``{"train"|"test": (inputs, labels)}``, each ``[N, seq_len]``
    long on ``device``); return its record. ``cuda_graph``: each training step replayed as one CUDA graph
    (:mod:`evalsuite.training.train_step`; the same updates, without the launch overhead); ``compile``: the forward and
    loss through ``torch.compile`` (fused elementwise kernels; training/train.py). ``snapshot_dir``: the
    cell's training snapshots go to ``<snapshot_dir>/<key>.pt``, so a cell cut short (a GPU lease ending) resumes
    where its last snapshot left it instead of from step 0; ``snapshot_every_s``: seconds between snapshots (None:
    :func:`~evalsuite.training.train.train`'s default)."""
    setup = setup_cell(sweep, cell, device, data, attention)
    snapshot = None if snapshot_dir is None else Path(snapshot_dir) / f"{config_hash(setup.config)}.pt"
    result = train(setup.model, setup.batches, setup.train_config, evaluate=setup.evaluate, loss_fn=setup.loss_fn,
                   on_step=on_step, cuda_graph=cuda_graph, compile=compile, snapshot=snapshot,
                   snapshot_every_s=snapshot_every_s)  # fmt: skip
    return setup_record(setup, result, device, attention=attention, cuda_graph=cuda_graph, compile=compile)


def cell_record(cell: Cell, config: dict, architecture: str, model: torch.nn.Module, result: TrainResult,
                state: dict | None, prov: dict) -> dict:  # fmt: skip
    """The long-format record of a trained cell (``config``: :func:`cell_config`'s, whose hash keys it), with the
    MQAR fields the report plots and the training history; ``state``: the model's decode state size or None."""
    chash = config_hash(config)
    overrides = config["model"]["overrides"]
    seed = config["init_seed"]
    final = result.final_eval or {}
    return {
        "model": cell.model,
        "task": "mqar",
        "subtask": f"kv{cell.num_kv_pairs}/d{cell.d_model}/lr{cell.lr:g}"
        + (f"/{cell.variant}" if cell.variant else "")
        + (f"/seed{seed}" if cell.seed is not None else ""),
        "length": cell.seq_len,
        "metric": "accuracy",
        "value": final.get("accuracy"),
        "n": final.get("n"),
        "architecture": architecture,
        "variant": cell.variant or None,
        "seed": seed,
        "d_model": cell.d_model,
        "num_kv_pairs": cell.num_kv_pairs,
        "lr": cell.lr,
        "num_layers": overrides["num_layers"],
        "num_heads": overrides["num_heads"],
        "use_mlp": overrides["use_mlp"],
        "params": sum(p.numel() for p in model.parameters()),
        "state_kind": state and state["kind"],
        "state_elements": state and state["elements"],
        "state_bytes": state and state["bytes"],
        "state_dtype": state and state["dtype"],
        "test_loss": final.get("loss"),
        "best_accuracy": (result.best_eval or {}).get("accuracy"),
        "steps": result.steps,
        "stopped_early": result.stopped_early,
        "diverged": result.diverged,
        "train_seconds": round(result.seconds, 2),
        "history": result.history,
        "key": chash,
        "config_hash": chash,
        "config": config,
        "provenance": prov,
    }


class DataCache:
    """Generated data per data config, on the device, kept for the process (its cells share their data; a sweep has
    a few settings). Thread-safe: cells may train in threads of one process (training/pool.py)."""

    def __init__(self, device: torch.device):
        self.device, self._data, self._lock = device, {}, threading.Lock()

    def get(self, config: dict) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        key = config_hash(config)
        with self._lock:
            if key not in self._data:
                arrays = mqar_data(config)
                self._data[key] = {
                    split: (torch.from_numpy(x).to(self.device), torch.from_numpy(y).to(self.device))
                    for split, (x, y) in arrays.items()
                }
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)  # other threads read it on their own streams
            return self._data[key]
