"""The segment scan of Lightning Attention: segment totals -> the state entering each segment.

:func:`segment_scan` (``_segment_scan_kernel``) turns the per-segment totals of :func:`.walk.walk` (``totals=True``),
in place, into the global state entering each segment (forward: the state at the position before the segment;
reverse: the adjoint arriving from after the segment), starting from ``init`` (h0, or the gradient of the final
state); the value after the last segment (final state, or the gradient of h0) is written to ``out``.

The reverse scan is the forward scan in reversed time: segment s of ``[a_s, e_s)`` becomes ``[T - e_s, T - a_s)``,
so one kernel serves both with the positions remapped. See :mod:`.common` for the conventions.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.jit_helpers import in_range, mm
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.common import LOG2E_JIT


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
        ptrs = seg_base + in_range(sidx, NSEG)[:, None] * E  # lanes past either end: masked, in the buffer
        tot = tl.load(ptrs, mask=valid[:, None], other=0.0)
        W = tl.where(lower & valid[None, :], tl.exp2(nl2 * tl.maximum(ap[:, None] - ep[None, :], 0)), 0.0)
        ent = mm(W, tot, tl.exp2(nl2 * tl.maximum(ap - a_first, 0))[:, None] * carry[None, :], False, "ieee")
        tl.store(ptrs, ent, mask=valid[:, None])
        w_end = tl.where(valid, tl.exp2(nl2 * tl.maximum(e_last - ep, 0)), 0.0)
        carry = carry * tl.exp2(nl2 * (e_last - a_first)) + tl.sum(w_end[:, None] * tot, 0)
    if STORE_OUT:
        tl.store(OUT + pid_bh.to(tl.int64) * E + offs_e, carry)


def segment_scan(seg, init, slope, T: int, H: int, chunks, config, *, reverse: bool, store_out: bool):
    """Launch :func:`_segment_scan_kernel` on ``seg [B*H, NSEG, dk, dv]`` float32 (in place), segments of
    ``chunks = (BT, G)``, with ``config.scan`` (a :class:`~evalsuite.kernels.lightning.common.LaunchConfig`).

    ``init``: ``[B, H, dk, dv]`` float32 or None (zeros). Returns the value after the last segment, ``[B, H, dk, dv]``
    float32, if ``store_out`` (else None).
    """
    BH, NSEG, DK, DV = seg.shape
    BT, G, _, nseg = common.geometry(T, chunks)
    if nseg != NSEG or BH % H or (init is not None and tuple(init.shape) != (BH // H, H, DK, DV)):
        raise ValueError(f"segment states {tuple(seg.shape)} do not match T={T}, H={H}, chunks={chunks}")
    SB, BE, num_warps = config.scan
    E = DK * DV
    BE = min(BE, E)
    out = triton_utils.empty((BH // H, H, DK, DV), torch.float32, seg.device) if store_out else None
    init_t = init.contiguous() if init is not None else seg
    _segment_scan_kernel[(E // BE, BH)](
        seg, init_t, out if store_out else seg, slope, T, H, NSEG, BT * G,
        E=E, SB=SB, BE=BE, REVERSE=reverse, HAS_INIT=init is not None, STORE_OUT=store_out, num_warps=num_warps,
    )  # fmt: skip
    return out
