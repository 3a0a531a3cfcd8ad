"""How the GSA chunk kernels' error grows with the slot-score scale, against bf16's own floor (issue #13).

A GSA d = 512 MQAR cell at lr 1e-2 reached 0.962 and collapsed to chance in 25 steps on exact kernels
(results/mqar/README.md). Trained q/k grow, and the slot softmax turns sharp; this measures, with q and k scaled up
by each factor (gate logits N(0, 1), log alpha = logsigmoid / 16), the relative Frobenius error of the output and of
the gradients of q, k, v and log alpha against ``reference.gsa_recurrent`` in float64 on the same inputs, for:

- ``kernel-bf16``: the Triton kernels on bf16 inputs (what training runs);
- ``kernel-fp32``: the same kernels on float32 inputs (is the algorithm exact at that scale?);
- ``floor-bf16-scores``: the float64 recurrence with only its slot scores rounded to bf16 in the forward pass (the
  error one bf16 rounding upstream of the softmax costs any implementation).

    TRITON_INTERPRET=1 python scripts/gsa_score_scale_check.py            # CPU, ~1 minute at the default shape
    python scripts/gsa_score_scale_check.py --device cuda --shape 4,512,4,128

Prints one JSON line per (scale, variant).
"""

from __future__ import annotations

import argparse
import json

import torch

from evalsuite.kernels.gated_slot import reference
from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="1,192,2,32", help="B,T,H,D (dk = dv = m = D)")
ap.add_argument("--scales", default="1,10,30,100", help="comma-separated factors on q and k")
ap.add_argument("--device", default="cpu", help="cpu runs the kernels under TRITON_INTERPRET=1")
args = ap.parse_args()
B, T, H, D = (int(x) for x in args.shape.split(","))
scale = D**-0.5
NAMES = ("o", "dq", "dk", "dv", "dlog_alpha")


def recurrence_with_rounded_scores(q, k, v, log_alpha):
    """``reference.gsa_recurrent`` in float64, the slot scores rounded to bf16 (straight through for the backward).
    Inputs ``[B, T, H, D]``; returns ``o [B, T, H, D]``."""
    alpha, write = log_alpha.exp(), -torch.expm1(log_alpha)
    hk = q.new_zeros(B, H, D, D)  # [B, H, dk, m]
    hv = q.new_zeros(B, H, D, D)  # [B, H, m, dv]
    out = []
    for t in range(T):
        hk = hk * alpha[:, t, :, None, :] + k[:, t, :, :, None] * write[:, t, :, None, :]
        scores = scale * torch.einsum("bhk,bhkm->bhm", q[:, t], hk)
        scores = scores + (scores.detach().bfloat16().double() - scores.detach())
        hv = hv * alpha[:, t, :, :, None] + write[:, t, :, :, None] * v[:, t, :, None, :]
        out.append(torch.einsum("bhm,bhmv->bhv", scores.softmax(-1), hv))
    return torch.stack(out, 1)


def leaves(q, k, v, log_alpha, dtype):
    """Fresh leaves of q, k, v in ``dtype``; log alpha float32 for the kernels (as the GSA layer passes it)."""
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    gate = log_alpha.detach().to(gate_dtype, copy=True).requires_grad_()
    return [x.detach().to(dtype).requires_grad_() for x in (q, k, v)] + [gate]


def kernel(q, k, v, log_alpha):
    return gsa_chunk_triton(q, k, v, log_alpha, scale=scale)[0]


def outputs_and_grads(fn, leaves, do):
    o = fn(*leaves)
    return [o, *torch.autograd.grad(o, leaves, do.to(o.dtype))]


for factor in (float(x) for x in args.scales.split(",")):
    gen = torch.Generator(device=args.device).manual_seed(0)
    q, k, v, do = (torch.randn(B, T, H, D, device=args.device, generator=gen) for _ in range(4))
    q, k = q * factor, k * factor
    g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device=args.device, generator=gen)) / 16
    q, k, v = (x.bfloat16() for x in (q, k, v))  # every variant sees the same bf16-representable inputs

    exact = leaves(q, k, v, g, torch.float64)
    want = outputs_and_grads(lambda *x: reference.gsa_recurrent(*x, scale)[0], exact, do.double())
    variants = (
        ("kernel-bf16", kernel, torch.bfloat16),
        ("kernel-fp32", kernel, torch.float32),
        ("floor-bf16-scores", recurrence_with_rounded_scores, torch.float64),
    )
    for name, fn, dtype in variants:
        got = outputs_and_grads(fn, leaves(q, k, v, g, dtype), do)
        errors = {n: ((a.double() - b).norm() / b.norm()).item() for n, a, b in zip(NAMES, got, want, strict=True)}
        print(json.dumps({"scale": factor, "variant": name, "shape": [B, T, H, D], **errors}), flush=True)
