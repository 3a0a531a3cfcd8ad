"""The one Lightning Attention kernel: a sequential walk over the chunks of a segment (Algorithms 5 and 6).

Every pass of the forward and the backward has the same shape (see :mod:`.chunk` for which operands each uses).
Over the chunks of one segment, in time order (``reverse=False``) or from the last chunk back to the first
(``reverse=True``), with a running state ``X [dA, dC]`` float32 kept in registers, for chunk rows ``c`` of a chunk
of ``L`` positions:

    forward:  out = [(A B^T) * M]   C + (lambda^(c+1)   A) X,   X <- lambda^L X + (lambda^(L-1-c) B)^T C
    reverse:  out = [(A B^T) * M^T] C + (lambda^(L-1-c) A) X,   X <- lambda^L X + (lambda^(c+1)   B)^T C

with the decay mask ``M[r, c] = lambda^(r-c)`` for ``r >= c`` (the intra-chunk "left product" of the paper) and the
inter-chunk "right product" through the state. ``totals=True`` skips the output: X starts at zero and its value
after the segment (the segment's total contribution) is stored; otherwise X starts from the given entering state
(the segment scan's result) and the outputs are stored.

Grid ``(dC / BC, segments, B*H)``: a program owns a ``[dA, BC]`` slice of the state, so the state never leaves
registers and no per-chunk state is written to memory (each pass reads its three operands once and writes one
output). Parallel over segments, so the work per program and the number of programs stay the same at any T for a
fixed B*T (the paper's "constant speed").
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.jit_helpers import in_range, mm
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.common import LOG2E_JIT, strides4


@triton.jit
def _walk_kernel(
    A,
    B,
    C,
    X,
    Out,
    SLOPE,
    stride_ab,
    stride_at,
    stride_ah,
    stride_ad,
    stride_bb,
    stride_bt,
    stride_bh,
    stride_bd,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_cd,
    stride_xbh,
    stride_xs,
    stride_xa,
    stride_xc,
    T,
    H,
    NT,
    DA: tl.constexpr,
    DC: tl.constexpr,
    BT: tl.constexpr,
    G: tl.constexpr,
    BC: tl.constexpr,
    REVERSE: tl.constexpr,
    TOTALS: tl.constexpr,
    LOWP: tl.constexpr,
    UPCAST: tl.constexpr,
    PREC: tl.constexpr,
):
    """A, B: [Bt, T, H, DA]; C: [Bt, T, H, DC] (any strides); X: [Bt*H, NSEG, DA, DC] float32 (any strides: the
    entering states, or the totals written); Out: [Bt, T, H, DC] contiguous (unused if TOTALS)."""
    i_c = tl.program_id(0)
    s = tl.program_id(1)
    pid_bh = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h64 = (pid_bh % H).to(tl.int64)
    nl2 = -tl.load(SLOPE + h64) * LOG2E_JIT  # lambda^n = exp2(nl2 * n)

    offs_t = tl.arange(0, BT)
    offs_a = tl.arange(0, DA)
    offs_c = i_c * BC + tl.arange(0, BC)
    a_base = A + b * stride_ab + h64 * stride_ah + offs_a[None, :] * stride_ad
    b_base = B + b * stride_bb + h64 * stride_bh + offs_a[None, :] * stride_bd
    c_base = C + b * stride_cb + h64 * stride_ch + offs_c[None, :] * stride_cd
    x_ptrs = X + pid_bh.to(tl.int64) * stride_xbh + s * stride_xs + offs_a[:, None] * stride_xa
    x_ptrs += offs_c[None, :] * stride_xc
    if TOTALS:
        x = tl.zeros([DA, BC], dtype=tl.float32)
    else:
        x = tl.load(x_ptrs)
    if REVERSE:
        gap = offs_t[None, :] - offs_t[:, None]  # M^T: column >= row
    else:
        gap = offs_t[:, None] - offs_t[None, :]
    mask = tl.where(gap >= 0, tl.exp2(nl2 * tl.maximum(gap, 0)), 0.0)
    w_early = tl.exp2(nl2 * (offs_t + 1))  # lambda^(c+1)

    n0 = s * G
    nj = tl.minimum(G, NT - n0)
    for i in range(0, nj):
        if REVERSE:
            n = n0 + nj - 1 - i
        else:
            n = n0 + i
        t0 = n * BT
        rows = t0 + offs_t
        ok = rows < T
        rows64 = in_range(rows, T)  # masked rows (past the ragged end) address row T - 1
        w_late = tl.where(ok, tl.exp2(nl2 * tl.maximum(tl.minimum(BT, T - t0) - 1 - offs_t, 0)), 0.0)  # lambda^(L-1-c)
        bt = tl.load(b_base + rows64[:, None] * stride_bt, mask=ok[:, None], other=0.0)
        ct = tl.load(c_base + rows64[:, None] * stride_ct, mask=ok[:, None], other=0.0)
        if not TOTALS:
            at = tl.load(a_base + rows64[:, None] * stride_at, mask=ok[:, None], other=0.0)
            scores = mm(at, tl.trans(bt), tl.zeros([BT, BT], dtype=tl.float32), UPCAST, PREC)
            acc = mm((scores * mask).to(ct.dtype), ct, tl.zeros([BT, BC], dtype=tl.float32), UPCAST, PREC)
            if REVERSE:
                ad = at.to(tl.float32) * w_late[:, None]
            else:
                ad = at.to(tl.float32) * w_early[:, None]
            if LOWP:
                acc = mm(ad.to(at.dtype), x.to(at.dtype), acc, UPCAST, PREC)
            else:
                acc = mm(ad, x, acc, UPCAST, PREC)
            o_ptrs = Out + ((b * T + rows64[:, None]) * H + h64) * DC + offs_c[None, :]
            tl.store(o_ptrs, acc.to(Out.dtype.element_ty), mask=ok[:, None])
        if REVERSE:
            bd = bt.to(tl.float32) * w_early[:, None]
        else:
            bd = bt.to(tl.float32) * w_late[:, None]
        x = mm(tl.trans(bd.to(bt.dtype)), ct, x * tl.exp2(nl2 * tl.minimum(BT, T - t0)), UPCAST, PREC)
    if TOTALS:
        tl.store(x_ptrs, x)


def walk(a, b, c, x, slope, chunks, config, *, reverse: bool, totals: bool):
    """Launch :func:`_walk_kernel` (module doc) with ``chunks = (BT, G)`` (:func:`common.chunking`) and the
    launch settings of ``config`` (a :class:`~evalsuite.kernels.lightning.common.LaunchConfig`).

    Args:
        a, b: ``[B, T, H, dA]``; c: ``[B, T, H, dC]`` -- one dtype, any strides (``a`` is unused with ``totals``).
        x: ``[B*H, NSEG, dA, dC]`` float32, any strides (a transposed view is fine): the state entering each
            segment, read; or, with ``totals``, where the segment totals are written.
        slope: ``[H]`` float32 on the device.
    Returns:
        ``out [B, T, H, dC]`` in c's dtype, or None with ``totals``.
    """
    Bt, T, H, DA = b.shape
    DC = c.shape[-1]
    BT, G, NT, NSEG = common.geometry(T, chunks)
    if tuple(x.shape) != (Bt * H, NSEG, DA, DC) or x.dtype != torch.float32:
        raise ValueError(f"states {tuple(x.shape)} {x.dtype} do not match {tuple(b.shape)}, {tuple(c.shape)}, {chunks}")
    BC, num_warps, num_stages = common.walk_config(DA, DC, c.dtype, config)
    out = None if totals else triton_utils.empty((Bt, T, H, DC), c.dtype, c.device)
    a = b if totals else a
    _walk_kernel[(DC // BC, NSEG, Bt * H)](
        a, b, c, x, out if out is not None else x, slope, *strides4(a), *strides4(b), *strides4(c), *strides4(x),
        T, H, NT, DA=DA, DC=DC, BT=BT, G=G, BC=BC, REVERSE=reverse, TOTALS=totals,
        LOWP=c.dtype == torch.bfloat16, UPCAST=common.upcast(c.dtype), PREC=common.precision(c.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return out
