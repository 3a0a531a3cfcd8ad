"""Milliseconds per MQAR training step (``evalsuite bench step-time``), per model, precision, attention backend,
CUDA graph or not, and number of cells training at once (in threads, or as one stacked model).

The ``gsa-paper`` preset's cell (or ``preset``) at ``d_model``: the model the sweep would build (its overrides: tied
head, 4 layers, no MLP, ...), trained by the sweep's loop (:func:`evalsuite.training.train.train`, with the sweep's
loss, schedule, optimizer and clipping) on batches of the preset's size drawn from its data. ``cells = N`` trains N
such models at once in threads of this process, each on its own CUDA stream (as ``evalsuite mqar --threads N``):
after ``warmup`` steps they meet at a barrier, then each times ``steps`` steps. With ``stack`` the N cells (seeds
0..N-1) train as one stacked model instead (:mod:`evalsuite.training.stack`, as ``evalsuite mqar --stack``), one
step of the stack a step of every cell. Reported per combination:
``ms_per_step`` (the window from the barrier to the last cell's end, over the steps one cell made: the step time a
cell sees with N cells sharing the GPU) and ``cell_steps_per_s`` (all cells' steps per second); compiled steps also
``graph_breaks`` (dynamo's, in the forward and loss); with ``profile = K`` the K kernels with most GPU time.
Written to ``out`` (a JSON file) after every combination.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

GRAPHS = ("eager", "graph", "compile")  # compile: torch.compile'd forward and loss, stepped as a CUDA graph


@dataclass
class _Cell:
    """What every timed cell of one run shares: the preset, its data on the device and the run's settings."""

    sweep: object
    seq_len: int
    batch: int
    x: torch.Tensor
    y: torch.Tensor
    loss_fn: object
    device: torch.device
    d_model: int
    steps: int
    warmup: int
    profile: int


def _setup(preset, d_model, steps, warmup, profile) -> _Cell:
    from evalsuite.data.mqar import mqar_data
    from evalsuite.tasks.mqar.sweep import data_config, load_preset
    from evalsuite.training.train import IGNORE_INDEX, gathered_cross_entropy

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    sweep = load_preset(preset)
    seq_len, kv = sweep.settings()[0]
    batch = sweep.batch_for(seq_len)
    data = mqar_data({**data_config(sweep, seq_len, kv), "num_train": 8 * batch, "num_test": 1})
    x, y = (torch.from_numpy(a).to(device) for a in data["train"])
    loss_fn = functools.partial(gathered_cross_entropy, labels_per_row=int((y != IGNORE_INDEX).sum(1).max()))
    return _Cell(sweep, seq_len, batch, x, y, loss_fn, device, d_model, steps, warmup, profile)


def _build(c: _Cell, name: str, backend: str | None, seed: int = 0):
    """The cell's model on the device, with ``backend`` (None: left as built)."""
    from evalsuite.tasks.mqar.sweep import resolve_model
    from evalsuite.training.train import build_model

    model = build_model(resolve_model(name), c.sweep.overrides(name, c.d_model), seed=seed).to(c.device)
    if backend is not None:
        model.set_attention_backend(backend)
    return model


def _train_cell(c: _Cell, name, amp, backend, graph, barrier, times, seed, setup, kernels, stack=1):
    """Train one model (``stack`` > 1: that many, seeds ``seed``.., as one stacked model) for warmup + steps steps on
    its own stream; append (start, end) of the timed steps."""
    from evalsuite.training.train import shuffled_batches, train
    from evalsuite.training.train_stack import train_stack

    on_gpu = c.device.type == "cuda"
    stream = torch.cuda.Stream() if on_gpu else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        seeds = range(seed, seed + stack)
        models = [_build(c, name, backend, s) for s in seeds]
        tcfg = c.sweep.train_config(1e-3, c.seq_len)
        tcfg.amp = "none" if amp == "tf32" else amp
        tcfg.max_steps, tcfg.warmup_steps, tcfg.log_every = c.warmup + c.steps, 0, 10**9
        marks, begin = [], time.perf_counter()
        batches = [shuffled_batches(c.x, c.y, c.batch, np.random.default_rng(s)) for s in seeds]
        activity = torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU
        profiler = torch.profiler.profile(activities=[activity]) if c.profile else None

        def on_step(step: int) -> None:
            if step == 1:
                setup.append(time.perf_counter() - begin)  # build + compile + capture + first step
            if step in (c.warmup, c.warmup + c.steps):
                if stream is not None:
                    stream.synchronize()
                if step == c.warmup:
                    barrier.wait()
                    if profiler is not None:
                        profiler.start()  # the timed steps only: compilation and capture stay out of the table
                marks.append(time.perf_counter())

        options = dict(loss_fn=c.loss_fn, on_step=on_step, cuda_graph=graph != "eager", compile=graph == "compile")
        if stack > 1:
            train_stack(models, batches, [tcfg] * stack, **options)
        else:
            train(models[0], batches[0], tcfg, **options)
        times.append(tuple(marks))
        if profiler is not None:
            profiler.stop()
            kernels.append(_top_kernels(profiler, on_gpu, c.profile, c.steps))


def _top_kernels(profiler, on_gpu: bool, top: int, steps: int) -> dict:
    """The profiled timed steps: self time per step (ms) in all and for the ``top`` costliest kernels, with their
    launches per step (``calls``)."""
    events = profiler.key_averages()
    own = (lambda e: e.self_device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)  # microseconds
    ranked = sorted(events, key=own, reverse=True)[:top]
    return {
        "kernel_ms_per_step": round(sum(own(e) for e in events) / 1e3 / steps, 4),
        "top": [{"name": e.key, "ms_per_step": round(own(e) / 1e3 / steps, 4), "calls": e.count / steps}
                for e in ranked],
    }  # fmt: skip


def _graph_breaks(c: _Cell, name, amp, backend) -> int:
    """Graph breaks dynamo finds in the cell's forward and loss (``torch._dynamo.explain``; 0: one compiled graph)."""
    model = _build(c, name, backend)
    bf16 = c.device.type == "cuda" and amp == "auto"

    def forward_loss(inputs, labels):
        with torch.autocast(c.device.type, dtype=torch.bfloat16, enabled=bf16):
            return c.loss_fn(model, inputs, labels)

    torch._dynamo.reset()
    return torch._dynamo.explain(forward_loss)(c.x[:8], c.y[:8]).graph_break_count


def _measure(c: _Cell, name, amp, backend, graph, cells, stack: bool = False) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = amp == "tf32"
    threads_n = 1 if stack else cells
    barrier, times, errors, setup, kernels = threading.Barrier(threads_n), [], [], [], []

    def run(i):
        try:
            _train_cell(c, name, amp, backend, graph, barrier, times, i, setup, kernels, cells if stack else 1)
        except Exception as e:  # noqa: BLE001 -- recorded
            errors.append(f"{type(e).__name__}: {e}"[:300])
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        return {"error": errors[0]}
    window = max(end for _, end in times) - min(start for start, _ in times)
    return {
        "ms_per_step": round(window * 1e3 / c.steps, 3),
        "cell_steps_per_s": round(cells * c.steps / window),
        "setup_s": round(max(setup), 2),
        **({"profile": kernels[0]} if kernels else {}),  # the first cell's
    }


def step_time(
    out,
    models=("fox-pro", "fox-llama", "transformer-llama", "transformer-pro", "gsa", "tnl"),
    preset: str = "gsa-paper",
    d_model: int = 128,
    amps=("none", "auto"),
    attention=("auto",),
    graphs=("eager", "graph"),
    cells=(1,),
    steps: int = 30,
    warmup: int = 5,
    profile: int = 0,
    stack: bool = False,
) -> list[dict]:
    """Every (model, amp, backend, graph, cells) combination (module doc; ``amps``: none (fp32), tf32 (fp32 with
    TF32 matmuls), auto (bf16 on CUDA); backends a model does not offer are skipped, and eager steps run one cell
    only unless stacked: in threads they are launch-bound on the host). ``stack``: several cells as one stacked
    model instead of threads. Returns the records."""
    from evalsuite.errors import UserError
    from evalsuite.runs.provenance import provenance

    bad = [g for g in graphs if g not in GRAPHS]
    if bad:
        raise UserError(f"unknown graph mode(s) {', '.join(bad)}; choose from {', '.join(GRAPHS)}")
    c = _setup(preset, d_model, steps, warmup, profile)
    records = []
    for name, amp, backend, graph, n in itertools.product(models, amps, attention, graphs, cells):
        threaded_eager = graph == "eager" and n > 1 and not stack
        if threaded_eager or backend not in _build(c, name, None).available_backends(c.device):
            continue
        rec = {"model": name, "d_model": d_model, "seq_len": c.seq_len, "batch": c.batch, "amp": amp,
               "attention": backend, "graph": graph, "cells": n, "stack": stack and n > 1}  # fmt: skip
        if graph == "compile":
            rec["graph_breaks"] = _graph_breaks(c, name, amp, backend)
        rec.update(_measure(c, name, amp, backend, graph, n, stack))
        records.append(rec)
        print(json.dumps(rec), flush=True)
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps({"provenance": provenance(device=str(c.device)), "records": records}, indent=1))
    return records
