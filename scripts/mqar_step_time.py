"""Milliseconds per MQAR training step, per model, precision and attention backend (issue #13, part 5).

One process, one cell at a time, the ``gsa-paper`` preset's cell (or ``--preset``) at ``--d-model``: the model the
sweep would build (its overrides: tied head, 4 layers, no MLP, ...), trained by the sweep's loop and settings on a
batch of the preset's size drawn from its data. Each combination runs ``--warmup`` steps, then ``--steps`` timed
steps (CUDA synchronised at both ends); prints one JSON line per combination and writes them to ``--out``.

Usage (GPU machine): PYTHONPATH=. python3 scripts/mqar_step_time.py --out step_time.json \
    [--models fox-pro,transformer-llama,gsa,tnl] [--amp none,auto] [--attention auto,dense]
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from pathlib import Path

import torch

from evalsuite.data.mqar import mqar_data
from evalsuite.provenance import provenance
from evalsuite.tasks.mqar.sweep import data_config, load_preset, resolve_model
from evalsuite.train import build_model, train

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--preset", default="gsa-paper")
ap.add_argument("--models", default="fox-pro,fox-llama,transformer-llama,transformer-pro,gsa,tnl")
ap.add_argument("--d-model", type=int, default=128)
ap.add_argument("--amp", default="none,auto", help="comma-separated: none (fp32), auto (bf16 on CUDA)")
ap.add_argument("--attention", default="auto,dense", help="comma-separated backends (skipped where not offered)")
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--warmup", type=int, default=5)
args = ap.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
sweep = load_preset(args.preset)
seq_len, kv = sweep.settings()[0]
data = mqar_data({**data_config(sweep, seq_len, kv), "num_train": sweep.batch_for(seq_len), "num_test": 1})
x, y = (torch.from_numpy(a).to(device) for a in data["train"])


def time_steps(model, tcfg, x, y) -> float:
    """ms per step of the sweep's own training loop (:func:`evalsuite.train.train`: the same loss, clipping, lr
    schedule and optimizer) on the batch (x, y), over ``--steps`` steps after ``--warmup`` untimed ones."""
    marks = []

    def on_step(step: int) -> None:
        if step in (args.warmup, args.warmup + args.steps):
            if device.type == "cuda":
                torch.cuda.synchronize()
            marks.append(time.perf_counter())

    tcfg.max_steps, tcfg.warmup_steps, tcfg.log_every = args.warmup + args.steps, 0, 10**9
    train(model, itertools.repeat((x, y)), tcfg, on_step=on_step)
    return round((marks[1] - marks[0]) * 1e3 / args.steps, 3)


records = []
for name in args.models.split(","):
    for amp in args.amp.split(","):
        for backend in args.attention.split(","):
            rec = {"model": name, "d_model": args.d_model, "seq_len": seq_len, "batch": x.shape[0], "amp": amp,
                   "attention": backend}  # fmt: skip
            model = build_model(resolve_model(name), sweep.overrides(name, args.d_model)).to(device)
            if backend not in model.available_backends(device):
                continue
            model.set_attention_backend(backend)
            tcfg = sweep.train_config(1e-3, seq_len)
            tcfg.amp = amp
            try:
                rec["ms_per_step"] = time_steps(model, tcfg, x, y)
            except Exception as e:  # noqa: BLE001 -- record and go on
                rec["error"] = f"{type(e).__name__}: {e}"[:300]
            records.append(rec)
            print(json.dumps(rec), flush=True)
args.out.write_text(json.dumps({"provenance": provenance(device=str(device)), "records": records}, indent=1))
