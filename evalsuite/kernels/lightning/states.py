"""Chunk and segment states of Lightning Attention: the sequential part of Algorithms 5-6, cut into segments.

* :func:`chunk_states` (``_chunk_states_kernel``): per segment, the segment-local state at every chunk start and
  the segment's total. Forward direction (``reverse=False``, operands k, v):
  ``h <- lambda^L h + (lambda^(L-1-c) K)^T V`` chunk by chunk; stored before each chunk except the segment's first
  (where it is zero). Reverse direction (``reverse=True``, operands q, dO, for the adjoint ``dKV``):
  ``g <- lambda^L g + (lambda^(c+1) Q)^T dO`` from the segment's last chunk back to its first; stored before each
  chunk except the segment's last.
* :func:`segment_scan` (``_segment_scan_kernel``): the segment totals, in place, become the global state entering
  each segment (forward: the state at the position before the segment; reverse: the adjoint arriving from
  after the segment), starting from ``init`` (h0, or the gradient of the final state); the value after the last
  segment (final state, or the gradient of h0) is written to ``out``.

The reverse scan is the forward scan in reversed time: segment s of ``[a_s, e_s)`` becomes ``[T - e_s, T - a_s)``,
so one kernel serves both with the positions remapped. See :mod:`.common` for the conventions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.common import LOG2E_JIT, _in_range, _mm, interpret_tiles, strides4
from evalsuite.kernels.triton_utils import interpreting, pick_config


@triton.jit
def _chunk_states_kernel(
    A,
    Bv,
    HLOC,
    SEG,
    SLOPE,
    stride_ab,
    stride_at,
    stride_ah,
    stride_ad,
    stride_bb,
    stride_bt,
    stride_bh,
    stride_bd,
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
    REVERSE: tl.constexpr,
    STORE_SEG: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    """Grid (dk/BK * dv/BV, NSEG, B*H). A: [B, T, H, DK] (k or q), Bv: [B, T, H, DV] (v or dO).

    Writes HLOC [B*H, NT, DK, DV] (the segment-local state entering each chunk; the first chunk of the segment in
    walking order is skipped: it would be zero) and SEG [B*H, NSEG, DK, DV] float32 (the segment total).
    """
    pid_kv = tl.program_id(0)
    s = tl.program_id(1)
    pid_bh = tl.program_id(2)
    i_k = pid_kv // (DV // BV)
    i_v = pid_kv % (DV // BV)
    b = (pid_bh // H).to(tl.int64)
    h = pid_bh % H
    nl2 = -tl.load(SLOPE + h) * LOG2E_JIT  # lambda^n = exp2(nl2 * n)

    offs_t = tl.arange(0, BT)
    offs_k = i_k * BK + tl.arange(0, BK)
    offs_v = i_v * BV + tl.arange(0, BV)
    a_base = A + b * stride_ab + h.to(tl.int64) * stride_ah + offs_k[None, :] * stride_ad
    b_base = Bv + b * stride_bb + h.to(tl.int64) * stride_bh + offs_v[None, :] * stride_bd
    tile = offs_k[:, None] * DV + offs_v[None, :]
    hloc_base = HLOC + pid_bh.to(tl.int64) * NT * DK * DV + tile

    n0 = s * G
    nj = tl.minimum(G, NT - n0)
    acc = tl.zeros([BK, BV], dtype=tl.float32)
    for i in range(0, nj):
        if REVERSE:
            n = n0 + nj - 1 - i
        else:
            n = n0 + i
        if i > 0:
            tl.store(hloc_base + n.to(tl.int64) * DK * DV, acc.to(HLOC.dtype.element_ty))
        t0 = n * BT
        rows = t0 + offs_t
        ok = rows < T
        L = tl.minimum(BT, T - t0)
        rows64 = _in_range(rows, T)  # masked rows address row T - 1 (see common._in_range)
        a = tl.load(a_base + rows64[:, None] * stride_at, mask=ok[:, None], other=0.0)
        bb = tl.load(b_base + rows64[:, None] * stride_bt, mask=ok[:, None], other=0.0)
        if REVERSE:
            w = tl.exp2(nl2 * (offs_t + 1))
        else:
            w = tl.exp2(nl2 * tl.maximum(L - 1 - offs_t, 0))
        ad = (a.to(tl.float32) * w[:, None]).to(a.dtype)
        acc = _mm(tl.trans(ad), bb, acc * tl.exp2(nl2 * L), UPCAST, PREC)
    if STORE_SEG:
        tl.store(SEG + (pid_bh.to(tl.int64) * NSEG + s) * DK * DV + tile, acc)


@triton.jit
def _segment_scan_kernel(
    SEG,
    INIT,
    OUT,
    SLOPE,
    T,
    H,
    NSEG,
    SEGLEN,
    E: tl.constexpr,
    SB: tl.constexpr,
    BE: tl.constexpr,
    REVERSE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    STORE_OUT: tl.constexpr,
):
    """Grid (E/BE, B*H), E = DK*DV. SEG [B*H, NSEG, E] float32: segment totals in, entering states out (in place).

    In (possibly reversed) processing time p with segment spans [a_p, e_p), SB segments per step:
    ``C_p = lambda^(a_p - a_first) carry + sum_{q<p} lambda^(a_p - e_q) tot_q`` (a decay-matrix product), then
    ``carry <- lambda^(e_last - a_first) carry + sum_q lambda^(e_last - e_q) tot_q``.
    """
    pid_e = tl.program_id(0)
    pid_bh = tl.program_id(1)
    h = pid_bh % H
    nl2 = -tl.load(SLOPE + h) * LOG2E_JIT  # lambda^n = exp2(nl2 * n)
    offs_e = pid_e * BE + tl.arange(0, BE)
    if HAS_INIT:
        carry = tl.load(INIT + pid_bh.to(tl.int64) * E + offs_e)
    else:
        carry = tl.zeros([BE], dtype=tl.float32)
    seg_base = SEG + pid_bh.to(tl.int64) * NSEG * E + offs_e[None, :]
    rows = tl.arange(0, SB)
    lower = rows[None, :] < rows[:, None]
    for p0 in range(0, NSEG, SB):
        p = p0 + rows
        valid = p < NSEG
        if REVERSE:
            sidx = NSEG - 1 - p
        else:
            sidx = p
        a_s = sidx * SEGLEN
        e_s = tl.minimum(a_s + SEGLEN, T)
        if REVERSE:
            ap = T - e_s
            ep = T - a_s
        else:
            ap = a_s
            ep = e_s
        a_first = tl.min(tl.where(valid, ap, T), 0)
        e_last = tl.max(tl.where(valid, ep, 0), 0)
        ptrs = seg_base + _in_range(sidx, NSEG)[:, None] * E  # lanes past either end: masked, in the buffer
        tot = tl.load(ptrs, mask=valid[:, None], other=0.0)
        W = tl.where(lower & valid[None, :], tl.exp2(nl2 * tl.maximum(ap[:, None] - ep[None, :], 0)), 0.0)
        ent = _mm(W, tot, tl.exp2(nl2 * tl.maximum(ap - a_first, 0))[:, None] * carry[None, :], False, "ieee")
        tl.store(ptrs, ent, mask=valid[:, None])
        w_end = tl.where(valid, tl.exp2(nl2 * tl.maximum(e_last - ep, 0)), 0.0)
        carry = carry * tl.exp2(nl2 * (e_last - a_first)) + tl.sum(w_end[:, None] * tot, 0)
    if STORE_OUT:
        tl.store(OUT + pid_bh.to(tl.int64) * E + offs_e, carry)


def chunk_states(a, b, slope, chunks, *, reverse: bool, store_seg: bool = True):
    """Launch :func:`_chunk_states_kernel` on ``a [B, T, H, dk]``, ``b [B, T, H, dv]`` (same dtype), with
    ``chunks = (BT, G)`` (:func:`common.chunking`, picked once by the forward).

    Returns ``(hloc [B*H, NT, dk, dv]`` in :func:`common.state_dtype`, ``seg [B*H, NSEG, dk, dv]`` float32 or None).
    """
    B, T, H, DK = a.shape
    DV = b.shape[-1]
    BT, G, NT, NSEG = common.geometry(T, chunks)
    BK, BV, num_warps, num_stages = pick_config(common.STATES_CONFIGS, (DK, DV), interpret_tiles(DK, DV))
    sdt = common.state_dtype(a.dtype)
    hloc = triton_utils.empty((B * H, NT, DK, DV), sdt, a.device)
    seg = triton_utils.empty((B * H, NSEG, DK, DV), torch.float32, a.device) if store_seg else hloc
    grid = ((DK // BK) * (DV // BV), NSEG, B * H)
    _chunk_states_kernel[grid](
        a, b, hloc, seg, slope, *strides4(a), *strides4(b), T, H, NT, NSEG,
        DK=DK, DV=DV, BT=BT, G=G, BK=BK, BV=BV, REVERSE=reverse, STORE_SEG=store_seg,
        UPCAST=common.upcast(a.dtype), PREC=common.precision(a.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return hloc, (seg if store_seg else None)


def segment_scan(seg, init, slope, T: int, H: int, chunks, *, reverse: bool, store_out: bool):
    """Launch :func:`_segment_scan_kernel` on ``seg [B*H, NSEG, dk, dv]`` float32 (in place), segments of
    ``chunks = (BT, G)``.

    ``init``: ``[B, H, dk, dv]`` float32 or None (zeros). Returns the value after the last segment, ``[B, H, dk, dv]``
    float32, if ``store_out`` (else None).
    """
    BH, NSEG, DK, DV = seg.shape
    BT, G, _, nseg = common.geometry(T, chunks)
    if nseg != NSEG or BH % H or (init is not None and tuple(init.shape) != (BH // H, H, DK, DV)):
        raise ValueError(f"segment states {tuple(seg.shape)} do not match T={T}, H={H}, chunks={chunks}")
    SB, BE, num_warps = common.INTERPRET_SCAN if interpreting() else common.SCAN_CONFIG
    E = DK * DV
    BE = min(BE, E)
    out = triton_utils.empty((BH // H, H, DK, DV), torch.float32, seg.device) if store_out else None
    init_t = init.contiguous() if init is not None else seg
    _segment_scan_kernel[(E // BE, BH)](
        seg, init_t, out if store_out else seg, slope, T, H, NSEG, BT * G,
        E=E, SB=SB, BE=BE, REVERSE=reverse, HAS_INIT=init is not None, STORE_OUT=store_out, num_warps=num_warps,
    )  # fmt: skip
    return out
