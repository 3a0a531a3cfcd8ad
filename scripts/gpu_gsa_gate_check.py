"""GSA chunk kernels under saturated gates on a GPU: output and gradients against a float64 recurrence.

A trained GSA gate saturates (log alpha far below -10 per token); the kernels before e816024 overflowed there
(results/mqar/gsa-d512-probe/README.md). This script measures any tree's kernels (the one on PYTHONPATH) at the
MQAR d = 512 cell's head shape (batch 4: the float64 reference keeps every step for autograd), so that the old and
the fixed kernels can be compared in one GPU session:

    PYTHONPATH=. python3 scripts/gpu_gsa_gate_check.py --out check.jsonl --label new

Appends one JSON line per gate regime: the tree's label, the smallest log alpha drawn, and the relative Frobenius
error of the output and of the gradients of q, k, v and log alpha (``do`` a fixed random cotangent) against
``reference.gsa_recurrent`` run in float64 on the same inputs; ``finite`` says whether every Triton result is.
Regimes (gate logits ``x ~ N(0, s^2)``, ``log alpha = logsigmoid(x) / 16`` as the GSA layer with normaliser 16):
mild s = 1 (min ~ -0.3), strong s = 30 (min ~ -10), saturated s = 150 (min ~ -48), extreme s = 1000 (min ~ -300).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from evalsuite.kernels.gated_slot import common, reference
from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True, help="JSON-lines file, appended to")
ap.add_argument("--label", required=True, help="which tree's kernels these are (e.g. old, new)")
ap.add_argument("--shape", default="4,512,4,128", help="B,T,H,D (dk = dv = m = D)")
ap.add_argument("--device", default="cuda", help="cpu works under TRITON_INTERPRET=1 at small shapes")
ap.add_argument("--config", default="{}", help='JSON block-config overrides, e.g. {"READ_BM": 128}')
ap.add_argument("--regimes", default="mild,strong,saturated,extreme", help="comma-separated subset")
args = ap.parse_args()
common.config().update(json.loads(args.config))  # the table in use: GPU_CONFIG, or INTERPRET_CONFIG on a CPU
B, T, H, D = (int(x) for x in args.shape.split(","))
scale = D**-0.5


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


for regime, spread in (("mild", 1.0), ("strong", 30.0), ("saturated", 150.0), ("extreme", 1000.0)):
    if regime not in args.regimes.split(","):
        continue
    gen = torch.Generator(device=args.device).manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, device=args.device, generator=gen) for _ in range(4))
    g = torch.nn.functional.logsigmoid(spread * torch.randn(B, T, H, D, device=args.device, generator=gen)) / 16
    leaves = [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v)] + [g.clone().requires_grad_()]
    o, _ = gsa_chunk_triton(*leaves, scale=scale)
    got = [o, *torch.autograd.grad(o, leaves, do.to(o.dtype))]
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    o_ref, _ = reference.gsa_recurrent(*ref_leaves, scale)
    want = [o_ref, *torch.autograd.grad(o_ref, ref_leaves, do.double())]
    row = {"label": args.label, "config": json.loads(args.config), "regime": regime, "shape": [B, T, H, D],
           "dtype": "bfloat16", "min_log_alpha": g.min().item(),
           "finite": all(bool(x.isfinite().all()) for x in got)}  # fmt: skip
    row.update({name: rel(a, b) for name, a, b in zip(("o", "dq", "dk", "dv", "dlog_alpha"), got, want, strict=True)})
    print(json.dumps(row), flush=True)
    with args.out.open("a") as f:
        f.write(json.dumps(row) + "\n")
