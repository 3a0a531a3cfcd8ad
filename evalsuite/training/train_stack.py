"""The training loop of :func:`evalsuite.training.train.train` for C models trained as one stack
(:mod:`evalsuite.training.stack`).

Each cell follows its own run exactly as :func:`~evalsuite.training.train.train` would run it alone: its learning
rate schedule (``configs[c]``: the cells' settings agree but for ``lr``), its batches (``batches[c]``), its log and
evaluation steps, its early stop and divergence, and its :class:`~evalsuite.training.train.TrainResult` (history,
final and best evaluations). A cell that stops trains on at learning rate 0 (its weights stay exactly as they
were) while the others go on; the stack ends when every cell has. Times are the stack's wall clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch
from torch import nn

from evalsuite.errors import UserError
from evalsuite.training.stack import GraphedStackStep, StackedAdamW, StackedModel, StackStep
from evalsuite.training.train import (
    SNAPSHOT_EVERY_S,
    TrainConfig,
    TrainResult,
    autocast_dtype,
    check_step,
    checkpoint_at,
    compiled,
    evaluate_into,
    lr_at,
    masked_cross_entropy,
    write_snapshot,
)

Batches = Iterator[tuple[torch.Tensor, torch.Tensor]]


def shared_config(configs: Sequence[TrainConfig]) -> TrainConfig:
    """The settings every cell shares (the first cell's); a UserError when they differ in anything but ``lr``."""
    first = configs[0]
    for config in configs[1:]:
        if replace(config, lr=first.lr) != first:
            raise UserError("cells of one stack must share every training setting but the learning rate")
    return first


def _stack_loss(stack: StackedModel, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return stack(inputs, labels)


def train_stack(
    models: Sequence[nn.Module],
    batches: Sequence[Batches],
    configs: Sequence[TrainConfig],
    *,
    evaluate: Sequence[Callable[[nn.Module], dict]] | None = None,
    loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] = masked_cross_entropy,
    on_step: Callable[[int], None] | None = None,
    on_finish: Callable[[int, TrainResult], None] | None = None,
    cuda_graph: bool = False,
    compile: bool = False,
    snapshot: Path | None = None,
    snapshot_every_s: float | None = None,
) -> list[TrainResult]:
    """Train ``models`` (C of one architecture and shape, on one device) as one stack; each cell ``c`` as
    :func:`~evalsuite.training.train.train` would train ``models[c]`` on ``batches[c]`` under ``configs[c]`` with
    ``evaluate[c]`` (module docstring). ``loss_fn`` is one model's loss, as train's; ``on_step(step)`` after every
    step of the stack; ``on_finish(c, result)`` once per cell, when it stops or the stack ends (and again on resuming
    a snapshot that holds it finished: the caller may not have kept it before the run was cut short). ``cuda_graph``,
    ``compile``, ``snapshot`` and ``snapshot_every_s`` as train's (the snapshot holds the whole stack). Like train,
    it leaves each model with its cell's trained weights."""
    config = shared_config(configs)
    if not len(models) == len(batches) == len(configs) or (evaluate is not None and len(evaluate) != len(models)):
        raise ValueError("a stack needs one model, batch iterator, config (and evaluate) per cell")
    device = next(models[0].parameters()).device
    if cuda_graph and device.type != "cuda":
        raise UserError(f"cuda_graph needs a CUDA model, got one on {device}")
    stack = StackedModel(models, loss_fn)
    optimizer = StackedAdamW(stack, [c.lr for c in configs], weight_decay=config.weight_decay, betas=config.betas,
                             eps=config.eps, decay_dims=0 if config.decay_all_params else 2)  # fmt: skip
    run = _Run(stack, configs, evaluate, [TrainResult(steps=0, seconds=0.0) for _ in models], on_finish)
    first, resumed = _resume(snapshot, stack, optimizer, run)
    for cell_batches in batches:
        for _ in range(first):
            next(cell_batches)
    forward = compiled(_stack_loss) if compile else _stack_loss
    stepper = (GraphedStackStep if cuda_graph else StackStep)(stack, optimizer, forward, config.grad_clip,
                                                               autocast_dtype(config.amp, device))  # fmt: skip
    run.start = saved = time.perf_counter() - resumed
    every = SNAPSHOT_EVERY_S if snapshot_every_s is None else snapshot_every_s
    count = 0
    for model in models:
        model.train()
    for step in range(first, config.max_steps):
        lrs = [0.0 if run.done[c] else lr_at(step, cfg) for c, cfg in enumerate(configs)]
        pairs = [next(cell_batches) for cell_batches in batches]
        inputs = torch.stack([x for x, _ in pairs]).to(device, non_blocking=True)  # [C, B, T]
        labels = torch.stack([y for _, y in pairs]).to(device, non_blocking=True)
        stepper(inputs, labels, torch.tensor(lrs, dtype=torch.float32).to(device, non_blocking=True))
        count += 1
        run.advance(step + 1)
        if on_step is not None:
            on_step(step + 1)
        log_now, do_eval = checkpoint_at(step + 1, config, evaluate is not None)
        if not log_now:
            continue
        run.log(stepper, step + 1, lrs, count, do_eval)
        count = 0
        if all(run.done):
            break
        if snapshot is not None and time.perf_counter() - saved >= every:
            _save(snapshot, stack, optimizer, run, step + 1)
            saved = time.perf_counter()
    run.close()
    for c in range(len(models)):
        stack.cell(c)
    if snapshot is not None:
        snapshot.unlink(missing_ok=True)
    return run.results


class _Run:
    """The cells' bookkeeping: their results, which are done, the log steps, the closing evaluations."""

    def __init__(self, stack: StackedModel, configs, evaluate, results: list[TrainResult], on_finish):
        self.stack, self.configs, self.evaluate, self.results = stack, configs, evaluate, results
        self.on_finish = on_finish
        self.done = [False] * len(results)
        self.start = time.perf_counter()

    def advance(self, steps: int) -> None:
        for result, done in zip(self.results, self.done, strict=True):
            if not done:
                result.steps = steps

    def log(self, stepper: StackStep, step: int, lrs: list[float], count: int, do_eval: bool) -> None:
        """A log step: each running cell's history entry, evaluation when due, early stop or divergence (as
        train's)."""
        losses = (stepper.loss_sum / count).tolist()  # the one host-device sync per log step
        norms = stepper.grad_norm.tolist()
        stepper.loss_sum.zero_()
        for c, result in enumerate(self.results):
            if self.done[c]:
                continue
            entry = {"step": step, "lr": lrs[c], "loss": losses[c], "grad_norm": norms[c]}
            evaluate = None if self.evaluate is None else self.evaluate[c]
            due = evaluate is not None and (do_eval or not math.isfinite(losses[c]))
            model = self.stack.cell(c) if due else None  # its weights, only where an evaluation reads them
            stop = check_step(model, evaluate, do_eval, self.configs[c], result, entry)
            entry["seconds"] = time.perf_counter() - self.start
            result.history.append(entry)
            if stop:
                self._finish(c)

    def close(self) -> None:
        """The cells still running at the end: their last evaluation where none ran, their results reported."""
        for c, result in enumerate(self.results):
            if self.done[c]:
                continue
            if self.evaluate is not None and result.final_eval is None:
                evaluate_into(self.stack.cell(c), self.evaluate[c], self.configs[c], result, {"step": result.steps})
            self._finish(c)

    def _finish(self, c: int) -> None:
        self.done[c] = True
        self.results[c].seconds = time.perf_counter() - self.start
        if self.on_finish is not None:
            self.on_finish(c, self.results[c])


def _save(path: Path, stack: StackedModel, optimizer: StackedAdamW, run: _Run, step: int) -> None:
    write_snapshot(path, {"model": stack.flat, "optimizer": optimizer.state_dict(), "step": step,
                          "seconds": time.perf_counter() - run.start, "done": run.done,
                          "results": [asdict(r) for r in run.results]})  # fmt: skip


def _resume(path: Path | None, stack: StackedModel, optimizer: StackedAdamW, run: _Run) -> tuple[int, float]:
    """Load a snapshot :func:`_save` wrote; returns the stack's step and seconds (0, 0.0 without one)."""
    if path is None or not path.exists():
        return 0, 0.0
    state = torch.load(path, map_location=stack.flat.device, weights_only=True)
    stack.flat.copy_(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    for c, (result, saved) in enumerate(zip(run.results, state["results"], strict=True)):
        for key, value in saved.items():
            setattr(result, key, value)
        if state["done"][c]:  # reported again: the caller may not have kept it before the run was cut short
            run.done[c] = True
            if run.on_finish is not None:
                run.on_finish(c, result)
    return state["step"], state["seconds"]
