"""The two state scans of chunked GSA (the per-chunk kernels and the notation: :mod:`.chunk_kernels`).

``HS [B*H, NT + 1, M, D]`` holds each pass's state at the start of every chunk (the final state at index NT),
``DHS [B*H, NT, M, D]`` the adjoint of the state at the end of every chunk. A scan is a walk over chunks with the
``[M, BD]`` state tile in registers, one program per (d tile, segment, batch*head). With one segment (many heads
and batches) each program walks the whole sequence from the initial value. With several
(:func:`.common.segment_chunks`: a long sequence over few heads): (1) every segment walks from zero (``LOCAL``),
storing its chunks' local values, each chunk's summed log gates since the segment's edge (``LCUM``), the segment's
end value and summed log gates; (2) :func:`_segment_scan_kernel` turns the end values, in place, into the value
entering each segment (a recurrence over segments, from the initial value), and stores the value after the last
segment (the final state, or the initial state's adjoint); (3) :func:`_segment_fixup_kernel` adds to every chunk's
local value its entering value decayed to that chunk, ``diag(exp LCUM) E``: a parallel pass instead of a second walk.
The gate acts on each slot alone, so a decay over rows is the vector ``exp(L)`` of their summed log gates ``L <= 0``:
every exponent a scan takes is ``<= 0`` (nothing is divided by a decay), and saturated gates underflow to the exact 0.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.common import _load_gates, _load_u, _write_strength

# The kernels take the constexprs of common.dot_flags for their products: DT, MT, PREC; see there for the tl.dot idiom.
# Buffers of segment values, SEG [B*H, NSEG, M, D], of their summed log gates, LSEG [B*H, NSEG, M], and of each
# chunk's summed log gates since its segment's edge, LCUM [B*H, NT, M], are float32; a segment's values are stored by
# every d tile, the log-gate sums by one program (``first``: pass 1's tile 0).


@triton.jit
def _state_fwd_walk(X, X0, OUT, G, SEG, LSEG, LCUM, bh, s, i_d, first, T, H, NT, NSEG, SEGC, M: tl.constexpr,
                    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, HAS_X0: tl.constexpr, LOCAL: tl.constexpr,
                    DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile, the chunks of segment s in time order, running
    ``H <- diag(exp bt) H + (s exp(bt - b))^T x`` and storing ``OUT = HS[bh, n]`` for every chunk n. LOCAL: from
    zero; also store LCUM and the end value and summed log gates to ``SEG[bh, s]``, ``LSEG[bh, s]``. Otherwise (one
    segment) from ``X0[bh]`` (h0; zero without HAS_X0), and the final state to ``HS[bh, NT]``."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    seg = bh.to(tl.int64) * NSEG + s
    if HAS_X0:
        state = tl.load(X0 + bh.to(tl.int64) * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    decay = tl.zeros([M], dtype=tl.float32)
    hs = OUT + bh.to(tl.int64) * (NT + 1) * M * D
    step = tl.full([], 0, tl.int64) + M * D  # int64 offsets per chunk
    n0 = s * SEGC
    n1 = tl.minimum(n0 + SEGC, NT)
    for n in tl.range(n0, n1):
        tl.store(hs + n * step + tile, state)
        if LOCAL and first:
            tl.store(LCUM + (bh.to(tl.int64) * NT + n) * M + offs_m, decay)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = _load_gates(G, row, ok, offs_m, M)
        s_w = _write_strength(g)
        total = tl.sum(g, 0)
        w = s_w * tl.exp(total[None, :] - tl.cumsum(g, 0))  # decay from row r to the chunk end
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = state * tl.exp(total)[:, None]
        state = tl.dot(tl.trans(w).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        decay += total
    if LOCAL:
        tl.store(SEG + seg * M * D + tile, state)
        if first:
            tl.store(LSEG + seg * M + offs_m, decay)
    else:
        tl.store(hs + NT * step + tile, state)


@triton.jit
def _state_fwd_kernel(K, V, G, X0K, X0V, OUTK, OUTV, SEGK, SEGV, LSEG, LCUM, T, H, NT, NSEG, SEGC, NDK,
                      M: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
                      HAS_X0: tl.constexpr, LOCAL: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                      PREC: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, segments, B*H): pass 1 (programs i < NDK: d tile i of dk, x = k) and pass 2 (x = v) in one
    launch."""
    pid = tl.program_id(0)
    s = tl.program_id(1)
    bh = tl.program_id(2)
    if pid < NDK:
        _state_fwd_walk(K, X0K, OUTK, G, SEGK, LSEG, LCUM, bh, s, pid, pid == 0, T, H, NT, NSEG, SEGC, M, DK, BD, C,
                        HAS_X0, LOCAL, DT, MT, PREC)  # fmt: skip
    else:
        _state_fwd_walk(V, X0V, OUTV, G, SEGV, LSEG, LCUM, bh, s, pid - NDK, False, T, H, NT, NSEG, SEGC, M, DV, BD,
                        C, HAS_X0, LOCAL, DT, MT, PREC)  # fmt: skip


@triton.jit
def _state_bwd_walk(X, Z, DP, G, X0, OUT, SEG, LSEG, LCUM, DH0, bh, s, i_d, first, T, H, NT, NSEG, SEGC, scale,
                    MODE: tl.constexpr, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr,
                    HAS_X0: tl.constexpr, LOCAL: tl.constexpr, STORE_DH0: tl.constexpr, DT: tl.constexpr,
                    MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile, the chunks of segment s last first, running ``dH <- diag(exp bt) dH + (u exp(b))^T x``
    and storing ``OUT = DHS[bh, n]`` (the adjoint at the end of chunk n) for every chunk. LOCAL: from zero; also
    store LCUM (the log gates summed over the segment's later chunks) and the value at the segment's start and its
    summed log gates to ``SEG[bh, s]``, ``LSEG[bh, s]``. Otherwise (one segment) from ``X0[bh]`` (the final state's
    adjoint; zero without HAS_X0), and with STORE_DH0 the initial state's adjoint to DH0 after chunk 0."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    seg = bh.to(tl.int64) * NSEG + s
    if HAS_X0:
        state = tl.load(X0 + bh.to(tl.int64) * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    decay = tl.zeros([M], dtype=tl.float32)
    dhs = OUT + bh.to(tl.int64) * NT * M * D
    step = tl.full([], 0, tl.int64) + M * D
    n0 = s * SEGC
    nj = tl.minimum(SEGC, NT - n0)
    for i in tl.range(0, nj):
        n = n0 + nj - 1 - i
        tl.store(dhs + n * step + tile, state)
        if LOCAL and first:
            tl.store(LCUM + (bh.to(tl.int64) * NT + n) * M + offs_m, decay)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = _load_gates(G, row, ok, offs_m, M)
        u = _load_u(Z, DP, row, ok, scale, M, MODE) * tl.exp(tl.cumsum(g, 0))  # decay chunk start -> row r
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        total = tl.sum(g, 0)
        acc = state * tl.exp(total)[:, None]
        state = tl.dot(tl.trans(u).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        decay += total
    if LOCAL:
        tl.store(SEG + seg * M * D + tile, state)
        if first:
            tl.store(LSEG + seg * M + offs_m, decay)
    elif STORE_DH0:
        tl.store(DH0 + bh.to(tl.int64) * M * D + tile, state)


@triton.jit
def _state_bwd_kernel(Q, DO, Z, DP, G, DH0K, DH0V, X0K, X0V, OUTK, OUTV, SEGK, SEGV, LSEG, LCUM, T, H, NT, NSEG,
                      SEGC, NDK, scale, M: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr,
                      C: tl.constexpr, HAS_X0: tl.constexpr, LOCAL: tl.constexpr, STORE_DH0: tl.constexpr,
                      DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, segments, B*H): the state adjoints of pass 1 (programs i < NDK: u = e, x = q) and pass 2
    (u = p, x = dO) in one launch."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    pid = tl.program_id(0)
    s = tl.program_id(1)
    bh = tl.program_id(2)
    if pid < NDK:
        _state_bwd_walk(Q, Z, DP, G, X0K, OUTK, SEGK, LSEG, LCUM, DH0K, bh, s, pid, pid == 0, T, H, NT, NSEG, SEGC,
                        scale, 2, M, DK, BD, C, HAS_X0, LOCAL, STORE_DH0, DT, MT, PREC)  # fmt: skip
    else:
        _state_bwd_walk(DO, Z, DP, G, X0V, OUTV, SEGV, LSEG, LCUM, DH0V, bh, s, pid - NDK, False, T, H, NT, NSEG,
                        SEGC, scale, 1, M, DV, BD, C, HAS_X0, LOCAL, STORE_DH0, DT, MT, PREC)  # fmt: skip


@triton.jit
def _segment_scan(SEG, LSEG, INIT, FINAL, final_stride, bh, i_d, NSEG, M: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr, REVERSE: tl.constexpr, HAS_INIT: tl.constexpr,
                  STORE_FINAL: tl.constexpr):  # fmt: skip
    """One pass, one d tile: in processing order (segment 0 first, or with REVERSE the last first), replace each
    segment's end value in ``SEG[bh]`` with the value entering it, ``E <- diag(exp L) E + end value`` from
    ``INIT[bh]`` (or zero without HAS_INIT); with STORE_FINAL the value after the last segment processed goes to
    ``FINAL + bh * final_stride``."""
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
    for p in tl.range(0, NSEG):
        if REVERSE:
            s = NSEG - 1 - p
        else:
            s = p
        end = tl.load(seg + s * step + tile)
        tl.store(seg + s * step + tile, carry)
        carry = carry * tl.exp(tl.load(lseg + s * M + offs_m))[:, None] + end
    if STORE_FINAL:
        tl.store(FINAL + bh.to(tl.int64) * final_stride + tile, carry)


@triton.jit
def _segment_scan_kernel(SEGK, SEGV, LSEG, INITK, INITV, FINALK, FINALV, final_stride_k, final_stride_v, NSEG, NDK,
                         M: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, REVERSE: tl.constexpr,
                         HAS_INIT: tl.constexpr, STORE_FINAL: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, B*H): the scan across segments of pass 1 (programs i < NDK) and pass 2, forward (states)
    or REVERSE (adjoints); both passes share the gates, so one LSEG."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if pid < NDK:
        _segment_scan(SEGK, LSEG, INITK, FINALK, final_stride_k, bh, pid, NSEG, M, DK, BD, REVERSE, HAS_INIT,
                      STORE_FINAL)  # fmt: skip
    else:
        _segment_scan(SEGV, LSEG, INITV, FINALV, final_stride_v, bh, pid - NDK, NSEG, M, DV, BD, REVERSE, HAS_INIT,
                      STORE_FINAL)  # fmt: skip


@triton.jit
def _segment_fixup(OUT, SEG, LCUM, bh, n, s, i_d, NT, NSEG, out_chunks, M: tl.constexpr, D: tl.constexpr,
                   BD: tl.constexpr):  # fmt: skip
    """One pass, one d tile, chunk n of segment s: ``OUT[bh, n] += diag(exp LCUM[bh, n]) SEG[bh, s]`` (OUT holds
    ``out_chunks`` chunks per batch*head: NT + 1 for HS, NT for DHS)."""
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    entering = tl.load(SEG + (bh.to(tl.int64) * NSEG + s) * M * D + tile)
    decay = tl.exp(tl.load(LCUM + (bh.to(tl.int64) * NT + n) * M + offs_m))
    out = OUT + (bh.to(tl.int64) * out_chunks + n) * M * D + tile
    tl.store(out, tl.load(out) + decay[:, None] * entering)


@triton.jit
def _segment_fixup_kernel(OUTK, OUTV, SEGK, SEGV, LCUM, NT, NSEG, SEGC, NDK, out_chunks, M: tl.constexpr,
                          DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, REVERSE: tl.constexpr,
                          HAS_INIT: tl.constexpr):  # fmt: skip
    """Grid (dk/BD + dv/BD, NT, B*H): every chunk's local value plus its segment's entering value decayed to it, both
    passes. Without HAS_INIT the segment walked first (the last with REVERSE) enters with zero: its programs return
    at once."""
    pid = tl.program_id(0)
    n = tl.program_id(1)
    bh = tl.program_id(2)
    s = n // SEGC
    if REVERSE:
        first_walked = s == NSEG - 1
    else:
        first_walked = s == 0
    if HAS_INIT or not first_walked:
        if pid < NDK:
            _segment_fixup(OUTK, SEGK, LCUM, bh, n, s, pid, NT, NSEG, out_chunks, M, DK, BD)
        else:
            _segment_fixup(OUTV, SEGV, LCUM, bh, n, s, pid - NDK, NT, NSEG, out_chunks, M, DV, BD)
