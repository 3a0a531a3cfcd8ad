"""Lightning Attention decoding: one token per step on a float32 recurrent state, updated in place.

Public entry point: :func:`lightning_decode_triton` -- ``kv <- lambda kv + k v^T``, ``o = kv^T q`` (the
recurrence of :func:`~evalsuite.kernels.lightning.reference.lightning_recurrent` for T = 1).

Design: one program per (dv tile, batch*head), looping over dk in BK-row tiles; each state element is read once,
updated in registers, written back in place and folded into the output, so a step moves the state once in each
direction (the step is memory bound: ``2 * 4 * dk * dv`` bytes per head). Forward only (no autograd).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.common import LOG2E_JIT, strides4
from evalsuite.kernels.triton_utils import pick_config


@triton.jit
def _decode_kernel(
    Q,
    K,
    V,
    S,
    SLOPE,
    Out,
    stride_qb,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vh,
    stride_vd,
    stride_sb,
    stride_sh,
    stride_sk,
    stride_sv,
    H,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
):
    """Grid (DV/BV, B*H). q, k [B, 1, H, DK], v [B, 1, H, DV]; S [B, H, DK, DV] float32 (in place);
    Out [B, 1, H, DV] contiguous."""
    i_v = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    lam = tl.exp2(-tl.load(SLOPE + h) * LOG2E_JIT)
    offs_v = i_v * BV + tl.arange(0, BV)
    v = tl.load(V + b * stride_vb + h * stride_vh + offs_v * stride_vd).to(tl.float32)
    s_base = S + b * stride_sb + h * stride_sh + offs_v[None, :] * stride_sv
    acc = tl.zeros([BV], dtype=tl.float32)
    for i_k in range(0, DK // BK):
        offs_k = i_k * BK + tl.arange(0, BK)
        q = tl.load(Q + b * stride_qb + h * stride_qh + offs_k * stride_qd).to(tl.float32)
        k = tl.load(K + b * stride_kb + h * stride_kh + offs_k * stride_kd).to(tl.float32)
        s_ptrs = s_base + offs_k[:, None] * stride_sk
        s = tl.load(s_ptrs) * lam + k[:, None] * v[None, :]
        tl.store(s_ptrs, s)
        acc += tl.sum(q[:, None] * s, 0)
    tl.store(Out + pid_bh.to(tl.int64) * DV + offs_v, acc.to(Out.dtype.element_ty))


def lightning_decode_triton(q, k, v, slope, state):
    """One decoding step: ``state <- lambda state + k v^T`` in place, ``o = state^T q``.

    Args:
        q, k: ``[B, 1, H, dk]``; v: ``[B, 1, H, dv]`` (one dtype of bf16/fp16/fp32, any strides).
        slope: ``[H]`` (>= 0), ``lambda = exp(-slope)``.
        state: ``[B, H, dk, dv]`` float32 (any strides): updated in place.
    Returns:
        ``(o [B, 1, H, dv]`` in v's dtype, ``state``) -- the same state tensor, now after this token.
    """
    common.check_inputs(q, k, v, slope, state)
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    if T != 1:
        raise ValueError(f"decoding takes one token per step (T = 1); got T = {T}")
    if state is None or state.dtype != torch.float32:
        raise TypeError("decoding needs a float32 state [B, H, dk, dv] to update in place")
    BK, BV, num_warps = pick_config(common.DECODE_CONFIGS, (DK, DV), (min(DK, 16), min(DV, 16), 4))
    o = triton_utils.empty((B, 1, H, DV), v.dtype, v.device)
    qs, ks, vs = strides4(q), strides4(k), strides4(v)
    _decode_kernel[(DV // BV, B * H)](
        q, k, v, state, common.slope_f32(slope, q.device), o,
        qs[0], qs[2], qs[3], ks[0], ks[2], ks[3], vs[0], vs[2], vs[3], *state.stride(), H,
        DK=DK, DV=DV, BK=BK, BV=BV, num_warps=num_warps,
    )  # fmt: skip
    return o, state
