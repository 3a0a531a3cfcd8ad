"""One GSA decoding step in Triton: update both states in place and read the output (arXiv:2409.07146 eq. 6).

Entry point: :func:`gsa_decode_triton` ``(q, k, v, log_alpha, scale, state) -> (o [B, 1, H, dv], state)`` for a
single token. The state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` (float32, any strides) is updated in place and
returned as the same tensors.

One program per (batch, head), grid ``(B*H,)``: it walks hk in tiles of dk rows (read, ``hk*alpha + k s^T``, write
back, accumulate ``hk^T q``), takes the softmax over the m slots, then walks hv in tiles of dv columns (read,
``alpha*hv + s v^T``, write back, ``o = hv^T p``). Each state element is read once and written once, which is the
whole cost of the step (it is memory-bound); the softmax needs all of ``hk^T q`` before hv is read, so the head is
not split across programs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.gated_slot.common import _write_strength, check_sizes, config
from evalsuite.kernels.gated_slot.reference import _check


@triton.jit
def _decode_kernel(Q, K, V, G, HK, HV, OUT, H, scale, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sob, soh,
                   shk_b, shk_h, shk_d, shk_m, shv_b, shv_h, shv_m, shv_d, M: tl.constexpr, DK: tl.constexpr,
                   DV: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    """Grid (B*H,). The head dims of q, k, v, o and the slot dim of log_alpha are unit-stride."""
    bh = tl.program_id(0)
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, BD)
    g = tl.load(G + b * sgb + h * sgh + offs_m)
    alpha = tl.exp(g)
    s = _write_strength(g)
    hk_base = HK + b * shk_b + h * shk_h
    logits = tl.zeros([M], dtype=tl.float32)
    for d0 in tl.static_range(0, DK, BD):
        ptr = hk_base + (d0 + offs_d)[:, None] * shk_d + offs_m[None, :] * shk_m
        k = tl.load(K + b * skb + h * skh + d0 + offs_d).to(tl.float32)
        q = tl.load(Q + b * sqb + h * sqh + d0 + offs_d).to(tl.float32)
        hk = tl.load(ptr) * alpha[None, :] + k[:, None] * s[None, :]
        tl.store(ptr, hk)
        logits += tl.sum(hk * q[:, None], 0)
    logits = logits * scale
    p = tl.exp(logits - tl.max(logits, 0))
    p = p / tl.sum(p, 0)
    hv_base = HV + b * shv_b + h * shv_h
    for d0 in tl.static_range(0, DV, BD):
        ptr = hv_base + offs_m[:, None] * shv_m + (d0 + offs_d)[None, :] * shv_d
        v = tl.load(V + b * svb + h * svh + d0 + offs_d).to(tl.float32)
        hv = tl.load(ptr) * alpha[:, None] + s[:, None] * v[None, :]
        tl.store(ptr, hv)
        o = tl.sum(hv * p[:, None], 0)
        tl.store(OUT + b * sob + h * soh + d0 + offs_d, o.to(OUT.dtype.element_ty))


def gsa_decode_triton(q, k, v, log_alpha, scale: float, state):
    """One token of GSA with a state: q, k ``[B, 1, H, dk]``, v ``[B, 1, H, dv]``, log_alpha ``[B, 1, H, m]``,
    state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` float32, updated in place. Returns ``(o [B, 1, H, dv] in v's
    dtype, state)`` (the same state tensors). Forward only (no autograd)."""
    if state is None:
        raise ValueError("gsa_decode_triton needs a state (hk, hv); use gsa_chunk_triton without one")
    _check(q, k, v, log_alpha, state)
    if q.shape[1] != 1:
        raise ValueError(f"gsa_decode_triton takes one token (T == 1); got T = {q.shape[1]}")
    hk, hv = state
    if hk.dtype != torch.float32 or hv.dtype != torch.float32:
        raise TypeError(f"the GSA state must be float32 (it is updated in place); got {hk.dtype}, {hv.dtype}")
    B, _, H, dk = q.shape
    dv, m = v.shape[-1], log_alpha.shape[-1]
    check_sizes(dk, dv, m)
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    g = log_alpha.to(torch.float32)
    g = g if g.stride(-1) == 1 else g.contiguous()
    o = triton_utils.empty((B, 1, H, dv), v.dtype, v.device)
    cfg = config()
    BD = min(cfg["DECODE_BD"], dk, dv)
    _decode_kernel[(B * H,)](
        q, k, v, g, hk, hv, o, H, float(scale), q.stride(0), q.stride(2), k.stride(0), k.stride(2),
        v.stride(0), v.stride(2), g.stride(0), g.stride(2), o.stride(0), o.stride(2), *hk.stride(), *hv.stride(),
        M=m, DK=dk, DV=dv, BD=BD, num_warps=cfg["DECODE_WARPS"],
    )  # fmt: skip
    return o, (hk, hv)
