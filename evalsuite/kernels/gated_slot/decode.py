"""One GSA decoding step in Triton: update both states in place and read the output (arXiv:2409.07146 eq. 6).

Entry point: :func:`gsa_decode_triton` ``(q, k, v, log_alpha, scale, state) -> (o [B, 1, H, dv], state)`` for a
single token. The state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` (float32, any strides) is updated in place and
returned as the same tensors.

Two launches, each spread over (batch, head) x tiles of BD state rows, so a step at batch 1 over a few wide heads
(GSA 1.3B: 4 heads of 512) still occupies many SMs: (1) ``_decode_keys_kernel``, grid ``(B*H, dk/BD)``: read a tile of
hk, ``hk*alpha + k s^T``, write it back, and store the tile's part of ``hk^T q`` (float32 ``[B*H, dk/BD, m]``);
(2) ``_decode_values_kernel``, grid ``(B*H, dv/BD)``: sum the parts into the logits, take the softmax over the m
slots (each program again: m x dk/BD values), then read a tile of hv, ``alpha*hv + s v^T``, write it back and store
its columns of ``o = hv^T p``. Each state element is read once and written once, the whole cost of the step (it is
memory-bound); the softmax needs all of ``hk^T q`` before hv is read, hence the two launches. (One program per head
would take 22 us a layer of GSA 1.3B at batch 1 on an H200, 24% of the compiled step: results/decode/.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.gated_slot.common import _write_strength, check_sizes, config
from evalsuite.kernels.gated_slot.reference import _check


@triton.jit
def _program_tile(H, M: tl.constexpr, BD: tl.constexpr):
    """``(bh, j, b, h, offs_m, offs_d)`` of a program of grid (B*H, D/BD): its (batch, head), its tile j of BD state
    rows (or columns) and their offsets, and the slot offsets."""
    bh = tl.program_id(0)
    j = tl.program_id(1)
    return bh, j, (bh // H).to(tl.int64), (bh % H).to(tl.int64), tl.arange(0, M), j * BD + tl.arange(0, BD)


@triton.jit
def _decode_keys_kernel(Q, K, G, HK, PART, H, sqb, sqh, skb, skh, sgb, sgh, shk_b, shk_h, shk_d, shk_m,
                        M: tl.constexpr, DK: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    """Grid (B*H, DK/BD): update rows ``[j*BD, (j+1)*BD)`` of hk in place; ``PART[bh, j] [M]`` = their part of
    ``hk^T q``. The head dims of q, k and the slot dim of log_alpha are unit-stride."""
    bh, j, b, h, offs_m, offs_d = _program_tile(H, M, BD)
    g = tl.load(G + b * sgb + h * sgh + offs_m)
    ptr = HK + b * shk_b + h * shk_h + offs_d[:, None] * shk_d + offs_m[None, :] * shk_m
    k = tl.load(K + b * skb + h * skh + offs_d).to(tl.float32)
    q = tl.load(Q + b * sqb + h * sqh + offs_d).to(tl.float32)
    hk = tl.load(ptr) * tl.exp(g)[None, :] + k[:, None] * _write_strength(g)[None, :]
    tl.store(ptr, hk)
    tl.store(PART + (bh.to(tl.int64) * (DK // BD) + j) * M + offs_m, tl.sum(hk * q[:, None], 0))


@triton.jit
def _decode_values_kernel(V, G, PART, HV, OUT, H, scale, svb, svh, sgb, sgh, sob, soh, shv_b, shv_h, shv_m, shv_d,
                          M: tl.constexpr, NK: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    """Grid (B*H, DV/BD): ``p = softmax(scale * sum_j PART[bh, j])`` over the slots, then update columns
    ``[j*BD, (j+1)*BD)`` of hv in place and store those columns of ``o = hv^T p``."""
    bh, j, b, h, offs_m, offs_d = _program_tile(H, M, BD)
    parts = tl.load(PART + (bh.to(tl.int64) * NK + tl.arange(0, NK))[:, None] * M + offs_m[None, :])
    logits = tl.sum(parts, 0) * scale
    p = tl.exp(logits - tl.max(logits, 0))
    p = p / tl.sum(p, 0)
    g = tl.load(G + b * sgb + h * sgh + offs_m)
    ptr = HV + b * shv_b + h * shv_h + offs_m[:, None] * shv_m + offs_d[None, :] * shv_d
    v = tl.load(V + b * svb + h * svh + offs_d).to(tl.float32)
    hv = tl.load(ptr) * tl.exp(g)[:, None] + _write_strength(g)[:, None] * v[None, :]
    tl.store(ptr, hv)
    tl.store(OUT + b * sob + h * soh + offs_d, tl.sum(hv * p[:, None], 0).to(OUT.dtype.element_ty))


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
    part = triton_utils.empty((B * H, dk // BD, m), torch.float32, q.device)
    _decode_keys_kernel[(B * H, dk // BD)](
        q, k, g, hk, part, H, q.stride(0), q.stride(2), k.stride(0), k.stride(2), g.stride(0), g.stride(2),
        *hk.stride(), M=m, DK=dk, BD=BD, num_warps=cfg["DECODE_WARPS"],
    )  # fmt: skip
    _decode_values_kernel[(B * H, dv // BD)](
        v, g, part, hv, o, H, float(scale), v.stride(0), v.stride(2), g.stride(0), g.stride(2), o.stride(0),
        o.stride(2), *hv.stride(), M=m, NK=dk // BD, BD=BD, num_warps=cfg["DECODE_WARPS"],
    )  # fmt: skip
    return o, (hk, hv)
