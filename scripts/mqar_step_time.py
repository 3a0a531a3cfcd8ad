"""Milliseconds per MQAR training step, per model, precision, attention backend, CUDA graph or not, and number of
cells training at once (issue #13, part 5).

The ``gsa-paper`` preset's cell (or ``--preset``) at ``--d-model``: the model the sweep would build (its overrides:
tied head, 4 layers, no MLP, ...), trained by the sweep's loop (:func:`evalsuite.training.train.train`, with the sweep's
loss, schedule, optimizer and clipping) on batches of the preset's size drawn from its data. ``--cells N`` trains N
such models at once in threads of this process, each on its own CUDA stream (as ``evalsuite mqar --threads N``):
after ``--warmup`` steps they meet at a barrier, then each times ``--steps`` steps. Reported per combination:
``ms_per_step`` (the window from the barrier to the last cell's end, over the steps one cell made: the step time a
cell sees with N cells sharing the GPU) and ``cell_steps_per_s`` (all cells' steps per second); compiled steps also
``graph_breaks`` (dynamo's, in the forward and loss). One JSON line per combination, all written to ``--out``.

Usage (GPU machine): PYTHONPATH=. python3 scripts/mqar_step_time.py --out step_time.json \
    [--models fox-pro,gsa] [--amp none,tf32,auto] [--graph eager,graph] [--cells 1,8] [--attention auto,dense]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import threading
import time
from pathlib import Path

import numpy as np
import torch

from evalsuite.data.mqar import mqar_data
from evalsuite.runs.provenance import provenance
from evalsuite.tasks.mqar.sweep import data_config, load_preset, resolve_model
from evalsuite.training.train import IGNORE_INDEX, build_model, gathered_cross_entropy, shuffled_batches, train

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True, help="JSON file, rewritten after every combination")
ap.add_argument("--preset", default="gsa-paper")
ap.add_argument("--models", default="fox-pro,fox-llama,transformer-llama,transformer-pro,gsa,tnl")
ap.add_argument("--d-model", type=int, default=128)
ap.add_argument("--amp", default="none,auto", help="none (fp32), tf32 (fp32 with TF32 matmuls), auto (bf16 on CUDA)")
ap.add_argument("--attention", default="auto", help="comma-separated backends (skipped where not offered)")
ap.add_argument(
    "--graph",
    default="eager,graph",
    help="comma-separated: eager, graph (CUDA graph per step), compile (torch.compile'd loss + graph)",
)
ap.add_argument("--cells", default="1", help="comma-separated numbers of cells training at once (threads)")
ap.add_argument("--steps", type=int, default=30)
ap.add_argument("--warmup", type=int, default=5)
ap.add_argument("--profile", type=int, default=0, help="print the N kernels with most GPU time (per cell)")
args = ap.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
on_gpu = device.type == "cuda"
sweep = load_preset(args.preset)
seq_len, kv = sweep.settings()[0]
batch = sweep.batch_for(seq_len)
data = mqar_data({**data_config(sweep, seq_len, kv), "num_train": 8 * batch, "num_test": 1})
x, y = (torch.from_numpy(a).to(device) for a in data["train"])
loss_fn = functools.partial(gathered_cross_entropy, labels_per_row=int((y != IGNORE_INDEX).sum(1).max()))


def train_cell(name, amp, backend, graph, barrier, times, seed, setup, kernels):
    """Train one model for warmup + steps steps on its own stream; append (start, end) of the timed steps."""
    stream = torch.cuda.Stream() if device.type == "cuda" else None
    with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
        model = build_model(resolve_model(name), sweep.overrides(name, args.d_model), seed=seed).to(device)
        model.set_attention_backend(backend)
        tcfg = sweep.train_config(1e-3, seq_len)
        tcfg.amp = "none" if amp == "tf32" else amp
        tcfg.max_steps, tcfg.warmup_steps, tcfg.log_every = args.warmup + args.steps, 0, 10**9
        marks, begin = [], time.perf_counter()
        batches = shuffled_batches(x, y, batch, np.random.default_rng(seed))
        activity = torch.profiler.ProfilerActivity.CUDA if on_gpu else torch.profiler.ProfilerActivity.CPU
        profiler = torch.profiler.profile(activities=[activity]) if args.profile else None

        def on_step(step: int) -> None:
            if step == 1:
                setup.append(time.perf_counter() - begin)  # build + compile + capture + first step
            if step in (args.warmup, args.warmup + args.steps):
                if stream is not None:
                    stream.synchronize()
                if step == args.warmup:
                    barrier.wait()
                    if profiler is not None:
                        profiler.start()  # the timed steps only: compilation and capture stay out of the table
                marks.append(time.perf_counter())

        train(model, batches, tcfg, loss_fn=loss_fn, on_step=on_step, cuda_graph=graph != "eager",
              compile=graph == "compile")  # fmt: skip
        times.append(tuple(marks))
        if profiler is not None:  # GPU time by kernel over the timed steps, full kernel names
            profiler.stop()
            sort = "self_device_time_total" if on_gpu else "self_cpu_time_total"
            table = profiler.key_averages().table(sort_by=sort, row_limit=args.profile, max_name_column_width=160)
            print(f"{name} amp={amp} {graph}: {args.steps} timed steps\n{table}", flush=True)
            kernels.append(top_kernels(profiler, on_gpu))


def top_kernels(profiler, on_gpu: bool) -> dict:
    """The profiled timed steps as a record: self time per step (ms) in all and for the ``--profile`` costliest
    kernels, with their launches per step (``calls``)."""
    events = profiler.key_averages()
    own = (lambda e: e.self_device_time_total) if on_gpu else (lambda e: e.self_cpu_time_total)  # microseconds
    ranked = sorted(events, key=own, reverse=True)[: args.profile]
    per_step = lambda us: round(us / 1e3 / args.steps, 4)  # noqa: E731
    return {
        "kernel_ms_per_step": per_step(sum(own(e) for e in events)),
        "top": [{"name": e.key, "ms_per_step": per_step(own(e)), "calls": e.count / args.steps} for e in ranked],
    }


def graph_breaks(name, amp, backend) -> int:
    """Graph breaks dynamo finds in the cell's forward and loss (``torch._dynamo.explain``; 0: one compiled graph).
    Dynamo's rules move between torch versions: a break the CPU's torch does not make can appear on the GPU's."""
    model = build_model(resolve_model(name), sweep.overrides(name, args.d_model)).to(device)
    model.set_attention_backend(backend)
    bf16 = on_gpu and amp == "auto"

    def forward_loss(inputs, labels):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            return loss_fn(model, inputs, labels)

    torch._dynamo.reset()
    return torch._dynamo.explain(forward_loss)(x[:8], y[:8]).graph_break_count


def measure(name, amp, backend, graph, cells) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = amp == "tf32"
    barrier, times, errors, setup, kernels = threading.Barrier(cells), [], [], [], []

    def run(i):
        try:
            train_cell(name, amp, backend, graph, barrier, times, seed=i, setup=setup, kernels=kernels)
        except Exception as e:  # noqa: BLE001 -- recorded
            errors.append(f"{type(e).__name__}: {e}"[:300])
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(cells)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        return {"error": errors[0]}
    window = max(end for _, end in times) - min(start for start, _ in times)
    return {
        "ms_per_step": round(window * 1e3 / args.steps, 3),
        "cell_steps_per_s": round(cells * args.steps / window),
        "setup_s": round(max(setup), 2),
        **({"profile": kernels[0]} if kernels else {}),  # the first cell's, with --profile
    }


records = []
for name, amp, backend, graph, cells in itertools.product(
    args.models.split(","), args.amp.split(","), args.attention.split(","), args.graph.split(","),
    [int(c) for c in args.cells.split(",")],
):  # fmt: skip
    if graph == "eager" and cells > 1:
        continue  # eager steps are launch-bound on the host: threads would only share its one interpreter
    probe = build_model(resolve_model(name), sweep.overrides(name, args.d_model))
    if backend not in probe.available_backends(device):
        continue
    rec = {"model": name, "d_model": args.d_model, "seq_len": seq_len, "batch": batch, "amp": amp,
           "attention": backend, "graph": graph, "cells": cells}  # fmt: skip
    if graph == "compile":
        rec["graph_breaks"] = graph_breaks(name, amp, backend)
    rec.update(measure(name, amp, backend, graph, cells))
    records.append(rec)
    print(json.dumps(rec), flush=True)
    args.out.write_text(json.dumps({"provenance": provenance(device=str(device)), "records": records}, indent=1))
