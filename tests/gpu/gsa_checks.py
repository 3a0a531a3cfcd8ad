"""The GSA chunk kernels against a float64 recurrence under saturated gates and at large slot scores: the
computations of tests/gpu/test_gated_slot.py, also run on the CPU under the Triton interpreter at small shapes
(tests/test_gsa_gate_check_script.py, tests/test_gsa_score_scale_script.py)."""

import torch

from evalsuite.bench.common import rel_error
from evalsuite.kernels.gated_slot import common, reference
from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

NAMES = ("o", "dq", "dk", "dv", "dlog_alpha")
# Gate logits x ~ N(0, s^2), log alpha = logsigmoid(x) / 16 (the GSA layer's normaliser 16): the smallest log alpha
# drawn at the MQAR d = 512 head shape is ~ -0.3, -10, -48 and -300.
REGIMES = {"mild": 1.0, "strong": 30.0, "saturated": 150.0, "extreme": 1000.0}


def gate_rows(shape=(4, 512, 4, 128), regimes=tuple(REGIMES), device="cuda", overrides=None) -> list[dict]:
    """Per gate regime: the relative Frobenius error of the kernels' output and gradients of q, k, v and log alpha
    (bf16 inputs, ``do`` a fixed random cotangent) against ``reference.gsa_recurrent`` in float64 on the same
    inputs; ``finite``: every kernel result is. ``shape``: (B, T, H, D), dk = dv = m = D; ``overrides``: block
    settings over the shipped ones."""
    B, T, H, D = shape
    scale = D**-0.5
    cfg = {**common.config(), **(overrides or {})}
    rows = []
    for regime in regimes:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (torch.randn(B, T, H, D, device=device, generator=gen) for _ in range(4))
        g = torch.nn.functional.logsigmoid(REGIMES[regime] * torch.randn(B, T, H, D, device=device, generator=gen))
        g = g / 16
        leaves = [x.to(torch.bfloat16).requires_grad_() for x in (q, k, v)] + [g.clone().requires_grad_()]
        o, _ = gsa_chunk_triton(*leaves, scale=scale, config=cfg)
        got = [o, *torch.autograd.grad(o, leaves, do.to(o.dtype))]
        ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
        o_ref, _ = reference.gsa_recurrent(*ref_leaves, scale)
        want = [o_ref, *torch.autograd.grad(o_ref, ref_leaves, do.double())]
        row = {"config": dict(overrides or {}), "regime": regime, "shape": list(shape), "dtype": "bfloat16",
               "min_log_alpha": g.min().item(), "finite": all(bool(x.isfinite().all()) for x in got)}  # fmt: skip
        row.update({name: rel_error(a, b) for name, a, b in zip(NAMES, got, want, strict=True)})
        rows.append(row)
    return rows


def _recurrence_with_rounded_scores(q, k, v, log_alpha, scale):
    """``reference.gsa_recurrent`` in float64, the slot scores rounded to bf16 (straight through for the backward):
    the error one bf16 rounding upstream of the softmax costs any implementation. Inputs ``[B, T, H, D]``; returns
    ``o [B, T, H, D]``."""
    B, T, H, D = q.shape
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


def _leaves(q, k, v, log_alpha, dtype):
    """Fresh leaves of q, k, v in ``dtype``; log alpha float32 for the kernels (as the GSA layer passes it)."""
    gate_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    gate = log_alpha.detach().to(gate_dtype, copy=True).requires_grad_()
    return [x.detach().to(dtype).requires_grad_() for x in (q, k, v)] + [gate]


def _outputs_and_grads(fn, leaves, do):
    o = fn(*leaves)
    return [o, *torch.autograd.grad(o, leaves, do.to(o.dtype))]


def score_scale_rows(shape=(4, 512, 4, 128), scales=(1.0, 10.0, 30.0, 100.0), device="cuda") -> list[dict]:
    """Per (scale, variant): the relative Frobenius errors of the output and the gradients against the float64
    recurrence, with q and k scaled up by ``scale`` (gate logits N(0, 1), log alpha = logsigmoid / 16), for
    ``kernel-bf16`` (the kernels on bf16 inputs: what training runs), ``kernel-fp32`` (on float32 inputs: is the
    algorithm exact at that scale?) and ``floor-bf16-scores`` (the recurrence with its slot scores rounded to bf16)."""
    B, T, H, D = shape
    scale = D**-0.5

    def kernel(*x):
        return gsa_chunk_triton(*x, scale=scale)[0]

    def floor(*x):
        return _recurrence_with_rounded_scores(*x, scale)

    rows = []
    for factor in scales:
        gen = torch.Generator(device=device).manual_seed(0)
        q, k, v, do = (torch.randn(B, T, H, D, device=device, generator=gen) for _ in range(4))
        q, k = q * factor, k * factor
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, H, D, device=device, generator=gen)) / 16
        q, k, v = (x.bfloat16() for x in (q, k, v))  # every variant sees the same bf16-representable inputs
        exact = _leaves(q, k, v, g, torch.float64)
        want = _outputs_and_grads(lambda *x: reference.gsa_recurrent(*x, scale)[0], exact, do.double())
        variants = (("kernel-bf16", kernel, torch.bfloat16), ("kernel-fp32", kernel, torch.float32),
                    ("floor-bf16-scores", floor, torch.float64))  # fmt: skip
        for name, fn, dtype in variants:
            got = _outputs_and_grads(fn, _leaves(q, k, v, g, dtype), do)
            errors = {n: rel_error(a, b) for n, a, b in zip(NAMES, got, want, strict=True)}
            rows.append({"scale": float(factor), "variant": name, "shape": list(shape), **errors})
    return rows
