"""The Triton kernels of chunked GSA: two sequential state scans and four per-chunk kernels.

Notation (per batch b and head h, chunk n of C rows, sub-chunks of BC rows): ``g`` = log alpha ``[., M]`` float32,
``b_r`` = inclusive cumsum of g from the chunk start to row r, ``bt`` = the chunk total, ``s = 1 - exp(g)``.
States are slot-major ``[M, D]`` float32: ``H_t = diag(exp g_t) H_{t-1} + s_t x_t^T`` with x = k (pass 1, D = dk)
or x = v (pass 2, D = dv). Buffers (all contiguous):

* ``HS [B*H, NT + 1, M, D]``: the state at the start of every chunk, and the final state at index NT.
* ``DHS [B*H, NT, M, D]``: the adjoint of the state at the end of chunk n (from later chunks and the final state).
* ``Z, DP [B, T, H, M]`` float32: pass-1 logits ``scale * hk^T q`` and ``dL/dp``.

The per-chunk kernels, one program per (chunk, [d tile,] batch*head), each a sum over sub-chunk pairs:

* :func:`_read_kernel` (output over m, contraction over d):
  ``out_r = scale * [exp(b_r) (H0 x_r) + sum_{s<=r} (x_r . y_s) s_s exp(b_r - b_s)]``.
  Pass-1 logits z (x=q, y=k, H0=hk) and ``dp`` (x=dO, y=v, H0=hv).
* :func:`_write_kernel` (output over a d tile, contraction over m):
  ``out_r = (u_r exp(b_r)) H0 + sum_{s<=r} <u_r, s_s exp(b_r - b_s)> y_s``.
  Output o (u=p, y=v, H0=hv) and dq (u=e, y=k, H0=hk).
* :func:`_write_rev_kernel`: ``out_r = (s_r exp(bt - b_r)) dH + sum_{t>=r} <u_t, s_r exp(b_t - b_r)> x_t``.
  dv (u=p, x=dO, dH=dhv) and dk (u=e, x=q, dH=dhk).
* :func:`_dgate_kernel`: ``ds_r = exp(bt - b_r) (dH y_r) + sum_{t>=r} (x_t . y_r) u_t exp(b_t - b_r)`` for both
  passes (x,y,u = q,k,e and dO,v,p), then the log-gate gradient (see the kernel).

Off-diagonal sub-blocks factor each decay through a reference point between the two sub-chunks (the cumsum at the
sub-chunk boundary), so both factors are ``exp(<= 0)``; diagonal sub-blocks loop over their BC rows elementwise.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.common import E3, E4, E5, _load_u

# Every kernel takes the constexprs of common.dot_flags (DT, MT, PREC); see there for the tl.dot idiom.

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
        s = tl.where(g > -0.1, -g * (1 + g * (0.5 + g * (E3 + g * (E4 + g * E5)))), 1 - tl.exp(g))
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
        u = _load_u(G, Z, DP, row, ok, scale, M, MODE) * tl.exp(tl.cumsum(g, 0))  # decay chunk start -> row r
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
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if pid < NDK:
        _state_bwd_scan(Q, Z, DP, G, DHTK, DHSK, DH0K, bh, pid, T, H, NT, scale, 2, M, DK, BD, C, HAS_DHT,
                        STORE_DH0, DT, MT, PREC)  # fmt: skip
    else:
        _state_bwd_scan(DO, Z, DP, G, DHTV, DHSV, DH0V, bh, pid - NDK, T, H, NT, scale, 1, M, DV, BD, C, HAS_DHT,
                        STORE_DH0, DT, MT, PREC)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Per-chunk kernels. Sub-chunk R holds rows [R*BC, R*BC + BC) of the chunk; `ref` is a cumsum at a sub-chunk
# boundary (the decay reference point); `tri` is the causal mask of a diagonal sub-block, [r, s] = r >= s.
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _read_kernel(X, Y, G, HS, OUT, T, H, NT, scale, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                 C: tl.constexpr, BC: tl.constexpr, DIAG_LOOP: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                 PREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, M]`` float32: ``scale * [exp(b_r) (H0 x_r) + sum_{s<=r} (x_r . y_s) s_s exp(b_r - b_s)]``.
    Grid (NT, B*H). Pass-1 logits (x=q, y=k, H0 = hk) and dp (x=dO, y=v, H0 = hv, scale 1)."""
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    NC: tl.constexpr = C // BC
    idx = tl.arange(0, BC)
    tri = idx[:, None] >= idx[None, :]
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, BD)
    hs = HS + (bh.to(tl.int64) * (NT + 1) + n) * M * D
    t_c = n * C + offs_c
    row_c = (b * T + t_c).to(tl.int64) * H + h
    g_chunk = tl.load(G + row_c[:, None] * M + offs_m[None, :], mask=(t_c < T)[:, None], other=0.0)
    for R in tl.static_range(NC):
        t_r = n * C + R * BC + idx
        ok_r = t_r < T
        row_r = (b * T + t_r).to(tl.int64) * H + h
        ref = tl.sum(tl.where(offs_c[:, None] < R * BC, g_chunk, 0.0), 0)  # cumsum at the end of sub-chunk R-1
        g_r = tl.load(G + row_r[:, None] * M + offs_m[None, :], mask=ok_r[:, None], other=0.0)
        b_r = ref[None, :] + tl.cumsum(g_r, 0)
        acc = tl.zeros([BC, M], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BD):  # from the chunk-start state: x_r . H0 over d
            x = tl.load(X + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
            h0 = tl.load(hs + offs_m[:, None] * D + d0 + offs_d[None, :])
            acc = tl.dot(x.to(DT).to(MT), tl.trans(h0).to(DT).to(MT), acc, input_precision=PREC)
        acc = acc * tl.exp(ref)[None, :]
        for S in tl.static_range(R):  # earlier sub-chunks: exp(b_r - b_s) = exp(b_r - ref) exp(ref - b_s)
            t_s = n * C + S * BC + idx
            ok_s = t_s < T
            row_s = (b * T + t_s).to(tl.int64) * H + h
            a = tl.zeros([BC, BC], dtype=tl.float32)
            for d0 in tl.static_range(0, D, BD):
                x = tl.load(X + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
                y = tl.load(Y + row_s[:, None] * D + d0 + offs_d[None, :], mask=ok_s[:, None], other=0.0)
                a = tl.dot(x.to(DT).to(MT), tl.trans(y).to(DT).to(MT), a, input_precision=PREC)
            g_s = tl.load(G + row_s[:, None] * M + offs_m[None, :], mask=ok_s[:, None], other=0.0)
            b_s = tl.sum(tl.where(offs_c[:, None] < S * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_s, 0)
            w_s = tl.where(g_s > -0.1, -g_s * (1 + g_s * (0.5 + g_s * (E3 + g_s * (E4 + g_s * E5)))), 1 - tl.exp(g_s))
            w_s = w_s * tl.exp(ref[None, :] - b_s)
            acc = tl.dot(a.to(DT).to(MT), w_s.to(DT).to(MT), acc, input_precision=PREC)
        out = acc * tl.exp(b_r - ref[None, :])
        a = tl.zeros([BC, BC], dtype=tl.float32)  # the diagonal sub-block
        for d0 in tl.static_range(0, D, BD):
            x = tl.load(X + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
            y = tl.load(Y + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
            a = tl.dot(x.to(DT).to(MT), tl.trans(y).to(DT).to(MT), a, input_precision=PREC)
        w_r = tl.where(g_r > -0.1, -g_r * (1 + g_r * (0.5 + g_r * (E3 + g_r * (E4 + g_r * E5)))), 1 - tl.exp(g_r))
        if DIAG_LOOP:
            for s in range(BC):
                sel = idx[:, None] == s
                b_row = tl.sum(tl.where(sel, b_r, 0.0), 0)
                decay = tl.exp(tl.where(idx[:, None] >= s, b_r - b_row[None, :], float("-inf")))
                a_s = tl.sum(tl.where(idx[None, :] == s, a, 0.0), 1)
                out += a_s[:, None] * tl.sum(tl.where(sel, w_r, 0.0), 0)[None, :] * decay
        else:
            decay = tl.exp(tl.where(tri[:, :, None], b_r[:, None, :] - b_r[None, :, :], float("-inf")))
            out += tl.sum(a[:, :, None] * w_r[None, :, :] * decay, 1)
        tl.store(OUT + row_r[:, None] * M + offs_m[None, :], out * scale, mask=ok_r[:, None])


@triton.jit
def _write_kernel(Y, U, Z, DP, G, HS, OUT, T, H, NT, scale, MODE: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, DIAG_LOOP: tl.constexpr, DT: tl.constexpr,
                  MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, D]`` (OUT's dtype): ``(u_r exp(b_r)) H0 + sum_{s<=r} <u_r, s_s exp(b_r - b_s)> y_s``, u from
    ``_load_u`` in MODE. Grid (NT, D/BD, B*H). Output o (u = p, y = v, H0 = hv) and dq (u = e, y = k, H0 = hk)."""
    n = tl.program_id(0)
    i_d = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    NC: tl.constexpr = C // BC
    idx = tl.arange(0, BC)
    tri = idx[:, None] >= idx[None, :]
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    h0 = tl.load(HS + (bh.to(tl.int64) * (NT + 1) + n) * M * D + offs_m[:, None] * D + offs_d[None, :])
    t_c = n * C + offs_c
    row_c = (b * T + t_c).to(tl.int64) * H + h
    g_chunk = tl.load(G + row_c[:, None] * M + offs_m[None, :], mask=(t_c < T)[:, None], other=0.0)
    for R in tl.static_range(NC):
        t_r = n * C + R * BC + idx
        ok_r = t_r < T
        row_r = (b * T + t_r).to(tl.int64) * H + h
        ref = tl.sum(tl.where(offs_c[:, None] < R * BC, g_chunk, 0.0), 0)
        g_r = tl.load(G + row_r[:, None] * M + offs_m[None, :], mask=ok_r[:, None], other=0.0)
        b_r = ref[None, :] + tl.cumsum(g_r, 0)
        u_r = _load_u(U, Z, DP, row_r, ok_r, scale, M, MODE)
        acc = tl.zeros([BC, BD], dtype=tl.float32)
        acc = tl.dot((u_r * tl.exp(b_r)).to(DT).to(MT), h0.to(DT).to(MT), acc, input_precision=PREC)
        u_q = u_r * tl.exp(b_r - ref[None, :])
        for S in tl.static_range(R):
            t_s = n * C + S * BC + idx
            ok_s = t_s < T
            row_s = (b * T + t_s).to(tl.int64) * H + h
            g_s = tl.load(G + row_s[:, None] * M + offs_m[None, :], mask=ok_s[:, None], other=0.0)
            b_s = tl.sum(tl.where(offs_c[:, None] < S * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_s, 0)
            w_s = tl.where(g_s > -0.1, -g_s * (1 + g_s * (0.5 + g_s * (E3 + g_s * (E4 + g_s * E5)))), 1 - tl.exp(g_s))
            w_s = w_s * tl.exp(ref[None, :] - b_s)
            a = tl.zeros([BC, BC], dtype=tl.float32)
            a = tl.dot(u_q.to(DT).to(MT), tl.trans(w_s).to(DT).to(MT), a, input_precision=PREC)
            y = tl.load(Y + row_s[:, None] * D + offs_d[None, :], mask=ok_s[:, None], other=0.0)
            acc = tl.dot(a.to(DT).to(MT), y.to(DT).to(MT), acc, input_precision=PREC)
        w_r = tl.where(g_r > -0.1, -g_r * (1 + g_r * (0.5 + g_r * (E3 + g_r * (E4 + g_r * E5)))), 1 - tl.exp(g_r))
        if DIAG_LOOP:
            a = tl.zeros([BC, BC], dtype=tl.float32)
            for s in range(BC):
                sel = idx[:, None] == s
                b_row = tl.sum(tl.where(sel, b_r, 0.0), 0)
                decay = tl.exp(tl.where(idx[:, None] >= s, b_r - b_row[None, :], float("-inf")))
                col = tl.sum(u_r * tl.sum(tl.where(sel, w_r, 0.0), 0)[None, :] * decay, 1)
                a += tl.where(idx[None, :] == s, col[:, None], 0.0)
        else:
            decay = tl.exp(tl.where(tri[:, :, None], b_r[:, None, :] - b_r[None, :, :], float("-inf")))
            a = tl.sum(u_r[:, None, :] * w_r[None, :, :] * decay, 2)
        y = tl.load(Y + row_r[:, None] * D + offs_d[None, :], mask=ok_r[:, None], other=0.0)
        acc = tl.dot(a.to(DT).to(MT), y.to(DT).to(MT), acc, input_precision=PREC)
        tl.store(OUT + row_r[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty), mask=ok_r[:, None])


@triton.jit
def _write_rev_kernel(X, U, Z, DP, G, DHS, OUT, T, H, NT, scale, MODE: tl.constexpr, M: tl.constexpr,
                      D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, DIAG_LOOP: tl.constexpr,
                      DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, D]``: ``(s_r exp(bt - b_r)) dH + sum_{t>=r} <u_t, s_r exp(b_t - b_r)> x_t``, the gradient of
    the written rows. Grid (NT, D/BD, B*H). dv (u = p, x = dO, dH = dhv) and dk (u = e, x = q, dH = dhk)."""
    n = tl.program_id(0)
    i_d = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    NC: tl.constexpr = C // BC
    idx = tl.arange(0, BC)
    tri = idx[:, None] >= idx[None, :]
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = i_d * BD + tl.arange(0, BD)
    dh = tl.load(DHS + (bh.to(tl.int64) * NT + n) * M * D + offs_m[:, None] * D + offs_d[None, :])
    t_c = n * C + offs_c
    row_c = (b * T + t_c).to(tl.int64) * H + h
    g_chunk = tl.load(G + row_c[:, None] * M + offs_m[None, :], mask=(t_c < T)[:, None], other=0.0)
    total = tl.sum(g_chunk, 0)
    for R in tl.static_range(NC):
        t_r = n * C + R * BC + idx
        ok_r = t_r < T
        row_r = (b * T + t_r).to(tl.int64) * H + h
        ref = tl.sum(tl.where(offs_c[:, None] < R * BC + BC, g_chunk, 0.0), 0)  # cumsum at the end of sub-chunk R
        g_r = tl.load(G + row_r[:, None] * M + offs_m[None, :], mask=ok_r[:, None], other=0.0)
        b_r = tl.sum(tl.where(offs_c[:, None] < R * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_r, 0)
        w_r = tl.where(g_r > -0.1, -g_r * (1 + g_r * (0.5 + g_r * (E3 + g_r * (E4 + g_r * E5)))), 1 - tl.exp(g_r))
        acc = tl.zeros([BC, BD], dtype=tl.float32)
        acc = tl.dot((w_r * tl.exp(total[None, :] - b_r)).to(DT).to(MT), dh.to(DT).to(MT), acc, input_precision=PREC)
        w_k = w_r * tl.exp(ref[None, :] - b_r)
        for S in tl.static_range(R + 1, NC):  # later sub-chunks: exp(b_t - b_r) = exp(b_t - ref) exp(ref - b_r)
            t_s = n * C + S * BC + idx
            ok_s = t_s < T
            row_s = (b * T + t_s).to(tl.int64) * H + h
            g_s = tl.load(G + row_s[:, None] * M + offs_m[None, :], mask=ok_s[:, None], other=0.0)
            b_s = tl.sum(tl.where(offs_c[:, None] < S * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_s, 0)
            u_s = _load_u(U, Z, DP, row_s, ok_s, scale, M, MODE) * tl.exp(b_s - ref[None, :])
            a = tl.zeros([BC, BC], dtype=tl.float32)
            a = tl.dot(w_k.to(DT).to(MT), tl.trans(u_s).to(DT).to(MT), a, input_precision=PREC)  # [r, t]
            x = tl.load(X + row_s[:, None] * D + offs_d[None, :], mask=ok_s[:, None], other=0.0)
            acc = tl.dot(a.to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        u_r = _load_u(U, Z, DP, row_r, ok_r, scale, M, MODE)
        if DIAG_LOOP:
            a = tl.zeros([BC, BC], dtype=tl.float32)
            for t in range(BC):
                sel = idx[:, None] == t
                b_t = tl.sum(tl.where(sel, b_r, 0.0), 0)
                decay = tl.exp(tl.where(idx[:, None] <= t, b_t[None, :] - b_r, float("-inf")))
                col = tl.sum(w_r * tl.sum(tl.where(sel, u_r, 0.0), 0)[None, :] * decay, 1)
                a += tl.where(idx[None, :] == t, col[:, None], 0.0)
        else:  # [r, t, m] with t >= r
            decay = tl.exp(tl.where(tri.T[:, :, None], b_r[None, :, :] - b_r[:, None, :], float("-inf")))
            a = tl.sum(w_r[:, None, :] * u_r[None, :, :] * decay, 2)
        x = tl.load(X + row_r[:, None] * D + offs_d[None, :], mask=ok_r[:, None], other=0.0)
        acc = tl.dot(a.to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
        tl.store(OUT + row_r[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty), mask=ok_r[:, None])


@triton.jit
def _ds_block(X, Y, Z, DP, G, dh, g_chunk, total, n, R: tl.constexpr, b, h, T, H, scale, MODE: tl.constexpr,
              M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, BC: tl.constexpr,
              DIAG_LOOP: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """dL/ds of one pass for the rows of sub-chunk R, ``[BC, M]``:
    ``exp(bt - b_r) (dH y_r) + sum_{t>=r} (x_t . y_r) u_t exp(b_t - b_r)``; dh points at ``DHS[bh, n] [M, D]``."""
    NC: tl.constexpr = C // BC
    idx = tl.arange(0, BC)
    tri = idx[:, None] >= idx[None, :]
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, BD)
    t_r = n * C + R * BC + idx
    ok_r = t_r < T
    row_r = (b * T + t_r).to(tl.int64) * H + h
    ref = tl.sum(tl.where(offs_c[:, None] < R * BC + BC, g_chunk, 0.0), 0)
    g_r = tl.load(G + row_r[:, None] * M + offs_m[None, :], mask=ok_r[:, None], other=0.0)
    b_r = tl.sum(tl.where(offs_c[:, None] < R * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_r, 0)
    acc = tl.zeros([BC, M], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BD):
        y = tl.load(Y + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
        dht = tl.trans(tl.load(dh + offs_m[:, None] * D + d0 + offs_d[None, :]))
        acc = tl.dot(y.to(DT).to(MT), dht.to(DT).to(MT), acc, input_precision=PREC)
    acc = acc * tl.exp(total - ref)[None, :]
    for S in tl.static_range(R + 1, NC):
        t_s = n * C + S * BC + idx
        ok_s = t_s < T
        row_s = (b * T + t_s).to(tl.int64) * H + h
        a = tl.zeros([BC, BC], dtype=tl.float32)
        for d0 in tl.static_range(0, D, BD):
            y = tl.load(Y + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
            x = tl.load(X + row_s[:, None] * D + d0 + offs_d[None, :], mask=ok_s[:, None], other=0.0)
            a = tl.dot(y.to(DT).to(MT), tl.trans(x).to(DT).to(MT), a, input_precision=PREC)  # [r, t]
        g_s = tl.load(G + row_s[:, None] * M + offs_m[None, :], mask=ok_s[:, None], other=0.0)
        b_s = tl.sum(tl.where(offs_c[:, None] < S * BC, g_chunk, 0.0), 0)[None, :] + tl.cumsum(g_s, 0)
        u_s = _load_u(G, Z, DP, row_s, ok_s, scale, M, MODE) * tl.exp(b_s - ref[None, :])
        acc = tl.dot(a.to(DT).to(MT), u_s.to(DT).to(MT), acc, input_precision=PREC)
    out = acc * tl.exp(ref[None, :] - b_r)
    a = tl.zeros([BC, BC], dtype=tl.float32)
    for d0 in tl.static_range(0, D, BD):
        y = tl.load(Y + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
        x = tl.load(X + row_r[:, None] * D + d0 + offs_d[None, :], mask=ok_r[:, None], other=0.0)
        a = tl.dot(y.to(DT).to(MT), tl.trans(x).to(DT).to(MT), a, input_precision=PREC)
    u_r = _load_u(G, Z, DP, row_r, ok_r, scale, M, MODE)
    if DIAG_LOOP:
        for t in range(BC):
            sel = idx[:, None] == t
            b_t = tl.sum(tl.where(sel, b_r, 0.0), 0)
            decay = tl.exp(tl.where(idx[:, None] <= t, b_t[None, :] - b_r, float("-inf")))
            a_t = tl.sum(tl.where(idx[None, :] == t, a, 0.0), 1)
            out += a_t[:, None] * tl.sum(tl.where(sel, u_r, 0.0), 0)[None, :] * decay
    else:  # [r, t, m] with t >= r
        decay = tl.exp(tl.where(tri.T[:, :, None], b_r[None, :, :] - b_r[:, None, :], float("-inf")))
        out += tl.sum(a[:, :, None] * u_r[None, :, :] * decay, 1)
    return out


@triton.jit
def _dgate_kernel(Q, K, V, DO, Z, DP, G, HSK, HSV, DHSK, DHSV, DG, T, H, NT, scale, M: tl.constexpr,
                  DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, C: tl.constexpr, BC: tl.constexpr,
                  DIAG_LOOP: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``DG [B, T, H, M]`` float32, the gradient w.r.t. log alpha. Grid (NT, B*H).

    With B_t the global cumsum of g, ``dL/dB_t = z dz + p dp - s (ds1 + ds2)`` (reader minus writer terms of both
    passes; ``z dz`` = pass-1 output times its gradient), and ``dg_t = sum_{t'>=t} dL/dB_t' - exp(g_t)(ds1 + ds2)``.
    The suffix sum runs in registers within the chunk (last sub-chunk first); the part from later chunks is
    ``sum_d dH_end * H_end`` over both passes (shifting every later B by the same amount scales the chunk-end state
    as the future sees it), read from DHS[n] and HS[n + 1], so no sequential pass over T is needed.
    """
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    NC: tl.constexpr = C // BC
    idx = tl.arange(0, BC)
    offs_c = tl.arange(0, C)
    offs_m = tl.arange(0, M)
    offs_d = tl.arange(0, BD)
    t_c = n * C + offs_c
    row_c = (b * T + t_c).to(tl.int64) * H + h
    g_chunk = tl.load(G + row_c[:, None] * M + offs_m[None, :], mask=(t_c < T)[:, None], other=0.0)
    total = tl.sum(g_chunk, 0)
    dhk = DHSK + (bh.to(tl.int64) * NT + n) * M * DK
    dhv = DHSV + (bh.to(tl.int64) * NT + n) * M * DV
    hk_end = HSK + (bh.to(tl.int64) * (NT + 1) + n + 1) * M * DK
    hv_end = HSV + (bh.to(tl.int64) * (NT + 1) + n + 1) * M * DV
    later = tl.zeros([M], dtype=tl.float32)
    for d0 in tl.static_range(0, DK, BD):
        tile = offs_m[:, None] * DK + d0 + offs_d[None, :]
        later += tl.sum(tl.load(dhk + tile) * tl.load(hk_end + tile), 1)
    for d0 in tl.static_range(0, DV, BD):
        tile = offs_m[:, None] * DV + d0 + offs_d[None, :]
        later += tl.sum(tl.load(dhv + tile) * tl.load(hv_end + tile), 1)
    for R in tl.static_range(NC - 1, -1, -1):  # last sub-chunk first
        ds = _ds_block(Q, K, Z, DP, G, dhk, g_chunk, total, n, R, b, h, T, H, scale, 2, M, DK, BD, C, BC, DIAG_LOOP,
                       DT, MT, PREC)  # fmt: skip
        ds += _ds_block(DO, V, Z, DP, G, dhv, g_chunk, total, n, R, b, h, T, H, scale, 1, M, DV, BD, C, BC,
                        DIAG_LOOP, DT, MT, PREC)  # fmt: skip
        t_r = n * C + R * BC + idx
        ok_r = t_r < T
        row_r = (b * T + t_r).to(tl.int64) * H + h
        offs = row_r[:, None] * M + offs_m[None, :]
        g_r = tl.load(G + offs, mask=ok_r[:, None], other=0.0)
        z = tl.load(Z + offs, mask=ok_r[:, None], other=0.0)
        dp = tl.load(DP + offs, mask=ok_r[:, None], other=0.0)
        ez = tl.exp(z - tl.max(z, 1)[:, None])
        p = ez / tl.sum(ez, 1)[:, None]
        dz = p * (dp - tl.sum(p * dp, 1)[:, None])
        w_r = tl.where(g_r > -0.1, -g_r * (1 + g_r * (0.5 + g_r * (E3 + g_r * (E4 + g_r * E5)))), 1 - tl.exp(g_r))
        db = tl.where(ok_r[:, None], z * dz + p * dp - w_r * ds, 0.0)
        db_sum = tl.sum(db, 0)
        suffix = later[None, :] + tl.cumsum(db, 0, reverse=True)  # sum over t' >= r of dL/dB_t'
        later += db_sum
        tl.store(DG + offs, suffix - tl.exp(g_r) * ds, mask=ok_r[:, None])
