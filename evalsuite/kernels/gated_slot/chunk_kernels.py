"""The five per-chunk Triton kernels of chunked GSA (the two sequential state scans: :mod:`.state_kernels`).

Notation (per batch b and head h, chunk n of C rows, sub-chunks of BC rows): ``g`` = log alpha ``[., M]`` float32,
``b_r`` = inclusive cumsum of g from the chunk start to row r, ``bt`` = the chunk total, ``s = 1 - exp(g)``.
States are slot-major ``[M, D]`` float32: ``H_t = diag(exp g_t) H_{t-1} + s_t x_t^T`` with x = k (pass 1, D = dk)
or x = v (pass 2, D = dv). Buffers (all contiguous):

* ``HS [B*H, NT + 1, M, D]``: the state at the start of every chunk, and the final state at index NT.
* ``DHS [B*H, NT, M, D]``: the adjoint of the state at the end of chunk n (from later chunks and the final state).
* ``Z, DP [B, T, H, M]`` float32: pass-1 logits ``scale * hk^T q`` and ``dL/dp``.

The per-chunk kernels, one program per (chunk, slot or d tile, batch*head), all built from ``[C, C]``, ``[C, BM]``
and ``[C, BD]`` tiles multiplied with ``tl.dot`` (tensor cores for bf16/fp16). The gate acts on each slot alone,
so the kernels whose output is over the slots (read, dgate) take BM of them per program, and those that sum over
the slots (pair, write, write_rev) loop over them BM at a time (whole-m tiles spill kilobytes of registers):

* :func:`_read_kernel` (output over m, contraction over d):
  ``out_r = scale * [exp(b_r) (H0 x_r) + sum_{s<=r} (x_r . y_s) s_s exp(b_r - b_s)]``.
  Pass-1 logits z (x=q, y=k, H0=hk) and ``dp`` (x=dO, y=v, H0=hv).
* :func:`_pair_kernel` (one program per chunk): the pair matrix ``A[r, s] = <u_r, s_s exp(b_r - b_s)>``, s <= r,
  ``A [B*H, NT, C, C]`` float32, for u = p (forward, kept for dv) and u = e (backward, for dq and dk).
* :func:`_write_kernel` (output over a d tile, contraction over m): ``out_r = (u_r exp(b_r)) H0 + (A y)_r``.
  Output o (u=p, y=v, H0=hv) and dq (u=e, y=k, H0=hk).
* :func:`_write_rev_kernel`: ``out_r = (s_r exp(bt - b_r)) dH + (A^T x)_r``.
  dv (A of p, x=dO, dH=dhv) and dk (A of e, x=q, dH=dhk).
* :func:`_dgate_kernel`: ``ds_r = exp(bt - b_r) (dH y_r) + sum_{t>=r} (x_t . y_r) u_t exp(b_t - b_r)`` for both
  passes (x,y,u = q,k,e and dO,v,p), then the log-gate gradient (see the kernel).

In-chunk decays (the slot dimension m carries the gate, so ``exp(b_r - b_s)`` cannot be folded into one operand
of a single product) nest over three levels: the chunk's sub-chunks of BC rows, each sub-chunk's micro-blocks of
``MICRO`` = 4 rows, and the rows of a micro-block. A pair of rows first separated at a level goes through tl.dot
with its decay factored at the start of the later row's block at that level:
``exp(b_r - b_s) = exp(l_r) * exp(ref - b_s)`` for s < r, with ``l_r`` the log-gate cumsum restarted at the start of
r's block (``l_sub``, ``l_mic``) and ``ref`` the cumsum at the row before that block (``common._earlier_factor``);
both factors are ``<= 1``. Read and the pair matrix (s < r) apply ``exp(l_r)`` to the output rows or the row
operand (``_pair_weights``); ds (t > r) the same identity with the roles
swapped (``exp(l_t)`` on the later row t, the reference factor on r). Pairs inside one micro-block take
``exp(l_mic_r) * exp(-l_mic_s)``: ``-l_mic_s`` sums at most 3 gates clamped at -20, so the larger factor is
``<= e^60``, inside float32's range. Per chunk of 64 with BC = 16: 3 + 3 + 1 products of ``[C, C] x [C, .]``
tiles with the non-pairs masked to 0 (the rows outside the block, or the result), each factor a few exps over a
``[C, BM]`` tile; no loops over rows.

Every exponent is ``<= 0`` but the in-micro-block one (``<= 60``) for any log alpha, so the kernels are exact for
saturated gates (``test_extreme_gates_exact``); factoring a decay at a row inside a block instead overflows to NaN
beyond log alpha ~ -11 per token (results/bench/h100/gsa-kernel-fix/ at commit 164742b). The pair matrix A is formed
once per chunk and pass by :func:`_pair_kernel` and read by both write kernels. fp16 operands take float32 (tf32) in
the gate-scaled products (``common.dot_flags(gated=True)``): fp16 would flush the small factors.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.common import (
    G_FLOOR,
    MICRO,
    _earlier_factor,
    _earlier_sub_factor,
    _load_gates,
    _local_cumsum,
    _softmax_stats,
    _sub_chunk_refs,
    _u_tile,
    _write_strength,
)

# The kernels take the constexprs of common.dot_flags for their products: DT, MT, PREC for the plain ones, GT, GMT,
# GPREC for the gate-scaled ones (read, pair, dgate); see there for the tl.dot idiom.

# ----------------------------------------------------------------------------------------------------------------
# Per-chunk kernels. ``rows`` = chunk-local row index; ``bc [C, BM]`` the in-chunk cumsum of g over a tile of BM
# slots (the gate acts on each slot alone, so the slot dimension tiles freely). Decays nest over three levels (module
# docstring): sub-chunks of BC rows in the chunk, micro-blocks of MICRO rows in a sub-chunk, rows in a micro-block;
# ``l_sub`` / ``l_mic`` are the cumsums of g restarted at every sub-chunk / micro-block.
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _chunk_gates(G, row, ok, offs_m, C: tl.constexpr, BC: tl.constexpr, M: tl.constexpr, BM: tl.constexpr):
    """``(bc, l_sub, l_mic, s)`` of one chunk and the slots offs_m, float32 ``[C, BM]``: the inclusive cumsums of
    the log gates (0 past T) from the chunk's, each sub-chunk's and each micro-block's start, and the write strength
    ``s = -expm1(g)``."""
    g = _load_gates(G, row, ok, offs_m, M)
    return tl.cumsum(g, 0), _local_cumsum(g, C, BC, BM), _local_cumsum(g, C, MICRO, BM), _write_strength(g)


@triton.jit
def _same_block(rows, S: tl.constexpr):
    """``[C, C]``: rows r and s lie in one block of S rows."""
    return rows[:, None] // S == rows[None, :] // S


@triton.jit
def _pair_weights(a, u, w, bc, l_sub, l_mic, rows, C: tl.constexpr, BC: tl.constexpr, BM: tl.constexpr,
                  GT: tl.constexpr, GMT: tl.constexpr, GPREC: tl.constexpr):  # fmt: skip
    """``a [C, C]`` plus one slot tile's ``<u_r, s_s exp(b_r - b_s)>`` for s <= r (0 above the diagonal), the three
    levels as in _read_kernel with ``exp(l_r)`` on u (``_pair_kernel``; write contracts it, write_rev its transpose)."""
    sub = rows // BC
    u_sub = u * tl.exp(l_sub)
    for j in tl.static_range(1, C // BC):
        col = w * _earlier_factor(bc, rows, j, C, C, BC, BM)
        u_j = tl.where((sub == j)[:, None], u_sub, 0.0)
        a = tl.dot(u_j.to(GT).to(GMT), tl.trans(col).to(GT).to(GMT), a, input_precision=GPREC)
    u_mic = u * tl.exp(l_mic)
    for j in tl.static_range(1, BC // MICRO):
        col = w * _earlier_factor(l_sub, rows, j, C, BC, MICRO, BM)
        u_j = tl.where(((rows % BC) // MICRO == j)[:, None], u_mic, 0.0)
        a_j = tl.dot(u_j.to(GT).to(GMT), tl.trans(col).to(GT).to(GMT), input_precision=GPREC)
        a += tl.where(_same_block(rows, BC), a_j, 0.0)
    col = tl.where((rows % MICRO < MICRO - 1)[:, None], w * tl.exp(-l_mic), 0.0)
    a_j = tl.dot(u_mic.to(GT).to(GMT), tl.trans(col).to(GT).to(GMT), input_precision=GPREC)
    a += tl.where(_same_block(rows, MICRO) & (rows[None, :] < rows[:, None]), a_j, 0.0)
    return a + tl.where(rows[None, :] == rows[:, None], tl.sum(u * w, 1)[:, None], 0.0)  # s = r


@triton.jit
def _read_kernel(X, Y, G, HS, OUT, T, H, NT, scale, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                 BM: tl.constexpr, C: tl.constexpr, BC: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                 PREC: tl.constexpr, GT: tl.constexpr, GMT: tl.constexpr, GPREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, M]`` float32: ``scale * [exp(b_r) (H0 x_r) + sum_{s<=r} (x_r . y_s) s_s exp(b_r - b_s)]``.
    Grid (NT, M/BM, B*H), a tile of BM slots each. Pass-1 logits (x=q, y=k, H0 = hk) and dp (x=dO, y=v, H0 = hv,
    scale 1)."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    n = tl.program_id(0)
    i_m = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, C)
    offs_m = i_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    t = n * C + rows
    ok = t < T
    row = (b * T + t).to(tl.int64) * H + h
    a = tl.zeros([C, C], dtype=tl.float32)  # x_r . y_s
    for d0 in tl.static_range(0, D, BD):
        x = tl.load(X + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        y = tl.load(Y + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        a = tl.dot(x, tl.trans(y), a, input_precision=PREC)
    bc, l_sub, l_mic, w = _chunk_gates(G, row, ok, offs_m, C, BC, M, BM)
    sub = rows // BC
    refs = _sub_chunk_refs(G, b, n, h, T, H, offs_m, C, BC, M)
    # s in an earlier sub-chunk than r: exp(b_r - b_s) = exp(l_sub_r) * exp(b at the row before r's sub-chunk - b_s)
    acc_sub = tl.zeros([C, BM], dtype=tl.float32)
    for j in tl.static_range(1, C // BC):
        col = w * _earlier_sub_factor(refs, bc, rows, j, C, BC)
        a_j = tl.where((sub == j)[:, None], a, 0.0)
        acc_sub = tl.dot(a_j.to(GT).to(GMT), col.to(GT).to(GMT), acc_sub, input_precision=GPREC)
    # s in r's sub-chunk, an earlier micro-block; then s < r in r's micro-block: both take exp(l_mic_r) out
    acc_mic = tl.zeros([C, BM], dtype=tl.float32)
    for j in tl.static_range(1, BC // MICRO):
        col = w * _earlier_factor(l_sub, rows, j, C, BC, MICRO, BM)
        a_j = tl.where(((rows % BC) // MICRO == j)[:, None] & _same_block(rows, BC), a, 0.0)
        acc_mic = tl.dot(a_j.to(GT).to(GMT), col.to(GT).to(GMT), acc_mic, input_precision=GPREC)
    col = tl.where((rows % MICRO < MICRO - 1)[:, None], w * tl.exp(-l_mic), 0.0)  # exp(-l_mic_s) <= e^60 for s < r
    a_j = tl.where(_same_block(rows, MICRO) & (rows[None, :] < rows[:, None]), a, 0.0)
    acc_mic = tl.dot(a_j.to(GT).to(GMT), col.to(GT).to(GMT), acc_mic, input_precision=GPREC)
    acc = acc_sub * tl.exp(l_sub) + acc_mic * tl.exp(l_mic)
    acc += tl.sum(tl.where(rows[None, :] == rows[:, None], a, 0.0), 1)[:, None] * w  # s = r
    hs = HS + (bh.to(tl.int64) * (NT + 1) + n) * M * D
    inter = tl.zeros([C, BM], dtype=tl.float32)  # x_r . H0 (the chunk-start state)
    for d0 in tl.static_range(0, D, BD):
        x = tl.load(X + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        h0 = tl.load(hs + offs_m[:, None] * D + d0 + offs_d[None, :]).to(DT).to(MT)
        inter = tl.dot(x, tl.trans(h0), inter, input_precision=PREC)
    out = (acc + tl.exp(bc) * inter) * scale
    tl.store(OUT + row[:, None] * M + offs_m[None, :], out, mask=ok[:, None])


@triton.jit
def _pair_offsets(bh, n, NT, rows, C: tl.constexpr):
    """``[C, C]`` offsets of chunk n's pair matrix in ``A [B*H, NT, C, C]`` (written by the pair kernel, read by
    write and write_rev)."""
    return (bh.to(tl.int64) * NT + n) * C * C + rows[:, None] * C + rows[None, :]


@triton.jit
def _pair_kernel(Z, DP, G, A, T, H, NT, scale, MODE: tl.constexpr, M: tl.constexpr, BM: tl.constexpr,
                 C: tl.constexpr, BC: tl.constexpr, GT: tl.constexpr, GMT: tl.constexpr,
                 GPREC: tl.constexpr):  # fmt: skip
    """``A [B*H, NT, C, C]`` float32: each chunk's pair matrix ``A[r, s] = <u_r, s_s exp(b_r - b_s)>`` for s <= r (0
    above the diagonal), u from ``_u_tile`` in MODE, the slots summed BM at a time. Grid (NT, B*H). Formed once per
    chunk and pass, then contracted by the write kernels (o, dq: ``A y``) and, transposed, write_rev (dv, dk:
    ``A^T x``), instead of once per d tile in each of them."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    n = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, C)
    t = n * C + rows
    ok = t < T
    row = (b * T + t).to(tl.int64) * H + h
    zmax, zsum, pdp = _softmax_stats(Z, DP, row, ok, M, BM, MODE)
    a = tl.zeros([C, C], dtype=tl.float32)
    for m0 in tl.range(0, M, BM):
        offs_m = m0 + tl.arange(0, BM)
        bc, l_sub, l_mic, w = _chunk_gates(G, row, ok, offs_m, C, BC, M, BM)
        u = _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, offs_m, M, MODE)
        a = _pair_weights(a, u, w, bc, l_sub, l_mic, rows, C, BC, BM, GT, GMT, GPREC)
    tl.store(A + _pair_offsets(bh, n, NT, rows, C), a)


@triton.jit
def _write_kernel(Y, Z, DP, G, HS, A, OUT, T, H, NT, scale, MODE: tl.constexpr, M: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr, BM: tl.constexpr, C: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                  PREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, D]`` (OUT's dtype): ``(u_r exp(b_r)) H0 + (A y)_r``, u from ``_u_tile`` in MODE, A from
    ``_pair_kernel`` in the same MODE. Grid (NT, D/BD, B*H); the slots are summed BM at a time. Output o (u = p,
    y = v, H0 = hv) and dq (u = e, y = k, H0 = hk)."""
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    n = tl.program_id(0)
    i_d = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, C)
    offs_d = i_d * BD + tl.arange(0, BD)
    t = n * C + rows
    ok = t < T
    row = (b * T + t).to(tl.int64) * H + h
    zmax, zsum, pdp = _softmax_stats(Z, DP, row, ok, M, BM, MODE)
    hs = HS + (bh.to(tl.int64) * (NT + 1) + n) * M * D
    acc = tl.zeros([C, BD], dtype=tl.float32)
    for m0 in tl.range(0, M, BM):
        offs_m = m0 + tl.arange(0, BM)
        g = _load_gates(G, row, ok, offs_m, M)
        u = _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, offs_m, M, MODE)
        h0 = tl.load(hs + offs_m[:, None] * D + offs_d[None, :])
        acc = tl.dot((u * tl.exp(tl.cumsum(g, 0))).to(DT).to(MT), h0.to(DT).to(MT), acc, input_precision=PREC)
    a = tl.load(A + _pair_offsets(bh, n, NT, rows, C))
    y = tl.load(Y + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
    acc = tl.dot(a.to(DT).to(MT), y.to(DT).to(MT), acc, input_precision=PREC)
    tl.store(OUT + row[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _write_rev_kernel(X, G, DHS, A, OUT, T, H, NT, M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr,
                      BM: tl.constexpr, C: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr,
                      PREC: tl.constexpr):  # fmt: skip
    """``OUT [B, T, H, D]``: ``(s_r exp(bt - b_r)) dH + (A^T x)_r``, the gradient of the written rows, A from
    ``_pair_kernel`` (``A[t, r] = <u_t, s_r exp(b_t - b_r)>``). Grid (NT, D/BD, B*H); the slots are summed BM at a
    time. dv (A of u = p, x = dO, dH = dhv) and dk (A of u = e, x = q, dH = dhk)."""
    n = tl.program_id(0)
    i_d = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, C)
    offs_d = i_d * BD + tl.arange(0, BD)
    t = n * C + rows
    ok = t < T
    row = (b * T + t).to(tl.int64) * H + h
    dhs = DHS + (bh.to(tl.int64) * NT + n) * M * D
    acc = tl.zeros([C, BD], dtype=tl.float32)
    for m0 in tl.range(0, M, BM):
        offs_m = m0 + tl.arange(0, BM)
        g = _load_gates(G, row, ok, offs_m, M)
        bc = tl.cumsum(g, 0)
        bt = tl.sum(g, 0)  # g = 0 past T, so this is b at the chunk's last row
        dh = tl.load(dhs + offs_m[:, None] * D + offs_d[None, :])
        carried = _write_strength(g) * tl.exp(bt[None, :] - bc)  # s_r exp(bt - b_r): row r's write at the chunk end
        acc = tl.dot(carried.to(DT).to(MT), dh.to(DT).to(MT), acc, input_precision=PREC)
    a = tl.load(A + _pair_offsets(bh, n, NT, rows, C))
    x = tl.load(X + row[:, None] * D + offs_d[None, :], mask=ok[:, None], other=0.0)
    acc = tl.dot(tl.trans(a).to(DT).to(MT), x.to(DT).to(MT), acc, input_precision=PREC)
    tl.store(OUT + row[:, None] * D + offs_d[None, :], acc.to(OUT.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _ds_pass(X, Y, dh, Z, DP, zmax, zsum, pdp, bc, l_sub, l_mic, bt, row, ok, offs_m, scale, MODE: tl.constexpr,
             M: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, C: tl.constexpr,
             BC: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr, GT: tl.constexpr,
             GMT: tl.constexpr, GPREC: tl.constexpr):  # fmt: skip
    """dL/ds of one pass for the rows of a chunk and the slots offs_m, ``[C, BM]``:
    ``exp(bt - b_r) (dH y_r) + sum_{t>=r} (x_t . y_r) u_t exp(b_t - b_r)``, u from ``_u_tile`` in MODE; dh points
    at ``DHS[bh, n] [M, D]``."""
    rows = tl.arange(0, C)
    sub = rows // BC
    offs_d = tl.arange(0, BD)
    u = _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, offs_m, M, MODE)
    a = tl.zeros([C, C], dtype=tl.float32)  # [r, t]: y_r . x_t
    for d0 in tl.static_range(0, D, BD):
        y = tl.load(Y + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        x = tl.load(X + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        a = tl.dot(y, tl.trans(x), a, input_precision=PREC)
    # t in child block j, r before it: the row factor exp(b before child j - b_r) (0 for other rows) after the dot
    acc = tl.sum(tl.where(rows[None, :] == rows[:, None], a, 0.0), 1)[:, None] * u  # t = r
    u_sub = u * tl.exp(l_sub)
    for j in tl.static_range(1, C // BC):
        u_j = tl.where((sub == j)[:, None], u_sub, 0.0)
        part = tl.dot(a.to(GT).to(GMT), u_j.to(GT).to(GMT), input_precision=GPREC)
        acc += _earlier_factor(bc, rows, j, C, C, BC, BM) * part
    u_mic = u * tl.exp(l_mic)
    a_sub = tl.where(_same_block(rows, BC), a, 0.0).to(GT).to(GMT)
    for j in tl.static_range(1, BC // MICRO):
        u_j = tl.where(((rows % BC) // MICRO == j)[:, None], u_mic, 0.0)
        part = tl.dot(a_sub, u_j.to(GT).to(GMT), input_precision=GPREC)
        acc += _earlier_factor(l_sub, rows, j, C, BC, MICRO, BM) * part
    a_j = tl.where(_same_block(rows, MICRO) & (rows[:, None] < rows[None, :]), a, 0.0)
    part = tl.dot(a_j.to(GT).to(GMT), u_mic.to(GT).to(GMT), input_precision=GPREC)
    acc += tl.where((rows % MICRO < MICRO - 1)[:, None], tl.exp(-l_mic), 0.0) * part  # r < t: exp(-l_mic_r) <= e^60
    inter = tl.zeros([C, BM], dtype=tl.float32)  # y_r . dH
    for d0 in tl.static_range(0, D, BD):
        y = tl.load(Y + row[:, None] * D + d0 + offs_d[None, :], mask=ok[:, None], other=0.0).to(DT).to(MT)
        dht = tl.load(dh + offs_m[:, None] * D + d0 + offs_d[None, :]).to(DT).to(MT)
        inter = tl.dot(y, tl.trans(dht), inter, input_precision=PREC)
    return acc + tl.exp(bt[None, :] - bc) * inter


@triton.jit
def _dgate_kernel(Q, K, V, DO, Z, DP, G, HSK, HSV, DHSK, DHSV, DG, T, H, NT, scale, M: tl.constexpr,
                  DK: tl.constexpr, DV: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, C: tl.constexpr,
                  BC: tl.constexpr, DT: tl.constexpr, MT: tl.constexpr, PREC: tl.constexpr, GT: tl.constexpr,
                  GMT: tl.constexpr, GPREC: tl.constexpr):  # fmt: skip
    """``DG [B, T, H, M]`` float32, the gradient w.r.t. log alpha. Grid (NT, M/BM, B*H), a tile of BM slots each.

    With B_t the global cumsum of g, ``dL/dB_t = z dz + p dp - s (ds1 + ds2)`` (reader minus writer terms of both
    passes; ``z dz`` = pass-1 output times its gradient), and ``dg_t = sum_{t'>=t} dL/dB_t' - exp(g_t)(ds1 + ds2)``.
    The suffix sum runs in registers within the chunk (a reversed cumsum); the part from later chunks is
    ``sum_d dH_end * H_end`` over both passes (shifting every later B by the same amount scales the chunk-end state
    as the future sees it), read from DHS[n] and HS[n + 1], so no sequential pass over T is needed.
    """
    scale = tl.cast(scale, tl.float32)  # torch.compile passes Python floats as fp64 (as in forgetting/decode.py)
    n = tl.program_id(0)
    i_m = tl.program_id(1)
    bh = tl.program_id(2)
    b = bh // H
    h = bh % H
    rows = tl.arange(0, C)
    offs_m = i_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    t = n * C + rows
    ok = t < T
    row = (b * T + t).to(tl.int64) * H + h
    dhk = DHSK + (bh.to(tl.int64) * NT + n) * M * DK
    dhv = DHSV + (bh.to(tl.int64) * NT + n) * M * DV
    hk_end = HSK + (bh.to(tl.int64) * (NT + 1) + n + 1) * M * DK
    hv_end = HSV + (bh.to(tl.int64) * (NT + 1) + n + 1) * M * DV
    later = tl.zeros([BM], dtype=tl.float32)
    for d0 in tl.static_range(0, DK, BD):
        tile = offs_m[:, None] * DK + d0 + offs_d[None, :]
        later += tl.sum(tl.load(dhk + tile) * tl.load(hk_end + tile), 1)
    for d0 in tl.static_range(0, DV, BD):
        tile = offs_m[:, None] * DV + d0 + offs_d[None, :]
        later += tl.sum(tl.load(dhv + tile) * tl.load(hv_end + tile), 1)
    bc, l_sub, l_mic, w = _chunk_gates(G, row, ok, offs_m, C, BC, M, BM)
    bt = tl.sum(tl.where(rows[:, None] == C - 1, bc, 0.0), 0)
    # u of pass 1 is e = scale * dz (MODE 2), of pass 2 p (MODE 1); the softmax statistics of MODE 2 include MODE 1's
    zmax, zsum, pdp = _softmax_stats(Z, DP, row, ok, M, BM, 2)
    ds = _ds_pass(Q, K, dhk, Z, DP, zmax, zsum, pdp, bc, l_sub, l_mic, bt, row, ok, offs_m, scale, 2, M, DK, BD, BM,
                  C, BC, DT, MT, PREC, GT, GMT, GPREC)  # fmt: skip
    ds += _ds_pass(DO, V, dhv, Z, DP, zmax, zsum, pdp, bc, l_sub, l_mic, bt, row, ok, offs_m, scale, 1, M, DV, BD,
                   BM, C, BC, DT, MT, PREC, GT, GMT, GPREC)  # fmt: skip
    offs = row[:, None] * M + offs_m[None, :]
    z = tl.load(Z + offs, mask=ok[:, None], other=0.0)
    dp = tl.load(DP + offs, mask=ok[:, None], other=0.0)
    p = _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, offs_m, M, 1)
    dz = p * (dp - pdp[:, None])
    db = tl.where(ok[:, None], z * dz + p * dp - w * ds, 0.0)
    suffix = later[None, :] + tl.cumsum(db, 0, reverse=True)  # sum over t' >= r of dL/dB_t'
    g = tl.load(G + offs, mask=ok[:, None], other=0.0)  # reloaded: kept live over both passes, it spills (sm_90)
    # the clamp's own gradient: 0 where log alpha lies below the floor (as torch.clamp's, which passes g >= floor)
    dg = tl.where(g >= G_FLOOR, suffix - tl.exp(tl.maximum(g, G_FLOOR)) * ds, 0.0)
    tl.store(DG + offs, dg, mask=ok[:, None])
