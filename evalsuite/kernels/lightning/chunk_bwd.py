"""Lightning Attention backward (Algorithm 6, chunk-parallel): dq, dk, dv and the initial state's gradient.

:func:`chunk_bwd` runs four launches:

1. the forward chunk states again (``HLOC``, :func:`.states.chunk_states` on k, v; the float32 segment states
   entering each segment come saved from the forward), recomputed rather than stored;
2. the adjoint chunk states (``dHLOC``/``dSEG``): :func:`.states.chunk_states` time-reversed on (q, dO), i.e.
   ``dKV <- lambda^L dKV + (lambda^(c+1) Q)^T dO`` from each segment's end back to its start;
3. :func:`.states.segment_scan` reversed, from the gradient of the final state (or zero): the adjoint entering
   each segment from its right, and at the end the gradient of the initial state ``sum_t lambda^(t+1) q_t do_t^T``;
4. ``_chunk_bwd_kernel``, one program per chunk and (batch, head), fully parallel:
   ``dQ = [(dO V^T) * M] K + (lambda^(c+1) dO) S^T``, ``dK = [(dO V^T) * M]^T Q + (lambda^(L-1-c) V) D^T``,
   ``dV = [(Q K^T) * M]^T dO + (lambda^(L-1-c) K) D``, with S the state before the chunk and D the adjoint of the
   state at the chunk's last position from all later positions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.common import LOG2E_JIT, _in_range, _mm, interpret_tiles, strides4
from evalsuite.kernels.lightning.states import chunk_states, segment_scan
from evalsuite.kernels.triton_utils import pick_config


@triton.jit
def _state_tile(SEG_BASE, HLOC_BASE, tile, carry_w, has_local):
    """A [BK, BV] float32 state tile: the segment's entering state decayed by ``carry_w``, plus the local part."""
    st = tl.load(SEG_BASE + tile) * carry_w
    if has_local:
        st += tl.load(HLOC_BASE + tile).to(tl.float32)
    return st


@triton.jit
def _inter(x, decay, st, acc, TRANS: tl.constexpr, LOWP: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """``acc + (decay * x) @ st`` (``st^T`` if TRANS): the inter-chunk right product, in bf16 if LOWP."""
    xd = x.to(tl.float32) * decay[:, None]
    if TRANS:
        st = tl.trans(st)
    if LOWP:
        return _mm(xd.to(x.dtype), st.to(x.dtype), acc, UPCAST, PREC)
    return _mm(xd, st, acc, UPCAST, PREC)


@triton.jit
def _chunk_bwd_kernel(
    Q,
    K,
    V,
    DO,
    HLOC,
    SEG,
    DHLOC,
    DSEG,
    SLOPE,
    DQ,
    DK_,
    DV_,
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
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
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
    """Grid (NT, B*H). DQ, DK_ [B, T, H, DK] and DV_ [B, T, H, DV] contiguous (see the module doc for the math)."""
    n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    h64 = h.to(tl.int64)
    nl2 = -tl.load(SLOPE + h) * LOG2E_JIT  # lambda^n = exp2(nl2 * n)
    s = n // G
    j = n - s * G
    n_last = tl.minimum(s * G + G, NT) - 1  # the segment's last chunk: its local adjoint is zero

    offs_t = tl.arange(0, BT)
    t0 = n * BT
    rows = t0 + offs_t
    ok = rows < T
    rows64 = _in_range(rows, T)  # masked rows (past the ragged end) address row T - 1
    L = tl.minimum(BT, T - t0)
    q_decay = tl.exp2(nl2 * (offs_t + 1))
    k_decay = tl.where(ok, tl.exp2(nl2 * tl.maximum(L - 1 - offs_t, 0)), 0.0)
    gap = offs_t[:, None] - offs_t[None, :]
    mask = tl.where(gap >= 0, tl.exp2(nl2 * tl.maximum(gap, 0)), 0.0)
    fwd_w = tl.exp2(nl2 * (j * BT))  # a_n - a_seg
    bwd_w = tl.exp2(nl2 * (tl.minimum((s + 1) * G * BT, T) - (t0 + L)))  # e_seg - e_n
    bh64 = pid_bh.to(tl.int64)
    seg_base = SEG + (bh64 * NSEG + s) * DK * DV
    dseg_base = DSEG + (bh64 * NSEG + s) * DK * DV
    hloc_base = HLOC + (bh64 * NT + n) * DK * DV
    dhloc_base = DHLOC + (bh64 * NT + n) * DK * DV
    q_base = Q + b * stride_qb + h64 * stride_qh + rows64[:, None] * stride_qt
    k_base = K + b * stride_kb + h64 * stride_kh + rows64[:, None] * stride_kt
    v_base = V + b * stride_vb + h64 * stride_vh + rows64[:, None] * stride_vt
    do_base = DO + b * stride_ob + h64 * stride_oh + rows64[:, None] * stride_ot
    out_k = ((b * T + rows64[:, None]) * H + h64) * DK
    out_v = ((b * T + rows64[:, None]) * H + h64) * DV

    # [(dO V^T) * M]
    a = tl.zeros([BT, BT], dtype=tl.float32)
    for i_v in range(0, DV // BV):
        offs_v = i_v * BV + tl.arange(0, BV)
        do = tl.load(do_base + offs_v[None, :] * stride_od, mask=ok[:, None], other=0.0)
        v = tl.load(v_base + offs_v[None, :] * stride_vd, mask=ok[:, None], other=0.0)
        a = _mm(do, tl.trans(v), a, UPCAST, PREC)
    a = (a * mask).to(Q.dtype.element_ty)

    # dQ, dK per dk tile
    for i_k in range(0, DK // BK):
        offs_k = i_k * BK + tl.arange(0, BK)
        q = tl.load(q_base + offs_k[None, :] * stride_qd, mask=ok[:, None], other=0.0)
        k = tl.load(k_base + offs_k[None, :] * stride_kd, mask=ok[:, None], other=0.0)
        dq = _mm(a, k, tl.zeros([BT, BK], dtype=tl.float32), UPCAST, PREC)
        dk = _mm(tl.trans(a), q, tl.zeros([BT, BK], dtype=tl.float32), UPCAST, PREC)
        for i_v in range(0, DV // BV):
            offs_v = i_v * BV + tl.arange(0, BV)
            tile = offs_k[:, None] * DV + offs_v[None, :]
            do = tl.load(do_base + offs_v[None, :] * stride_od, mask=ok[:, None], other=0.0)
            v = tl.load(v_base + offs_v[None, :] * stride_vd, mask=ok[:, None], other=0.0)
            st = _state_tile(seg_base, hloc_base, tile, fwd_w, j > 0)
            adj = _state_tile(dseg_base, dhloc_base, tile, bwd_w, n < n_last)
            dq = _inter(do, q_decay, st, dq, True, LOWP, UPCAST, PREC)
            dk = _inter(v, k_decay, adj, dk, True, LOWP, UPCAST, PREC)
        tl.store(DQ + out_k + offs_k[None, :], dq.to(DQ.dtype.element_ty), mask=ok[:, None])
        tl.store(DK_ + out_k + offs_k[None, :], dk.to(DK_.dtype.element_ty), mask=ok[:, None])

    # [(Q K^T) * M]^T
    p = tl.zeros([BT, BT], dtype=tl.float32)
    for i_k in range(0, DK // BK):
        offs_k = i_k * BK + tl.arange(0, BK)
        q = tl.load(q_base + offs_k[None, :] * stride_qd, mask=ok[:, None], other=0.0)
        k = tl.load(k_base + offs_k[None, :] * stride_kd, mask=ok[:, None], other=0.0)
        p = _mm(q, tl.trans(k), p, UPCAST, PREC)
    pt = tl.trans(p * mask).to(Q.dtype.element_ty)

    # dV per dv tile
    for i_v in range(0, DV // BV):
        offs_v = i_v * BV + tl.arange(0, BV)
        do = tl.load(do_base + offs_v[None, :] * stride_od, mask=ok[:, None], other=0.0)
        dv = _mm(pt, do, tl.zeros([BT, BV], dtype=tl.float32), UPCAST, PREC)
        for i_k in range(0, DK // BK):
            offs_k = i_k * BK + tl.arange(0, BK)
            tile = offs_k[:, None] * DV + offs_v[None, :]
            k = tl.load(k_base + offs_k[None, :] * stride_kd, mask=ok[:, None], other=0.0)
            adj = _state_tile(dseg_base, dhloc_base, tile, bwd_w, n < n_last)
            dv = _inter(k, k_decay, adj, dv, False, LOWP, UPCAST, PREC)
        tl.store(DV_ + out_v + offs_v[None, :], dv.to(DV_.dtype.element_ty), mask=ok[:, None])


def chunk_bwd(do, dht, q, k, v, slope, seg, chunks, need_dh0: bool):
    """Gradients of :func:`.chunk.chunk_fwd`. ``seg``: the forward's entering segment states (float32);
    ``chunks``: the forward's ``(BT, G)``.

    Returns ``(dq, dk, dv, dh0 or None)``; ``dht`` (gradient of the final state) may be None.
    """
    B, T, H, DK = q.shape
    DV = v.shape[-1]
    BT, G, NT, NSEG = common.geometry(T, chunks)
    if tuple(seg.shape) != (B * H, NSEG, DK, DV) or do.shape != v.shape:
        raise ValueError(f"saved segment states {tuple(seg.shape)} do not match q {tuple(q.shape)}, chunks {chunks}")
    hloc, _ = chunk_states(k, v, slope, chunks, reverse=False, store_seg=False)
    dhloc, dseg = chunk_states(q, do, slope, chunks, reverse=True)
    dht = None if dht is None else dht.float()
    dh0 = segment_scan(dseg, dht, slope, T, H, chunks, reverse=True, store_out=need_dh0)
    BK, BV, num_warps, num_stages = pick_config(common.BWD_CONFIGS, (DK, DV), interpret_tiles(DK, DV))
    dq = triton_utils.empty(q.shape, q.dtype, q.device)
    dk = triton_utils.empty(k.shape, k.dtype, k.device)
    dv = triton_utils.empty(v.shape, v.dtype, v.device)
    _chunk_bwd_kernel[(NT, B * H)](
        q, k, v, do, hloc, seg, dhloc, dseg, slope, dq, dk, dv,
        *strides4(q), *strides4(k), *strides4(v), *strides4(do), T, H, NT, NSEG,
        DK=DK, DV=DV, BT=BT, G=G, BK=BK, BV=BV, LOWP=hloc.dtype != torch.float32, UPCAST=common.upcast(q.dtype),
        PREC=common.precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return dq, dk, dv, dh0
