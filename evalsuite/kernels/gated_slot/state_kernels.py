"""The two state scans of chunked GSA (the per-chunk kernels and the notation: :mod:`.chunk_kernels`).

``HS [B*H, NT + 1, M, D]`` holds each pass's state at the start of every chunk (the final state at index NT),
``DHS [B*H, NT, M, D]`` the adjoint of the state at the end of every chunk. A scan is a walk over chunks with the
``[M, BD]`` state tile in registers, one program per (d tile, segment, batch*head). With one segment (many heads
and batches) each program walks the whole sequence. With several (:func:`.common.segment_chunks`: a long sequence
over few heads), as the Lightning kernels do (:mod:`evalsuite.kernels.lightning.scan`): (1) a walk of every segment
from zero (``TOTALS``) stores its end value and its summed log gates; (2) :func:`_segment_scan_kernel` turns those,
in place, into the value entering each segment, a recurrence over segments; (3) every segment walks again from its
entering value and stores its chunks' values. The gate acts on each slot alone, so a segment's decay is the vector
``exp(L)`` of its summed log gates ``L <= 0``: every exponent a scan takes is ``<= 0`` (nothing is divided by a
decay), and saturated gates underflow to the exact 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.common import G_FLOOR, _load_u, _write_strength

# The kernels take the constexprs of common.dot_flags for their products: DT, MT, PREC; see there for the tl.dot idiom.
# Buffers of segment values, SEG [B*H, NSEG, M, D], and of summed log gates, LSEG [B*H, NSEG, M], are float32; a
# segment's totals are stored by every d tile, its summed log gates by one program (``first``: pass 1's tile 0).


@triton.jit
def _state_fwd_walk(X, X0, OUT, G, LSEG, bh, s, i_d, first, T, H, NT, NSEG, SEGC, M: tl.constexpr, D: tl.constexpr,
                    BD: tl.constexpr, C: tl.constexpr, HAS_X0: tl.constexpr, TOTALS: tl.constexpr,
                    DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile, the chunks of segment s in time order, running
    ``H <- diag(exp bt) H + (s exp(bt - b))^T x``. TOTALS: from zero; store the end value to ``OUT = SEG[bh, s]``
    and the summed log gates to ``LSEG[bh, s]``. Otherwise from ``X0[bh, s]`` (``[B*H, NSEG, M, D]``: the entering
    values, or h0 with one segment; zero without HAS_X0): store ``OUT = HS[bh, n]`` for every chunk n (and the final
    state at NT after the sequence's last chunk)."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    seg = bh.to(tl.int64) * NSEG + s
    if HAS_X0:
        state = tl.load(X0 + seg * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    decay = tl.zeros([M], dtype=tl.float32)
    hs = OUT + bh.to(tl.int64) * (NT + 1) * M * D
    step = tl.full([], 0, tl.int64) + M * D  # int64 offsets per chunk
    n0 = s * SEGC
    n1 = tl.minimum(n0 + SEGC, NT)
    for n in tl.range(n0, n1):
        if not TOTALS:
            tl.store(hs + n * step + tile, state)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = tl.maximum(tl.load(G + row[:, None] * M + offs_m[None, :], mask=ok[:, None], other=0.0), G_FLOOR)
        s_w = _write_strength(g)
        total = tl.sum(g, 0)
        w = s_w * tl.exp(total[None, :] - tl.cumsum(g, 0))  # decay from row r to the chunk end
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = state * tl.exp(total)[:, None]
        state = tl.dot(tl.trans(w).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        decay += total
    if TOTALS:
        tl.store(OUT + seg * M * D + tile, state)
        if first:
            tl.store(LSEG + seg * M + offs_m, decay)
    elif n1 == NT:
        tl.store(hs + NT * step + tile, state)


@triton.jit
def _state_fwd_kernel(K, V, G, X0K, X0V, OUTK, OUTV, LSEG, T, H, NT, NSEG, SEGC, NDK, M: tl.constexpr,
                      DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, HAS_X0: tl.constexpr,
                      TOTALS: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, segments, B*H): pass 1 (programs i < NDK: d tile i of dk, x = k) and pass 2 (x = v) in one
    launch. TOTALS: segments 0 .. NSEG - 2 (the last one's total is never needed)."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    bh = tl.program_id(2)
    if pid < NDK:
        _state_fwd_walk(K, X0K, OUTK, G, LSEG, bh, s, pid, pid == 0, T, H, NT, NSEG, SEGC, M, DK, BD, C, HAS_X0,
                        TOTALS, DT, MT, PREC)  # fmt: skip
    else:
        _state_fwd_walk(V, X0V, OUTV, G, LSEG, bh, s, pid - NDK, False, T, H, NT, NSEG, SEGC, M, DV, BD, C, HAS_X0,
                        TOTALS, DT, MT, PREC)  # fmt: skip


@triton.jit
def _state_bwd_walk(X, Z, DP, G, X0, OUT, LSEG, DH0, bh, s, i_d, first, T, H, NT, NSEG, SEGC, scale,
                    MODE: tl.constexpr, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
                    HAS_X0: tl.constexpr, TOTALS: tl.constexpr, STORE_DH0: tl.constexpr, DT: tl.constexpr,
                    MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile, the chunks of segment s last first, running ``dH <- diag(exp bt) dH + (u exp(b))^T x``.
    TOTALS: from zero; store the value at the segment's start to ``OUT = SEG[bh, s]`` and the summed log gates to
    ``LSEG[bh, s]``. Otherwise from ``X0[bh, s]`` (the adjoints arriving from after each segment, or the final
    state's with one segment; zero without HAS_X0): store ``OUT = DHS[bh, n]`` (the adjoint at the end of chunk n)
    for every chunk, and with STORE_DH0 the initial state's adjoint to DH0 after chunk 0."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    seg = bh.to(tl.int64) * NSEG + s
    if HAS_X0:
        state = tl.load(X0 + seg * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    decay = tl.zeros([M], dtype=tl.float32)
    dhs = OUT + bh.to(tl.int64) * NT * M * D
    step = tl.full([], 0, tl.int64) + M * D
    n0 = s * SEGC
    nj = tl.minimum(SEGC, NT - n0)
    for i in tl.range(0, nj):
        n = n0 + nj - 1 - i
        if not TOTALS:
            tl.store(dhs + n * step + tile, state)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = tl.maximum(tl.load(G + row[:, None] * M + offs_m[None, :], mask=ok[:, None], other=0.0), G_FLOOR)
        u = _load_u(Z, DP, row, ok, scale, M, MODE) * tl.exp(tl.cumsum(g, 0))  # decay chunk start -> row r
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        total = tl.sum(g, 0)
        acc = state * tl.exp(total)[:, None]
        state = tl.dot(tl.trans(u).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        decay += total
    if TOTALS:
        tl.store(OUT + seg * M * D + tile, state)
        if first:
            tl.store(LSEG + seg * M + offs_m, decay)
    elif STORE_DH0:
        if s == 0:
            tl.store(DH0 + bh.to(tl.int64) * M * D + tile, state)


@triton.jit
def _state_bwd_kernel(Q, DO, Z, DP, G, DH0K, DH0V, X0K, X0V, OUTK, OUTV, LSEG, T, H, NT, NSEG, SEGC, NDK, scale,
                      M: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
                      HAS_X0: tl.constexpr, TOTALS: tl.constexpr, STORE_DH0: tl.constexpr, DT: tl.constexpr,
                      MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, segments, B*H): the state adjoints of pass 1 (programs i < NDK: u = e, x = q) and pass 2
    (u = p, x = dO) in one launch. TOTALS: segments 1 .. NSEG - 1 (the first one's total is never needed)."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    if TOTALS:
        s += 1
    bh = tl.program_id(2)
    if pid < NDK:
        _state_bwd_walk(Q, Z, DP, G, X0K, OUTK, LSEG, DH0K, bh, s, pid, pid == 0, T, H, NT, NSEG, SEGC, scale, 2, M,
                        DK, BD, C, HAS_X0, TOTALS, STORE_DH0, DT, MT, PREC)  # fmt: skip
    else:
        _state_bwd_walk(DO, Z, DP, G, X0V, OUTV, LSEG, DH0V, bh, s, pid - NDK, False, T, H, NT, NSEG, SEGC, scale, 1,
                        M, DV, BD, C, HAS_X0, TOTALS, STORE_DH0, DT, MT, PREC)  # fmt: skip


@triton.jit
def _segment_scan(SEG, LSEG, INIT, bh, i_d, NSEG, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                  REVERSE: tl.constexpr, HAS_INIT: tl.constexpr):  # fmt: skip
    """One pass, one d tile: in processing order (segment 0 first, or with REVERSE the last first), replace each
    segment's total in ``SEG[bh]`` with the value entering it, ``E <- diag(exp L) E + total`` from ``INIT[bh]`` (or
    zero without HAS_INIT); the last segment processed holds no total (its walk was skipped) and only receives E."""
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    if HAS_INIT:
        carry = tl.load(INIT + bh.to(tl.int64) * M * D + tile)
    else:
        carry = tl.zeros([M, BD], dtype=tl.float32)
    seg = SEG + bh.to(tl.int64) * NSEG * M * D
    lseg = LSEG + bh.to(tl.int64) * NSEG * M
    step = tl.full([], 0, tl.int64) + M * D
    for p in tl.range(0, NSEG - 1):
        if REVERSE:
            s = NSEG - 1 - p
        else:
            s = p
        total = tl.load(seg + s * step + tile)
        tl.store(seg + s * step + tile, carry)
        carry = carry * tl.exp(tl.load(lseg + s * M + offs_m))[:, None] + total
    if REVERSE:
        tl.store(seg + tile, carry)
    else:
        tl.store(seg + (NSEG - 1) * step + tile, carry)


@triton.jit
def _segment_scan_kernel(SEGK, SEGV, LSEG, INITK, INITV, NSEG, NDK, M: tl.constexpr, DK: tl.constexpr,
                         DV: tl.constexpr, BD: tl.constexpr, REVERSE: tl.constexpr,
                         HAS_INIT: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, B*H): the scan across segments of pass 1 (programs i < NDK) and pass 2, forward (states)
    or REVERSE (adjoints); both passes share the gates, so one LSEG."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if pid < NDK:
        _segment_scan(SEGK, LSEG, INITK, bh, pid, NSEG, M, DK, BD, REVERSE, HAS_INIT)
    else:
        _segment_scan(SEGV, LSEG, INITV, bh, pid - NDK, NSEG, M, DV, BD, REVERSE, HAS_INIT)
