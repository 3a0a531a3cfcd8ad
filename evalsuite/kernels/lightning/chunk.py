"""Lightning Attention over a full sequence (Algorithm 5 forward, Algorithm 6 backward), with autograd.

Public entry point: :func:`lightning_chunk_triton`. The chunking, the three forward kernels and the numerics are
described in :mod:`evalsuite.kernels.lightning.common`; the state kernels are in :mod:`.states`, the backward
kernel in :mod:`.chunk_bwd`.

Memory: the forward keeps only the float32 segment states ``[B*H, T/1024, dk, dv]`` (16 bytes per position and
head at dk = dv = 64, on GPU) besides q, k, v; the per-chunk states (``T/64 * dk * dv``) are recomputed in the
backward rather than stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.chunk_bwd import chunk_bwd
from evalsuite.kernels.lightning.common import LOG2E_JIT, _in_range, _mm, interpret_tiles, strides4
from evalsuite.kernels.lightning.states import chunk_states, segment_scan
from evalsuite.kernels.triton_utils import pick_config


@triton.jit
def _chunk_fwd_kernel(
    Q,
    K,
    V,
    HLOC,
    SEG,
    SLOPE,
    Out,
    stride_qb,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kb,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_vb,
    stride_vt,
    stride_vh,
    stride_vd,
    T,
    H,
    NT,
    NSEG,
    DK: tl.constexpr,
    DV: tl.constexpr,
    BT: tl.constexpr,
    G: tl.constexpr,
    BK: tl.constexpr,
    BV: tl.constexpr,
    LOWP: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid (DV/BV, NT, B*H). Out [B, T, H, DV] contiguous: for chunk n (rows c, start a_n) and dv tile,

    ``O = [(Q K^T) * M] V + (lambda^(c+1) Q) S``,  ``S = HLOC[n] + lambda^(a_n - a_seg) SEG[seg]`` (state at a_n - 1).
    """
    i_v = tl.program_id(0)
    n = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    h64 = h.to(tl.int64)
    nl2 = -tl.load(SLOPE + h) * LOG2E_JIT  # lambda^n = exp2(nl2 * n)
    s = n // G
    j = n - s * G

    offs_t = tl.arange(0, BT)
    offs_v = i_v * BV + tl.arange(0, BV)
    rows = n * BT + offs_t
    ok = rows < T
    rows64 = _in_range(rows, T)  # masked rows (past the ragged end) address row T - 1
    q_decay = tl.exp2(nl2 * (offs_t + 1))
    gap = offs_t[:, None] - offs_t[None, :]
    mask = tl.where(gap >= 0, tl.exp2(nl2 * tl.maximum(gap, 0)), 0.0)
    carry_w = tl.exp2(nl2 * (j * BT))
    seg_base = SEG + (pid_bh.to(tl.int64) * NSEG + s) * DK * DV
    hloc_base = HLOC + (pid_bh.to(tl.int64) * NT + n) * DK * DV
    q_base = Q + b * stride_qb + h64 * stride_qh + rows64[:, None] * stride_qt
    k_base = K + b * stride_kb + h64 * stride_kh + rows64[:, None] * stride_kt

    scores = tl.zeros([BT, BT], dtype=tl.float32)
    acc = tl.zeros([BT, BV], dtype=tl.float32)
    for i_k in range(0, DK // BK):
        offs_k = i_k * BK + tl.arange(0, BK)
        q = tl.load(q_base + offs_k[None, :] * stride_qd, mask=ok[:, None], other=0.0)
        k = tl.load(k_base + offs_k[None, :] * stride_kd, mask=ok[:, None], other=0.0)
        scores = _mm(q, tl.trans(k), scores, UPCAST, PREC)
        tile = offs_k[:, None] * DV + offs_v[None, :]
        state = tl.load(seg_base + tile) * carry_w
        if j > 0:
            state += tl.load(hloc_base + tile).to(tl.float32)
        qd = q.to(tl.float32) * q_decay[:, None]
        if LOWP:
            acc = _mm(qd.to(q.dtype), state.to(q.dtype), acc, UPCAST, PREC)
        else:
            acc = _mm(qd, state, acc, UPCAST, PREC)
    v = tl.load(V + b * stride_vb + h64 * stride_vh + rows64[:, None] * stride_vt + offs_v[None, :] * stride_vd,
                mask=ok[:, None], other=0.0)  # fmt: skip
    acc = _mm((scores * mask).to(v.dtype), v, acc, UPCAST, PREC)
    o_ptrs = Out + ((b * T + rows64[:, None]) * H + h64) * DV + offs_v[None, :]
    tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=ok[:, None])


def chunk_fwd(q, k, v, slope, h0, output_final_state: bool):
    """The three forward launches. Returns ``(o [B, T, H, dv], final state or None, seg, chunks)`` where ``seg``
    ``[B*H, NSEG, dk, dv]`` float32 holds the state entering each segment and ``chunks = (BT, G)`` is the chunking
    (both saved for the backward, which walks the same chunks and segments)."""
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    chunks = common.chunking(T, B * H)
    BT, G, NT, _ = common.geometry(T, chunks)
    hloc, seg = chunk_states(k, v, slope, chunks, reverse=False)
    ht = segment_scan(seg, h0, slope, T, H, chunks, reverse=False, store_out=output_final_state)
    BK, BV, num_warps, num_stages = pick_config(common.FWD_CONFIGS, (DK, DV), interpret_tiles(DK, DV))
    o = triton_utils.empty((B, T, H, DV), v.dtype, v.device)
    _chunk_fwd_kernel[(DV // BV, NT, B * H)](
        q, k, v, hloc, seg, slope, o, *strides4(q), *strides4(k), *strides4(v), T, H, NT, seg.shape[1],
        DK=DK, DV=DV, BT=BT, G=G, BK=BK, BV=BV, LOWP=hloc.dtype != torch.float32, UPCAST=common.upcast(q.dtype),
        PREC=common.precision(q.dtype), num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return o, ht, seg, chunks


class LightningChunkFunction(torch.autograd.Function):
    """Autograd wrapper of :func:`chunk_fwd` / :func:`~evalsuite.kernels.lightning.chunk_bwd.chunk_bwd`.

    Saves q, k, v, the slopes, the float32 segment states and the chunking; gradients flow to q, k, v and the
    initial state (also through the returned final state); the slopes get none.
    """

    @staticmethod
    def forward(ctx, q, k, v, slope, h0, output_final_state):
        o, ht, seg, chunks = chunk_fwd(q, k, v, slope, h0, output_final_state)
        ctx.save_for_backward(q, k, v, slope, seg)
        ctx.chunks = chunks
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        q, k, v, slope, seg = ctx.saved_tensors
        need_dh0 = ctx.needs_input_grad[4]
        if do is None:
            do = torch.zeros_like(v)
        dq, dk, dv, dh0 = chunk_bwd(do, dht, q, k, v, slope, seg, ctx.chunks, need_dh0)
        return dq, dk, dv, None, dh0, None


def lightning_chunk_triton(q, k, v, slope, initial_state=None, output_final_state: bool = False):
    """Decayed causal linear attention over a full sequence, differentiable in q, k, v and the initial state.

    Args:
        q, k: ``[B, T, H, dk]``; v: ``[B, T, H, dv]`` -- one dtype of bf16/fp16/fp32, any strides;
            dk, dv in :data:`~evalsuite.kernels.lightning.common.HEAD_DIMS` (powers of two 16..256, dk != dv allowed).
        slope: ``[H]`` (>= 0), ``lambda = exp(-slope)``; no gradient.
        initial_state: ``[B, H, dk, dv]`` (taken as float32) or None (zeros).
        output_final_state: also return the state after the last position.
    Returns:
        ``(o [B, T, H, dv]`` in v's dtype, ``kv [B, H, dk, dv]`` float32 or None).
    """
    common.check_inputs(q, k, v, slope, initial_state)
    B, T, H, DK = q.shape
    h0 = None if initial_state is None else initial_state.float()
    if T == 0:
        if not output_final_state:
            return v.new_zeros(v.shape), None
        return v.new_zeros(v.shape), (h0 if h0 is not None else q.new_zeros(B, H, DK, v.shape[-1], dtype=torch.float32))
    return LightningChunkFunction.apply(q, k, v, common.slope_f32(slope, q.device), h0, output_final_state)
