"""The two sequential state scans of chunked GSA (the per-chunk kernels and the notation: :mod:`.chunk_kernels`).

``HS [B*H, NT + 1, M, D]`` holds each pass's state at the start of every chunk (the final state at index NT),
``DHS [B*H, NT, M, D]`` the adjoint of the state at the end of every chunk. Every exponent a scan takes is ``<= 0``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.common import _load_u, _write_strength

# The kernels take the constexprs of common.dot_flags for their products: DT, MT, PREC; see there for the tl.dot idiom.

# ----------------------------------------------------------------------------------------------------------------
# Sequential state scans. Grid (dk/BD + dv/BD, B*H): a program walks all chunks for one d tile of one pass.
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _state_fwd_scan(X, H0, HS, G, bh, i_d, T, H, NT, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                    C: tl.constexpr, HAS_H0: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                    PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile: store ``HS[bh, n]`` for every chunk n (and the final state at NT) while running
    ``H <- diag(exp bt) H + (s exp(bt - b))^T x`` over the chunks."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    if HAS_H0:
        state = tl.load(H0 + bh.to(tl.int64) * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    hs = HS + bh.to(tl.int64) * (NT + 1) * M * D
    step = tl.full([], 0, tl.int64) + M * D  # int64 offsets per chunk
    for n in tl.range(0, NT):
        tl.store(hs + n * step + tile, state)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = tl.load(G + row[:, None] * M + offs_m[None, :], mask=ok[:, None], other=0.0)
        s = _write_strength(g)
        total = tl.sum(g, 0)
        w = s * tl.exp(total[None, :] - tl.cumsum(g, 0))  # decay from row r to the chunk end
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = state * tl.exp(total)[:, None]
        state = tl.dot(tl.trans(w).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
    tl.store(hs + NT * step + tile, state)


@triton.jit
def _state_fwd_kernel(K, V, G, H0K, H0V, HSK, HSV, T, H, NT, NDK, M: tl.constexpr, DK: tl.constexpr,
                      DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, HAS_H0: tl.constexpr, DT: tl.constexpr,
                      MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Chunk-start states of pass 1 (programs i < NDK: d tile i of dk, x = k) and pass 2 (x = v) in one launch."""
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if pid < NDK:
        _state_fwd_scan(K, H0K, HSK, G, bh, pid, T, H, NT, M, DK, BD, C, HAS_H0, DT, MT, PREC)
    else:
        _state_fwd_scan(V, H0V, HSV, G, bh, pid - NDK, T, H, NT, M, DV, BD, C, HAS_H0, DT, MT, PREC)


@triton.jit
def _state_bwd_scan(X, Z, DP, G, DHT, DHS, DH0, bh, i_d, T, H, NT, scale, MODE: tl.constexpr, M: tl.constexpr,
                    D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, HAS_DHT: tl.constexpr,
                    STORE_DH0: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One pass, one d tile, last chunk first: store ``DHS[bh, n]`` (the adjoint at the end of chunk n, starting
    from DHT) while running ``dH <- diag(exp bt) dH + (u exp(b))^T x``; the adjoint of the initial state to DH0."""
    b = bh // H
    h = bh % H
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    tile = offs_m[:, None] * D + offs_d[None, :]
    if HAS_DHT:
        state = tl.load(DHT + bh.to(tl.int64) * M * D + tile)
    else:
        state = tl.zeros([M, BD], dtype=tl.float32)
    dhs = DHS + bh.to(tl.int64) * NT * M * D
    step = tl.full([], 0, tl.int64) + M * D
    for i in tl.range(0, NT):
        n = NT - 1 - i
        tl.store(dhs + n * step + tile, state)
        t = n * C + offs_c
        ok = t < T
        row = (b * T + t).to(tl.int64) * H + h
        g = tl.load(G + row[:, None] * M + offs_m[None, :], mask=ok[:, None], other=0.0)
        u = _load_u(Z, DP, row, ok, scale, M, MODE) * tl.exp(tl.cumsum(g, 0))  # decay chunk start -> row r
        x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
        acc = state * tl.exp(tl.sum(g, 0))[:, None]
        state = tl.dot(tl.trans(u).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
    if STORE_DH0:
        tl.store(DH0 + bh.to(tl.int64) * M * D + tile, state)


@triton.jit
def _state_bwd_kernel(Q, DO, Z, DP, G, DHTK, DHTV, DHSK, DHSV, DH0K, DH0V, T, H, NT, NDK, scale, M: tl.constexpr,
                      DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, HAS_DHT: tl.constexpr,
                      STORE_DH0: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                      PREC: tl.constexpr):  # fmt: skip
    """State adjoints of pass 1 (programs i < NDK: u = e, x = q) and pass 2 (u = p, x = dO) in one launch."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if pid < NDK:
        _state_bwd_scan(Q, Z, DP, G, DHTK, DHSK, DH0K, bh, pid, T, H, NT, scale, 2, M, DK, BD, C, HAS_DHT,
                        STORE_DH0, DT, MT, PREC)  # fmt: skip
    else:
        _state_bwd_scan(DO, Z, DP, G, DHTV, DHSV, DH0V, bh, pid - NDK, T, H, NT, scale, 1, M, DV, BD, C, HAS_DHT,
                        STORE_DH0, DT, MT, PREC)  # fmt: skip
