"""One compact training loop: MQAR now, small language models later.

No framework: AdamW, linear warmup then cosine decay, weight decay on matrices only, gradient clipping,
bf16 autocast on CUDA, periodic evaluation and early stopping on an evaluation metric. Everything that is
task-specific comes in as arguments:

* ``batches``: an iterator of ``(inputs, labels)`` long tensors ``[B, T]``; labels are -100 where no loss
  is taken (MQAR: everywhere but the query positions; an LM: nowhere but padding);
* ``evaluate``: ``model -> {"accuracy": ..., ...}``, called every ``eval_every`` steps and at the end;
* ``loss_fn``: ``(model, inputs, labels) -> scalar loss`` (default: cross-entropy on labelled positions).

A model is any module with ``forward(ids [B, T]) -> hidden [B, T, D]`` and ``logits(hidden [..., D]) ->
[..., V]`` (the :class:`evalsuite.models.base.CausalLM` protocol); :func:`build_model` makes one from a model card
with overrides, through the architecture registry.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.cards import ModelCard
from evalsuite.errors import UserError
from evalsuite.models.base import CausalLM
from evalsuite.runs.store import atomic_write_bytes
from evalsuite.training.train_step import EagerStep, GraphedStep, autocast

IGNORE_INDEX = -100
SNAPSHOT_EVERY_S = 120.0  # seconds of training between snapshots of an interruptible run (train's ``snapshot``)
AMP_MODES = ("auto", "bf16", "none")


# --------------------------------------------------------------------------------------------- models


def build_model(card: ModelCard, overrides: dict | None = None, seed: int = 0) -> CausalLM:
    """A freshly initialised model for ``card`` with config ``overrides`` (e.g. ``hidden_size``, ``num_layers``,
    ``num_heads``, ``use_mlp``, ``vocab_size``) applied on top of the card's own config.

    The config comes from the card's architecture preset in its family's registry
    (:mod:`evalsuite.models.registry`) and the module from :meth:`ModelCard.build_module`, so every registered
    architecture is buildable; weights come from the family's ``init_weights(seed)``.
    """
    model = card.with_config(overrides or {}).build_module()
    model.init_weights(seed)
    return model


# ------------------------------------------------------------------------------------------- config


SCHEDULES = ("warmup-cosine", "epoch-cosine")
# Fields added after records were keyed on TrainConfig.to_dict(): left out of it at these defaults, so the config
# hashes of earlier runs (results/mqar/...) stay valid.
_LATER_DEFAULTS = {"schedule": "warmup-cosine", "steps_per_epoch": None, "cosine_epochs": 64, "decay_all_params": False}


@dataclass
class TrainConfig:
    """Optimisation settings. ``lr`` is the peak rate, reached after ``warmup_steps`` (linear) and then annealed
    with a cosine to ``lr * min_lr_ratio``: at ``max_steps`` (``schedule="warmup-cosine"``), or stepped once per
    epoch of ``steps_per_epoch`` steps over ``cosine_epochs`` epochs (``"epoch-cosine"``: Zoology's
    ``CosineAnnealingLR(T_max=max_epochs)`` stepped per epoch, arXiv:2312.04927, so the rate stays near its peak
    for thousands of steps). Weight decay applies to matrices and embeddings only, or to every parameter with
    ``decay_all_params`` (Zoology's ``AdamW(model.parameters())``)."""

    lr: float = 1e-3
    max_steps: int = 1000
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    eval_every: int = 100
    early_stop: float | None = 0.99  # stop once the eval metric is strictly above this (Zoology: > 0.99)
    early_stop_metric: str = "accuracy"
    amp: str = "auto"  # "auto": bf16 autocast on CUDA, fp32 elsewhere; "bf16"; "none"
    log_every: int = 25
    schedule: str = "warmup-cosine"
    steps_per_epoch: int | None = None  # needed by "epoch-cosine"
    cosine_epochs: int = 64
    decay_all_params: bool = False

    def __post_init__(self):
        if self.max_steps < 1:
            raise UserError(f"max_steps must be >= 1, got {self.max_steps}")
        if not 0 <= self.warmup_steps <= self.max_steps:
            raise UserError(f"warmup_steps must be in [0, max_steps], got {self.warmup_steps}")
        if self.lr <= 0:
            raise UserError(f"learning rate must be > 0, got {self.lr}")
        if self.eval_every < 1 or self.log_every < 1:
            raise UserError("eval_every and log_every must be >= 1")
        if self.amp not in AMP_MODES:
            raise UserError(f"amp must be one of {', '.join(AMP_MODES)}, got {self.amp!r}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"schedule must be one of {', '.join(SCHEDULES)}, got {self.schedule!r}")
        if self.schedule == "epoch-cosine" and (not self.steps_per_epoch or self.steps_per_epoch < 1):
            raise UserError("schedule 'epoch-cosine' needs steps_per_epoch >= 1")
        if self.cosine_epochs < 1:
            raise UserError(f"cosine_epochs must be >= 1, got {self.cosine_epochs}")
        self.betas = tuple(self.betas)

    def to_dict(self) -> dict:
        """All settings; the later-added ones only when they differ from their defaults (see _LATER_DEFAULTS)."""
        return {k: v for k, v in asdict(self).items() if k not in _LATER_DEFAULTS or v != _LATER_DEFAULTS[k]}


@dataclass
class TrainResult:
    """What a run produced. ``history`` has one entry per log or eval step: ``step``, ``lr``, ``loss``
    (mean training loss since the previous log entry), ``grad_norm``, ``seconds`` and ``eval_*`` metrics."""

    steps: int
    seconds: float
    stopped_early: bool = False
    diverged: bool = False
    final_eval: dict | None = None
    best_eval: dict | None = None
    history: list[dict] = field(default_factory=list)


def checkpoint_at(done: int, config: TrainConfig, can_evaluate: bool) -> tuple[bool, bool]:
    """(log, evaluate) after ``done`` optimizer steps: a log entry every ``log_every`` steps, an evaluation every
    ``eval_every`` (where there is an evaluator), and both at the last step."""
    last = done == config.max_steps
    evaluate = can_evaluate and (done % config.eval_every == 0 or last)
    return evaluate or last or done % config.log_every == 0, evaluate


def lr_at(step: int, config: TrainConfig) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup, then cosine to the floor (over the run,
    or per epoch, see :class:`TrainConfig`)."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    if config.schedule == "epoch-cosine":
        progress = min((step // config.steps_per_epoch) / config.cosine_epochs, 1.0)
    else:
        span = max(config.max_steps - config.warmup_steps, 1)
        progress = min((step - config.warmup_steps) / span, 1.0)
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def autocast_dtype(config_amp: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype for ``amp`` on ``device`` (None: full fp32)."""
    if config_amp == "none" or (config_amp == "auto" and device.type != "cuda"):
        return None
    return torch.bfloat16


# -------------------------------------------------------------------------------------- loss / eval


def masked_cross_entropy(model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over labelled positions (labels != -100).

    inputs, labels: ``[B, T]`` long. Only the labelled rows of the hidden states go through the LM head,
    so a task with few targets per sequence (MQAR: one per query) never builds the ``[B, T, V]`` logits.
    """
    hidden = model(inputs)  # [B, T, D]
    mask = labels != IGNORE_INDEX
    logits = model.logits(hidden[mask])  # [N, V]
    return F.cross_entropy(logits.float(), labels[mask])


def gathered_cross_entropy(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, labels_per_row: int
) -> torch.Tensor:
    """:func:`masked_cross_entropy` with static shapes, so a CUDA graph can capture it: the first ``labels_per_row``
    labelled positions of each row (at least as many as any row has) are gathered by a stable sort on the mask
    instead of boolean indexing, whose output size the host must read. Rows with fewer labels pad with ignored
    positions; the mean is over labelled positions, as the masked version's.

    inputs, labels: ``[B, T]`` long; builds ``[B, labels_per_row, V]`` logits, never ``[B, T, V]``.
    """
    hidden = model(inputs)  # [B, T, D]
    mask = (labels != IGNORE_INDEX).to(torch.uint8)
    positions = torch.sort(mask, dim=1, descending=True, stable=True).indices[:, :labels_per_row]  # [B, K]
    picked = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # [B, K, D]
    logits = model.logits(picked).float()  # [B, K, V]
    return F.cross_entropy(logits.flatten(0, 1), labels.gather(1, positions).flatten(), ignore_index=IGNORE_INDEX)


@torch.no_grad()
def masked_accuracy(
    model: nn.Module, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], amp_dtype: torch.dtype | None = None
) -> dict:
    """Token accuracy and loss on labelled positions, Zoology's way: per example, the fraction of labelled
    positions where ``argmax == label``, averaged over examples (examples without labels are skipped).

    Returns ``{"accuracy", "loss", "n"}`` (n: examples counted).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    acc_sum, loss_sum, tokens, examples = 0.0, 0.0, 0, 0
    for inputs, labels in batches:
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with autocast(amp_dtype, device):
            hidden = model(inputs)
            mask = labels != IGNORE_INDEX
            logits = model.logits(hidden[mask]).float()  # [N, V]
        target = labels[mask]
        loss_sum += F.cross_entropy(logits, target, reduction="sum").item()
        correct = (logits.argmax(-1) == target).double()
        row = mask.nonzero()[:, 0]  # example index of every labelled position
        per_row = torch.zeros(labels.shape[0], dtype=torch.float64, device=device).index_add_(0, row, correct)
        counts = mask.sum(1)
        has = counts > 0
        acc_sum += (per_row[has] / counts[has]).sum().item()
        tokens += int(counts.sum())
        examples += int(has.sum())
    model.train(was_training)
    if examples == 0:
        raise UserError("evaluation data has no labelled positions")
    return {"accuracy": acc_sum / examples, "loss": loss_sum / tokens, "n": examples}


# -------------------------------------------------------------------------------------------- data


def shuffled_batches(
    inputs: torch.Tensor, labels: torch.Tensor, batch_size: int, rng: np.random.Generator
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless epochs over ``[N, T]`` tensors: a fresh permutation from ``rng`` each epoch, full batches only.

    The tensors may live on the GPU already; only the index moves.
    """
    n = inputs.shape[0]
    if batch_size > n:
        raise UserError(f"batch size {batch_size} exceeds the {n} training examples")
    while True:
        order = torch.from_numpy(rng.permutation(n)).to(inputs.device)
        for start in range(0, n - batch_size + 1, batch_size):
            idx = order[start : start + batch_size]
            yield inputs[idx], labels[idx]


def fixed_batches(inputs: torch.Tensor, labels: torch.Tensor, batch_size: int):
    """A callable giving one in-order pass over ``[N, T]`` tensors (for evaluation)."""

    def batches():
        for start in range(0, inputs.shape[0], batch_size):
            yield inputs[start : start + batch_size], labels[start : start + batch_size]

    return batches


# -------------------------------------------------------------------------------------------- loop


def make_optimizer(model: nn.Module, config: TrainConfig, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices and embeddings only: decaying norm gains and biases pulls them towards
    zero for no regularisation benefit (``decay_all_params``: on everything, as Zoology). ``capturable``: state and
    learning rate as device tensors, so the step can be captured in a CUDA graph (:mod:`.train_step`)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = (
        [{"params": params, "weight_decay": config.weight_decay}]
        if config.decay_all_params
        else [
            {"params": [p for p in params if p.ndim >= 2], "weight_decay": config.weight_decay},
            {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
        ]
    )
    fused = all(p.is_cuda for p in params)  # one kernel per step on the GPU
    if capturable:
        lr = torch.tensor(config.lr, device=params[0].device)
        for group in groups:
            group["lr"] = lr.clone()  # one tensor per group: the step fills each in place
        return torch.optim.AdamW(groups, lr=lr, betas=config.betas, eps=config.eps, fused=fused, capturable=True)
    return torch.optim.AdamW(groups, lr=config.lr, betas=config.betas, eps=config.eps, fused=fused or None)


def compiled(fn: Callable) -> Callable:
    """``torch.compile(fn)``, with room for many models: each cell of a sweep compiles its own model through the
    same loss function, and dynamo's default limit of 8 compiled versions per function would silently fall back to
    eager after the eighth."""
    import torch._dynamo

    for limit in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, max(getattr(torch._dynamo.config, limit), 256))
    return torch.compile(fn)


def train(
    model: nn.Module,
    batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
    config: TrainConfig,
    *,
    evaluate: Callable[[nn.Module], dict] | None = None,
    loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = masked_cross_entropy,
    on_step: Callable[[int], None] | None = None,
    cuda_graph: bool = False,
    compile: bool = False,
    snapshot: Path | None = None,
    snapshot_every_s: float | None = None,
) -> TrainResult:
    """Train ``model`` in place for up to ``config.max_steps`` optimizer steps.

    ``on_step(step)`` is called after every step (progress bars). Evaluation runs every ``eval_every`` steps
    and after the last step; training stops early once ``eval[early_stop_metric] > early_stop``, and stops
    as diverged when the training loss stops being finite. The host syncs with the GPU only at log and eval
    steps, so the loop does not stall a fast device. ``cuda_graph``: replay each step as one CUDA graph
    (:class:`evalsuite.training.train_step.GraphedStep`; a CUDA model, a capture-safe ``loss_fn`` such as
    :func:`gathered_cross_entropy`, batches of one shape). ``compile``: the forward and loss through
    ``torch.compile``, which fuses the chains of elementwise kernels that dominate a small model's step on a GPU.
    ``snapshot``: a file the run saves itself to (model, optimizer, step, history) at a log step every
    ``snapshot_every_s`` seconds (default :data:`SNAPSHOT_EVERY_S`), resumes from when it exists (skipping the
    ``batches`` already seen; same ``config`` and ``batches`` assumed), and deletes when done: a run killed
    mid-way loses at most that much.
    """
    device = next(model.parameters()).device
    amp_dtype = autocast_dtype(config.amp, device)
    if cuda_graph and device.type != "cuda":
        raise UserError(f"cuda_graph needs a CUDA model, got one on {device}")
    optimizer = make_optimizer(model, config, capturable=cuda_graph)
    result = TrainResult(steps=0, seconds=0.0)
    resumed = _resume(snapshot, model, optimizer, result)  # before the stepper: a CUDA graph captures the state
    for _ in range(result.steps):
        next(batches)
    if compile:
        loss_fn = compiled(loss_fn)
    stepper = (GraphedStep if cuda_graph else EagerStep)(model, optimizer, loss_fn, config.grad_clip, amp_dtype)
    saved = time.perf_counter()  # the last snapshot (or the start)
    start = saved - resumed  # so that times count the resumed run's seconds too
    snapshot_every = SNAPSHOT_EVERY_S if snapshot_every_s is None else snapshot_every_s
    loss_count = 0
    model.train()
    for step in range(result.steps, config.max_steps):
        lr = lr_at(step, config)
        inputs, labels = next(batches)
        stepper(inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True), lr)
        loss_count += 1
        result.steps = step + 1
        if on_step is not None:
            on_step(step + 1)

        log_now, do_eval = checkpoint_at(step + 1, config, evaluate is not None)
        if not log_now:
            continue
        entry = {"step": step + 1, "lr": lr, **_mean_loss(stepper, loss_count)}
        loss_count = 0
        stop = check_step(model, evaluate, do_eval, config, result, entry)
        entry["seconds"] = time.perf_counter() - start
        result.history.append(entry)
        if stop:
            break
        if snapshot is not None and time.perf_counter() - saved >= snapshot_every:
            result.seconds = time.perf_counter() - start
            _save(snapshot, model, optimizer, result)
            saved = time.perf_counter()
    if evaluate is not None and result.final_eval is None:
        evaluate_into(model, evaluate, config, result, {"step": result.steps})
    result.seconds = time.perf_counter() - start
    if snapshot is not None:
        snapshot.unlink(missing_ok=True)
    return result


def _mean_loss(stepper, count: int) -> dict:
    """The mean training loss of the last ``count`` steps and the last gradient norm; restarts the loss sum."""
    loss = (stepper.loss_sum / count).item()  # the one host-device sync per log step
    stepper.loss_sum.zero_()
    return {"loss": loss, "grad_norm": float(stepper.grad_norm)}


def check_step(model: nn.Module, evaluate, do_eval: bool, config: TrainConfig, result: TrainResult,
               entry: dict) -> bool:  # fmt: skip
    """At a log step (``entry``: its step, loss, ...): note divergence, evaluate when due (or diverged); True when
    training stops (diverged, or the early-stop threshold crossed)."""
    stop = False
    if not math.isfinite(entry["loss"]):
        result.diverged = stop = True
    if evaluate is not None and (do_eval or stop):
        stop = evaluate_into(model, evaluate, config, result, entry) or stop
        result.stopped_early = stop and not result.diverged
    return stop


def evaluate_into(model: nn.Module, evaluate, config: TrainConfig, result: TrainResult, entry: dict) -> bool:
    """Evaluate at ``entry["step"]``, note it in ``result`` and ``entry``; True when the early-stop threshold is
    crossed."""
    metric, step = config.early_stop_metric, entry["step"]
    scores = evaluate(model)
    result.final_eval = {"step": step, **scores}
    if result.best_eval is None or scores[metric] > result.best_eval[metric]:
        result.best_eval = {"step": step, **scores}
    entry.update({f"eval_{k}": v for k, v in scores.items()})
    return config.early_stop is not None and scores[metric] > config.early_stop


def _save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, result: TrainResult) -> None:
    """Write the run's state to ``path`` atomically (a kill mid-write leaves the previous snapshot)."""
    write_snapshot(path, {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "result": asdict(result)})


def write_snapshot(path: Path, state: dict) -> None:
    """``torch.save(state)`` to ``path`` atomically (a kill mid-write leaves the previous snapshot)."""
    # Serialised in memory first (the models that snapshot are small): torch.save into a file turns a full disk
    # into a RuntimeError that names no file, atomic_write_bytes into a UserError naming it.
    buffer = io.BytesIO()
    torch.save(state, buffer)
    atomic_write_bytes(path, buffer.getvalue())


def _resume(path: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer, result: TrainResult) -> float:
    """Load a snapshot :func:`_save` wrote into the model, optimizer and ``result``; returns the seconds it had
    trained (0.0 without one)."""
    if path is None or not path.exists():
        return 0.0
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for key, value in state["result"].items():
        setattr(result, key, value)
    return result.seconds
