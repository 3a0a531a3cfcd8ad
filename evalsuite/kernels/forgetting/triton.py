"""Forgetting Attention in Triton: a FlashAttention-2 style forward/backward plus a decode kernel.

Computes exactly the function of :mod:`evalsuite.kernels.forgetting.reference`:

    o_i = sum_{j<=i} exp(s_ij) v_j / sum_{j<=i} exp(s_ij),   s_ij = scale * q_i.k_j + c_i - c_j

with ``c = cumsum(log f)`` (float32, computed by the caller) or no bias at all (``cum=None``, plain causal
attention for the Transformer baselines; the same kernel source with a constexpr flag).

Layouts: q, k, v, o ``[B, T, H, D]`` (any strides; the head dim should be contiguous for fast loads);
cum ``[B, T, H]`` float32. Internal buffers (LSE, Dvec, dc_k) are ``[B, H, T]`` float32.

Public entry points:
* :func:`forgetting_attention_triton` -- full causal forward with autograd (dq, dk, dv, dcum).
* :func:`forgetting_attention_decode_triton` -- forward only, for ``Tq <= Tk`` queries that are the last
  ``Tq`` positions of the keys (cached decoding), with optional left padding ``key_start``; the keys are
  split over several programs when there are few queries (split-K), and the partial results are merged.

Design notes (FoX paper, Algorithms 1-2):
* Softmax runs in base 2: ``exp(x) = exp2(x * log2 e)``, with ``log2 e`` folded into one multiply.
* The bias ``c_i - c_j`` is formed by subtracting the two float32 values *first* (exact when they are close,
  which they are near the diagonal where attention mass sits), and only then added to the scaled scores:
  at long T, ``|c|`` reaches 1e4..1e5, and adding ``c_i`` to a score before subtracting ``c_j`` would lose
  the score's low bits.
* Causal block skipping: a query block visits only the key blocks at or left of its diagonal, and only the
  diagonal blocks pay for masking. Ragged tails (T not a multiple of the block) are masked on load.
* On Hopper and newer the forward reads K/V tiles through per-(batch, head) TMA tensor descriptors (``FWD_TMA``;
  rows past T come back as zeros); pointer loads elsewhere, and for strides TMA cannot take.
* The backward is split in two kernels, so no atomics are needed: one program per key block accumulates
  dK, dV and ``dc_k = -colsum(dS)`` over query blocks and writes dc_k; one program per query block accumulates dQ
  and ``dc_q = rowsum(dS)`` over key blocks and adds dc_q to its rows of dc. A small preprocessing kernel computes
  ``Dvec = rowsum(dO * O)``. (In exact arithmetic rowsum(dS) = 0, but Dvec comes from the rounded O, and the
  row sums cancel that rounding error in the column sums: with sharp attention, dropping them made d(log f) ~10x
  less accurate in bf16.)
* The same source runs under ``TRITON_INTERPRET=1`` on CPU tensors (tests). There, fixed small block sizes
  are used and no device is queried. The interpreter's ``tl.dot`` mishandles bfloat16 (it multiplies the raw
  uint16 storage), so under the interpreter bf16 dot operands are upcast to float32 first (``UPCAST``);
  the products of bf16 values are exact in float32, so the result is the same function.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634

# Block configurations, per head dim: (BLOCK_M, BLOCK_N, num_warps, num_stages).
# Forward and dQ: one program per BLOCK_M query rows, stepping over keys BLOCK_N at a time.
# dK/dV: one program per BLOCK_N keys, stepping over queries BLOCK_M at a time.
# Tuned on an H100 at T=16384, B*T=65536, H=16 (evalsuite/bench/attention.py --tune, scripts/tune_fwd.py; the top
# forward configs are within 1-3% of each other and swap places run to run); D=16/32 use configs checked for
# correctness on the H100 but not tuned.
# The constraints (BLOCK_M % BLOCK_N == 0 forward/dQ, BLOCK_N % BLOCK_M == 0 dK/dV) are asserted at launch.
FWD_CONFIGS = {16: (256, 64, 8, 3), 32: (256, 64, 8, 3), 64: (128, 64, 4, 4), 128: (128, 64, 8, 4)}
BWD_DKDV_CONFIGS = {16: (32, 64, 4, 4), 32: (32, 64, 4, 4), 64: (32, 64, 4, 3), 128: (32, 128, 8, 3)}
BWD_DQ_CONFIGS = {16: (128, 32, 4, 4), 32: (128, 32, 4, 4), 64: (128, 32, 4, 4), 128: (128, 64, 8, 4)}
# Forward: fetch K/V tiles through TMA tensor descriptors (compute capability >= 9 and aligned strides; pointer loads
# otherwise), per head dim. Measured at T=16384 (scripts/tune_fwd.py, results/bench/h100/fwd-variants): 5-8% faster
# than pointer loads on an H100 (D=64: 5.85-5.98 vs 6.21-6.33 ms) and on an H200; D=16/32 not measured, so off.
# Also measured there and not kept: the query's cumsum folded into the LSE (one op less per score, within 1.5%),
# the key cumsums through a 1-D descriptor (D=64 no faster), the next block's q.k issued before this block's softmax
# (triton waits on it at once, no overlap); earlier, lazy rescaling of the accumulator (~10% slower).
FWD_TMA = {16: False, 32: False, 64: True, 128: True}
# Decode: (BLOCK_N, num_warps, num_stages); BLOCK_M follows Tq.
DECODE_CONFIG = (64, 4, 2)
# Under the interpreter: small blocks, so tests at T <= 256 still cover several diagonal / off-diagonal blocks.
INTERPRET_FWD = (32, 16, 4, 1)
INTERPRET_DKDV = (16, 32, 4, 1)
INTERPRET_DQ = (32, 16, 4, 1)
INTERPRET_DECODE = (16, 4, 1)

HEAD_DIMS = (16, 32, 64, 128)

# The strides of c are left unspecialised, so one compiled kernel serves c in [B, T, H] storage (the natural
# result of a cumsum) and in time-major storage (see cumsum_over_time); on an H100 the time-major c ran as fast
# unspecialised as specialised (6.19 vs 6.33 ms, forward, T=16384, D=64).
_VECTOR_STRIDES = ("stride_cb", "stride_ct", "stride_ch")


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _empty(shape, dtype, device):
    """Allocate an output buffer (tests replace this to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


# ----------------------------------------------------------------------------------------------------------------
# Triton kernels
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _mm(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` with float32 accumulation (operands upcast first under the interpreter, see module doc)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def _fwd_inner(
    acc,
    l_i,
    m_i,
    q,
    cq,
    k_ptrs,
    v_ptrs,
    k_desc,
    v_desc,
    c_ptrs,
    offs_m,
    lo,
    hi,
    T,
    sm_scale,
    mult,
    stride_kt,
    stride_vt,
    stride_ct,
    MASK: tl.constexpr,
    HAS_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Online-softmax sweep over keys [lo, hi) for one query block. Pointers start at key ``lo``.

    acc: [BLOCK_M, D] f32 unnormalised output; l_i, m_i: [BLOCK_M] row sums / reference maxima of s (natural units,
    softmax taken as exp2(s * mult)). MASK: diagonal block (causal mask, keys may run past T).
    USE_TMA: K/V tiles come from the tensor descriptors ``k_desc``/``v_desc`` (rows past T read as zeros),
    else from the pointers.
    """
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        if USE_TMA:
            k = k_desc.load([start_n, 0])
            v = v_desc.load([start_n, 0])
        elif MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < T, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < T, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        if HAS_C:
            if MASK:
                ck = tl.load(c_ptrs, mask=cols < T, other=0.0)
            else:
                ck = tl.load(c_ptrs)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            # subtract the two cumsums first (fp32), then add to the scaled scores
            s = s * sm_scale + (cq[:, None] - ck[None, :])
        if MASK:
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        acc, l_i, m_i = _softmax_update(acc, l_i, m_i, s, v, mult, UPCAST)
        k_ptrs += BLOCK_N * stride_kt
        v_ptrs += BLOCK_N * stride_vt
        c_ptrs += BLOCK_N * stride_ct
    return acc, l_i, m_i


@triton.jit
def _softmax_update(acc, l_i, m_i, s, v, mult, UPCAST: tl.constexpr):
    """One online-softmax step: fold scores s [BLOCK_M, BLOCK_N] and values v [BLOCK_N, D] into (acc, l_i, m_i)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2((m_i - m_new) * mult)
    p = tl.exp2(s * mult - (m_new * mult)[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_new


@triton.jit(do_not_specialize=_VECTOR_STRIDES)
def _fwd_kernel(
    Q,
    K,
    V,
    C,
    Out,
    LSE,
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
    stride_cb,
    stride_ct,
    stride_ch,
    T,
    H,
    sm_scale,
    mult,
    HAS_C: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
    USE_TMA: tl.constexpr,
):
    """Forward. Grid: (B*H, cdiv(T, BLOCK_M)). Writes O [B, T, H, D] and LSE [B, H, T] (log2 units).

    USE_TMA: read K/V through per-(batch, head) tensor descriptors ([T, HEAD_DIM], unit stride on the head dim,
    16-byte aligned rows: checked by the launcher), so Hopper's TMA unit fetches the tiles.
    """
    pid_bh = tl.program_id(0)
    # the last query blocks see the most keys: launch them first so the tail of the grid is short work
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < T

    q_ptrs = Q + b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt + offs_d[None, :] * stride_qd
    q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
    if USE_TMA:
        k_desc = tl.make_tensor_descriptor(
            K + b * stride_kb + h * stride_kh, [T, HEAD_DIM], strides=[stride_kt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
        v_desc = tl.make_tensor_descriptor(
            V + b * stride_vb + h * stride_vh, [T, HEAD_DIM], strides=[stride_vt, 1], block_shape=[BLOCK_N, HEAD_DIM]
        )
    else:
        k_desc = None
        v_desc = None
    c_base = C + b * stride_cb + h * stride_ch
    c_ptrs = c_base + offs_n * stride_ct
    if HAS_C:
        cq = tl.load(c_base + offs_m.to(tl.int64) * stride_ct, mask=row_ok, other=0.0)
    else:
        cq = tl.zeros([BLOCK_M], dtype=tl.float32)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # keys strictly left of the block: no mask (BLOCK_M % BLOCK_N == 0, so blocks never straddle start_m)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, cq, k_ptrs, v_ptrs, k_desc, v_desc, c_ptrs, offs_m, 0, start_m, T, sm_scale, mult,
        stride_kt, stride_vt, stride_ct, False, HAS_C, BLOCK_N, UPCAST, USE_TMA,
    )  # fmt: skip
    # diagonal blocks: causal mask
    k_ptrs += start_m.to(tl.int64) * stride_kt
    v_ptrs += start_m.to(tl.int64) * stride_vt
    c_ptrs += start_m.to(tl.int64) * stride_ct
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, cq, k_ptrs, v_ptrs, k_desc, v_desc, c_ptrs, offs_m, start_m,
        tl.minimum(start_m + BLOCK_M, T), T, sm_scale, mult, stride_kt, stride_vt, stride_ct, True, HAS_C, BLOCK_N,
        UPCAST, USE_TMA,
    )  # fmt: skip

    # every valid row sees at least its own key, so l_i > 0 and m_i is finite there
    o = acc / l_i[:, None]
    o_ptrs = (
        Out + b * stride_ob + h * stride_oh + offs_m[:, None].to(tl.int64) * stride_ot + offs_d[None, :] * stride_od
    )
    tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    lse = m_i * mult + tl.log2(l_i)
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, lse, mask=row_ok)


@triton.jit
def _bwd_preprocess_kernel(
    Out,
    DO,
    DELTA,
    stride_ob,
    stride_ot,
    stride_oh,
    stride_od,
    stride_dob,
    stride_dot,
    stride_doh,
    stride_dod,
    T,
    H,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
):
    """Dvec = rowsum(dO * O) in fp32. Grid: (B*H, cdiv(T, BLOCK_M)). Writes DELTA [B, H, T]."""
    pid_bh = tl.program_id(0)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    rows = offs_m[:, None].to(tl.int64)
    mask = offs_m[:, None] < T
    o = tl.load(
        Out + b * stride_ob + h * stride_oh + rows * stride_ot + offs_d[None, :] * stride_od, mask=mask, other=0.0
    )
    do = tl.load(
        DO + b * stride_dob + h * stride_doh + rows * stride_dot + offs_d[None, :] * stride_dod, mask=mask, other=0.0
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + pid_bh.to(tl.int64) * T + offs_m, delta, mask=offs_m < T)


@triton.jit
def _bwd_dkdv_inner(
    dk,
    dv,
    dck,
    k,
    v,
    ck,
    q_ptrs,
    do_ptrs,
    cq_ptrs,
    lse_ptrs,
    delta_ptrs,
    offs_n,
    lo,
    hi,
    T,
    sm_scale,
    mult,
    stride_qt,
    stride_dot,
    stride_ct,
    stride_lt,
    MASK: tl.constexpr,
    HAS_C: tl.constexpr,
    BLOCK_M: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Accumulate dK, dV, dc_k of one key block over queries [lo, hi). Pointers start at query ``lo``.

    Works on transposed tiles ([BLOCK_N keys, BLOCK_M queries]) so dK/dV accumulate without transposes.
    MASK: causal mask and queries past T (diagonal block and ragged tail).
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        if MASK:
            row_ok = offs_m < T
            q = tl.load(q_ptrs, mask=row_ok[:, None], other=0.0)
            do = tl.load(do_ptrs, mask=row_ok[:, None], other=0.0)
            lse = tl.load(lse_ptrs, mask=row_ok, other=float("inf"))  # p = 0 on rows past T
            delta = tl.load(delta_ptrs, mask=row_ok, other=0.0)
        else:
            q = tl.load(q_ptrs)
            do = tl.load(do_ptrs)
            lse = tl.load(lse_ptrs)
            delta = tl.load(delta_ptrs)
        s_t = _mm(k, tl.trans(q), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), UPCAST)
        if HAS_C:
            if MASK:
                cq = tl.load(cq_ptrs, mask=row_ok, other=0.0)
            else:
                cq = tl.load(cq_ptrs)
            s_t = s_t * sm_scale + (cq[None, :] - ck[:, None])
        if MASK:  # future queries and rows past T: p = 0
            s_t = tl.where((offs_m[None, :] >= offs_n[:, None]) & row_ok[None, :], s_t, float("-inf"))
        p_t = tl.exp2(s_t * mult - lse[None, :])
        dv = _mm(p_t.to(do.dtype), do, dv, UPCAST)
        dp_t = _mm(v, tl.trans(do), tl.zeros([k.shape[0], BLOCK_M], dtype=tl.float32), UPCAST)
        ds_t = p_t * (dp_t - delta[None, :])
        dk = _mm(ds_t.to(q.dtype), q, dk, UPCAST)
        if HAS_C:
            dck -= tl.sum(ds_t, 1)
        q_ptrs += BLOCK_M * stride_qt
        do_ptrs += BLOCK_M * stride_dot
        cq_ptrs += BLOCK_M * stride_ct
        lse_ptrs += BLOCK_M * stride_lt
        delta_ptrs += BLOCK_M * stride_lt
    return dk, dv, dck


@triton.jit(do_not_specialize=_VECTOR_STRIDES)
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    C,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    DC,
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
    stride_dob,
    stride_dot,
    stride_doh,
    stride_dod,
    stride_dkb,
    stride_dkt,
    stride_dkh,
    stride_dkd,
    stride_dvb,
    stride_dvt,
    stride_dvh,
    stride_dvd,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_dcb,
    stride_dct,
    stride_dch,
    stride_lt,
    T,
    H,
    sm_scale,
    mult,
    HAS_C: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """dK, dV [B, T, H, D] and dc_k = -colsum(dS) into DC [B, T, H] (fp32). Grid: (B*H, cdiv(T, BLOCK_N)).

    One key block per program. LSE / DELTA are [B*H, T] with time stride ``stride_lt`` (1). The dQ kernel,
    launched after this one, adds the row sums to DC.
    """
    pid_bh = tl.program_id(0)
    pid_n = tl.program_id(1)  # the first key blocks are seen by the most queries: they go first
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    start_n = pid_n * BLOCK_N
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < T
    rows_n = offs_n[:, None].to(tl.int64)

    k = tl.load(K + b * stride_kb + h * stride_kh + rows_n * stride_kt + offs_d[None, :] * stride_kd,
                mask=col_ok[:, None], other=0.0)  # fmt: skip
    v = tl.load(V + b * stride_vb + h * stride_vh + rows_n * stride_vt + offs_d[None, :] * stride_vd,
                mask=col_ok[:, None], other=0.0)  # fmt: skip
    c_base = C + b * stride_cb + h * stride_ch
    if HAS_C:
        ck = tl.load(c_base + offs_n.to(tl.int64) * stride_ct, mask=col_ok, other=0.0)
    else:
        ck = tl.zeros([BLOCK_N], dtype=tl.float32)

    # pointers at query `start_n` (the diagonal)
    start64 = start_n.to(tl.int64)
    q_ptrs = Q + b * stride_qb + h * stride_qh + start64 * stride_qt
    q_ptrs += offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    do_ptrs = DO + b * stride_dob + h * stride_doh + start64 * stride_dot
    do_ptrs += offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod
    cq_ptrs = c_base + start64 * stride_ct + offs_m * stride_ct
    lse_ptrs = LSE + (pid_bh.to(tl.int64) * T + start64 + offs_m) * stride_lt
    delta_ptrs = DELTA + (pid_bh.to(tl.int64) * T + start64 + offs_m) * stride_lt

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dck = tl.zeros([BLOCK_N], dtype=tl.float32)

    # 1) diagonal: queries [start_n, start_n + BLOCK_N) (BLOCK_N % BLOCK_M == 0), masked
    hi = tl.minimum(start_n + BLOCK_N, T)
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, q_ptrs, do_ptrs, cq_ptrs, lse_ptrs, delta_ptrs, offs_n, start_n, hi, T, sm_scale,
        mult, stride_qt, stride_dot, stride_ct, stride_lt, True, HAS_C, BLOCK_M, UPCAST,
    )  # fmt: skip
    # 2) full query blocks below the diagonal: no mask
    lo = start_n + BLOCK_N
    n_full = tl.maximum(T - lo, 0) // BLOCK_M
    hi = lo + n_full * BLOCK_M
    shift = BLOCK_N
    q_ptrs += shift * stride_qt
    do_ptrs += shift * stride_dot
    cq_ptrs += shift * stride_ct
    lse_ptrs += shift * stride_lt
    delta_ptrs += shift * stride_lt
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, q_ptrs, do_ptrs, cq_ptrs, lse_ptrs, delta_ptrs, offs_n, lo, hi, T, sm_scale,
        mult, stride_qt, stride_dot, stride_ct, stride_lt, False, HAS_C, BLOCK_M, UPCAST,
    )  # fmt: skip
    # 3) ragged tail [hi, T): masked (at most one step)
    shift64 = (n_full * BLOCK_M).to(tl.int64)
    q_ptrs += shift64 * stride_qt
    do_ptrs += shift64 * stride_dot
    cq_ptrs += shift64 * stride_ct
    lse_ptrs += shift64 * stride_lt
    delta_ptrs += shift64 * stride_lt
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, q_ptrs, do_ptrs, cq_ptrs, lse_ptrs, delta_ptrs, offs_n, tl.maximum(hi, lo), T, T,
        sm_scale, mult, stride_qt, stride_dot, stride_ct, stride_lt, True, HAS_C, BLOCK_M, UPCAST,
    )  # fmt: skip

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + h * stride_dkh + rows_n * stride_dkt + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=col_ok[:, None])  # fmt: skip
    tl.store(DV + b * stride_dvb + h * stride_dvh + rows_n * stride_dvt + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])  # fmt: skip
    if HAS_C:
        tl.store(DC + b * stride_dcb + h * stride_dch + offs_n.to(tl.int64) * stride_dct, dck, mask=col_ok)


@triton.jit
def _bwd_dq_inner(
    dq,
    dcq,
    q,
    do,
    cq,
    lse,
    delta,
    k_ptrs,
    v_ptrs,
    ck_ptrs,
    offs_m,
    lo,
    hi,
    T,
    sm_scale,
    mult,
    stride_kt,
    stride_vt,
    stride_ct,
    MASK: tl.constexpr,
    HAS_C: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Accumulate dQ and dc_q of one query block over keys [lo, hi). Pointers start at key ``lo``."""
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        if MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < T, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < T, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            if MASK:
                ck = tl.load(ck_ptrs, mask=cols < T, other=0.0)
            else:
                ck = tl.load(ck_ptrs)
            s = s * sm_scale + (cq[:, None] - ck[None, :])
        if MASK:
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        p = tl.exp2(s * mult - lse[:, None])
        dp = _mm(do, tl.trans(v), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST)
        ds = p * (dp - delta[:, None])
        dq = _mm(ds.to(k.dtype), k, dq, UPCAST)
        if HAS_C:
            dcq += tl.sum(ds, 1)
        k_ptrs += BLOCK_N * stride_kt
        v_ptrs += BLOCK_N * stride_vt
        ck_ptrs += BLOCK_N * stride_ct
    return dq, dcq


@triton.jit(do_not_specialize=_VECTOR_STRIDES)
def _bwd_dq_kernel(
    Q,
    K,
    V,
    C,
    DO,
    LSE,
    DELTA,
    DQ,
    DC,
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
    stride_dob,
    stride_dot,
    stride_doh,
    stride_dod,
    stride_dqb,
    stride_dqt,
    stride_dqh,
    stride_dqd,
    stride_cb,
    stride_ct,
    stride_ch,
    stride_dcb,
    stride_dct,
    stride_dch,
    T,
    H,
    sm_scale,
    mult,
    HAS_C: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """dQ [B, T, H, D] and DC += dc_q (DC holds dc_k from the dK/dV kernel). Grid: (B*H, cdiv(T, BLOCK_M))."""
    pid_bh = tl.program_id(0)
    pid_m = tl.num_programs(1) - 1 - tl.program_id(1)  # heaviest (last) query blocks first
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < T
    rows = offs_m[:, None].to(tl.int64)

    q = tl.load(Q + b * stride_qb + h * stride_qh + rows * stride_qt + offs_d[None, :] * stride_qd,
                mask=row_ok[:, None], other=0.0)  # fmt: skip
    do = tl.load(DO + b * stride_dob + h * stride_doh + rows * stride_dot + offs_d[None, :] * stride_dod,
                 mask=row_ok[:, None], other=0.0)  # fmt: skip
    lse = tl.load(LSE + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=float("inf"))  # p = 0 past T
    delta = tl.load(DELTA + pid_bh.to(tl.int64) * T + offs_m, mask=row_ok, other=0.0)
    c_base = C + b * stride_cb + h * stride_ch
    if HAS_C:
        cq = tl.load(c_base + offs_m.to(tl.int64) * stride_ct, mask=row_ok, other=0.0)
    else:
        cq = tl.zeros([BLOCK_M], dtype=tl.float32)

    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
    ck_ptrs = c_base + offs_n * stride_ct

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dcq = tl.zeros([BLOCK_M], dtype=tl.float32)
    dq, dcq = _bwd_dq_inner(
        dq, dcq, q, do, cq, lse, delta, k_ptrs, v_ptrs, ck_ptrs, offs_m, 0, start_m, T, sm_scale, mult,
        stride_kt, stride_vt, stride_ct, False, HAS_C, BLOCK_N, UPCAST,
    )  # fmt: skip
    start64 = start_m.to(tl.int64)
    k_ptrs += start64 * stride_kt
    v_ptrs += start64 * stride_vt
    ck_ptrs += start64 * stride_ct
    dq, dcq = _bwd_dq_inner(
        dq, dcq, q, do, cq, lse, delta, k_ptrs, v_ptrs, ck_ptrs, offs_m, start_m, tl.minimum(start_m + BLOCK_M, T),
        T, sm_scale, mult, stride_kt, stride_vt, stride_ct, True, HAS_C, BLOCK_N, UPCAST,
    )  # fmt: skip

    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows * stride_dqt + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip
    if HAS_C:  # this program owns these rows of DC: a plain read-modify-write, no atomics
        dc_ptrs = DC + b * stride_dcb + h * stride_dch + offs_m.to(tl.int64) * stride_dct
        tl.store(dc_ptrs, tl.load(dc_ptrs, mask=row_ok, other=0.0) + dcq, mask=row_ok)


@triton.jit
def _decode_kernel(
    Q,
    K,
    V,
    CQ,
    CK,
    KS,
    O_PART,
    LSE_PART,
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
    stride_cqb,
    stride_cqt,
    stride_cqh,
    stride_ckb,
    stride_ckt,
    stride_ckh,
    Tq,
    Tk,
    H,
    keys_per_split,
    sm_scale,
    mult,
    HAS_C: tl.constexpr,
    HAS_KS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Partial attention of query rows against one split of the keys.

    Query row i sits at absolute position ``Tk - Tq + i``; key j is visible when ``key_start[b] <= j <= pos``.
    Grid: (B*H, cdiv(Tq, BLOCK_M), n_splits). Split s covers keys [s*keys_per_split, (s+1)*keys_per_split).
    Writes O_PART [S, B, H, Tq, D] (normalised within the split, 0 where nothing is visible) and
    LSE_PART [S, B, H, Tq] (log2 units, -inf where nothing is visible); the host merges the splits.
    """
    pid_bh = tl.program_id(0)
    pid_m = tl.program_id(1)
    pid_s = tl.program_id(2)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < Tq
    pos = Tk - Tq + offs_m

    q = tl.load(Q + b * stride_qb + h * stride_qh + offs_m[:, None].to(tl.int64) * stride_qt
                + offs_d[None, :] * stride_qd, mask=row_ok[:, None], other=0.0)  # fmt: skip
    if HAS_C:
        cq = tl.load(CQ + b * stride_cqb + h * stride_cqh + offs_m.to(tl.int64) * stride_cqt, mask=row_ok, other=0.0)
    if HAS_KS:
        ks = tl.load(KS + b).to(tl.int32)
    else:
        ks = tl.full([], 0, dtype=tl.int32)

    lo = pid_s * keys_per_split
    # last key any row of this block may see, +1
    hi = tl.minimum(tl.minimum(lo + keys_per_split, Tk), Tk - Tq + tl.minimum(pid_m * BLOCK_M + BLOCK_M, Tq))
    lo = tl.maximum(lo, (ks // BLOCK_N) * BLOCK_N)  # skip whole blocks of left padding, stay block aligned

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    k_base = K + b * stride_kb + h * stride_kh
    v_base = V + b * stride_vb + h * stride_vh
    ck_base = CK + b * stride_ckb + h * stride_ckh
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < hi
        cols64 = cols.to(tl.int64)
        k = tl.load(k_base + cols64[:, None] * stride_kt + offs_d[None, :] * stride_kd, mask=col_ok[:, None], other=0.0)
        v = tl.load(v_base + cols64[:, None] * stride_vt + offs_d[None, :] * stride_vd, mask=col_ok[:, None], other=0.0)
        s = _mm(q, tl.trans(k), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            ck = tl.load(ck_base + cols64 * stride_ckt, mask=col_ok, other=0.0)
            s = s * sm_scale + (cq[:, None] - ck[None, :])
        visible = (cols[None, :] <= pos[:, None]) & col_ok[None, :] & (cols[None, :] >= ks)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # rows that have seen no visible key yet keep m = -inf; use 0 as the shift so no inf - inf appears
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2((m_i - m_use) * mult)
        p = tl.exp2(s * mult - (m_use * mult)[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
        m_i = m_new

    empty = l_i == 0.0
    o = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i * mult + tl.log2(tl.where(empty, 1.0, l_i)))
    # O_PART / LSE_PART are contiguous [S, B*H, Tq, (D)]
    row = (pid_s * tl.num_programs(0) + pid_bh).to(tl.int64) * Tq + offs_m
    tl.store(O_PART + row[:, None] * HEAD_DIM + offs_d[None, :], o, mask=row_ok[:, None])
    tl.store(LSE_PART + row, lse, mask=row_ok)


# ----------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------


def _check_inputs(q, k, v):
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected q, k, v as [B, T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share dtype bfloat16 or float16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} not supported; use one of {HEAD_DIMS}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")


def _strides4(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _upcast(dtype) -> bool:
    return _interpreting() and dtype == torch.bfloat16


def _scales(scale, D, has_c):
    """(sm_scale, mult): scores are ``qk * sm_scale + bias`` when there is a bias (then exp2 needs ``log2 e``),
    and raw ``qk`` without one (then ``mult`` carries the scale too, saving one multiply per score)."""
    sm_scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    return (sm_scale, LOG2E) if has_c else (sm_scale, sm_scale * LOG2E)


def _tma_scratch(size: int, alignment: int, stream):
    """Global memory for descriptors built inside kernels (``triton.set_allocator``)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


@functools.cache
def _install_tma_allocator() -> None:
    """Give triton the scratch allocator that in-kernel descriptors need (once per process)."""
    triton.set_allocator(_tma_scratch)


@functools.cache
def _has_tma(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _tma_usable(*tensors) -> bool:
    """TMA needs compute capability >= 9 (any device under the interpreter, which emulates descriptors without
    driver queries), a unit-stride head dim and 16-byte aligned bases and strides."""
    t0 = tensors[0]
    if not _interpreting() and not (t0.is_cuda and _has_tma(t0.device.index or 0)):
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(3) != 1 or t.data_ptr() % 16 or any(t.stride(i) * size % 16 for i in range(3)):
            return False
    return True


def _fwd(q, k, v, cum, scale, config=None, tma=None):
    """Launch the forward. Returns o [B, T, H, D] (q dtype) and lse [B, H, T] fp32 (log2 units)."""
    B, T, H, D = q.shape
    BLOCK_M, BLOCK_N, num_warps, num_stages = config or (INTERPRET_FWD if _interpreting() else FWD_CONFIGS[D])
    assert BLOCK_M % BLOCK_N == 0, "forward needs BLOCK_M % BLOCK_N == 0"
    has_c = cum is not None
    sm_scale, mult = _scales(scale, D, has_c)
    o = _empty((B, T, H, D), q.dtype, q.device)
    lse = _empty((B, H, T), torch.float32, q.device)
    use_tma = FWD_TMA.get(D, False) if tma is None else tma
    use_tma = use_tma and _tma_usable(k, v)
    if use_tma and not _interpreting():
        _install_tma_allocator()
    c = cum if has_c else lse  # dummy pointer, never read
    c_strides = cum.stride() if has_c else (0, 0, 0)
    grid = (B * H, triton.cdiv(T, BLOCK_M))
    _fwd_kernel[grid](
        q, k, v, c, o, lse, *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(o), *c_strides,
        T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, UPCAST=_upcast(q.dtype),
        USE_TMA=use_tma,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return o, lse


def _bwd(do, q, k, v, cum, o, lse, scale, dkdv_config=None, dq_config=None):
    """Launch the backward. Returns dq, dk, dv (q dtype, [B, T, H, D]) and dcum ([B, T, H] fp32, or None)."""
    B, T, H, D = q.shape
    interp = _interpreting()
    has_c = cum is not None
    sm_scale, mult = _scales(scale, D, has_c)
    if do.stride(-1) != 1:
        do = do.contiguous()
    dev = q.device
    delta = _empty((B, H, T), torch.float32, dev)
    pre_block = 16 if interp else 128
    _bwd_preprocess_kernel[(B * H, triton.cdiv(T, pre_block))](
        o, do, delta, *_strides4(o), *_strides4(do), T, H, HEAD_DIM=D, BLOCK_M=pre_block
    )

    dq = _empty((B, T, H, D), q.dtype, dev)
    dk = _empty((B, T, H, D), k.dtype, dev)
    dv = _empty((B, T, H, D), v.dtype, dev)
    dcum = _empty((B, T, H), torch.float32, dev) if has_c else None
    c = cum if has_c else delta  # dummy pointers when there is no gate, never read
    c_strides = cum.stride() if has_c else (0, 0, 0)
    dc = dcum if has_c else delta
    dc_strides = dcum.stride() if has_c else (0, 0, 0)
    upcast = _upcast(q.dtype)

    BM, BN, nw, ns = dkdv_config or (INTERPRET_DKDV if interp else BWD_DKDV_CONFIGS[D])
    assert BN % BM == 0, "dK/dV kernel needs BLOCK_N % BLOCK_M == 0"
    _bwd_dkdv_kernel[(B * H, triton.cdiv(T, BN))](
        q, k, v, c, do, lse, delta, dk, dv, dc,
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do), *_strides4(dk), *_strides4(dv), *c_strides,
        *dc_strides, 1, T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, UPCAST=upcast, num_warps=nw, num_stages=ns,
    )  # fmt: skip

    BM, BN, nw, ns = dq_config or (INTERPRET_DQ if interp else BWD_DQ_CONFIGS[D])
    assert BM % BN == 0, "dQ kernel needs BLOCK_M % BLOCK_N == 0"
    _bwd_dq_kernel[(B * H, triton.cdiv(T, BM))](
        q, k, v, c, do, lse, delta, dq, dc,
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do), *_strides4(dq), *c_strides, *dc_strides,
        T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, UPCAST=upcast, num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return dq, dk, dv, dcum


class ForgettingAttentionFunction(torch.autograd.Function):
    """Autograd wrapper: forward/backward kernels above; saves q, k, v, cum, o and the fp32 LSE."""

    @staticmethod
    def forward(ctx, q, k, v, cum, scale):
        o, lse = _fwd(q, k, v, cum, scale)
        ctx.save_for_backward(q, k, v, cum, o, lse)
        ctx.scale = scale
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, cum, o, lse = ctx.saved_tensors
        dq, dk, dv, dcum = _bwd(do, q, k, v, cum, o, lse, ctx.scale)
        return dq, dk, dv, dcum, None


def forgetting_attention_triton(q, k, v, cum=None, *, scale=None):
    """Causal Forgetting Attention (full sequence), differentiable.

    Args:
        q, k, v: ``[B, T, H, D]`` bfloat16 or float16, any strides; D in (16, 32, 64, 128).
        cum: ``[B, T, H]`` float32 cumulative log forget gates (``cumsum(log f, dim=1)``; on GPU prefer
            :func:`cumsum_over_time`, torch's dim=1 cumsum is slow at long T), or None for plain causal
            attention. Gradients flow to ``cum`` (``dcum_i = sum_j dS_ij - sum_j dS_ji``); autograd through the
            caller's cumsum turns them into ``d log f``.
        scale: logit scale, default ``1/sqrt(D)``.
    Returns:
        o: ``[B, T, H, D]`` in q's dtype (contiguous).
    """
    _check_inputs(q, k, v)
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"full forward needs q, k, v of one shape; got {tuple(q.shape)}, {tuple(k.shape)}")
    B, T, H, _ = q.shape
    if cum is not None:
        if cum.shape != (B, T, H):
            raise ValueError(f"cum must be [B, T, H] = {(B, T, H)}; got {tuple(cum.shape)}")
        cum = cum.float()
    return ForgettingAttentionFunction.apply(q, k, v, cum, scale)


def _num_splits(bh_blocks: int, Tk: int, block_n: int, device) -> int:
    """How many key splits to fill the GPU when there are few (batch, head, query block) programs."""
    if _interpreting() or device.type != "cuda":
        n_sm = 4  # no device queries under the interpreter; a small number still exercises the split path
        min_keys = 2 * block_n
    else:
        n_sm = torch.cuda.get_device_properties(device).multi_processor_count
        min_keys = 4 * block_n  # keep each split long enough to amortise its partial write
    want = triton.cdiv(2 * n_sm, bh_blocks)
    return max(1, min(want, triton.cdiv(Tk, min_keys)))


def forgetting_attention_decode_triton(q, k, v, cum_q=None, cum_k=None, *, scale=None, key_start=None,
                                       num_splits=None):  # fmt: skip
    """Forgetting Attention for queries that are the last ``Tq`` positions of ``Tk`` keys (forward only).

    Args:
        q: ``[B, Tq, H, D]``; k, v: ``[B, Tk, H, D]`` (bf16/fp16, any strides), ``Tq <= Tk``.
        cum_q, cum_k: ``[B, Tq, H]`` / ``[B, Tk, H]`` cumulative log forget gates, or both None.
        scale: logit scale, default ``1/sqrt(D)``.
        key_start: ``[B]`` integer, first valid key per sequence (left padding), or None.
        num_splits: key splits (split-K); default picks enough programs to fill the GPU when Tq is small.
    Returns:
        ``[B, Tq, H, D]`` in q's dtype; rows that see no key are 0 (as in the reference).
    """
    _check_inputs(q, k, v)
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    if k.shape != v.shape or k.shape[0] != B or k.shape[2] != H or k.shape[3] != D or Tk < Tq:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not fit q shape {tuple(q.shape)}")
    if (cum_q is None) != (cum_k is None):
        raise ValueError("give both cum_q and cum_k, or neither")
    has_c = cum_q is not None
    if has_c:
        if cum_q.shape != (B, Tq, H) or cum_k.shape != (B, Tk, H):
            raise ValueError(
                f"cum_q/cum_k must be [B, Tq, H]/[B, Tk, H]; got {tuple(cum_q.shape)}/{tuple(cum_k.shape)}"
            )
        cum_q, cum_k = cum_q.float(), cum_k.float()
    has_ks = key_start is not None
    if has_ks:
        if key_start.shape != (B,):
            raise ValueError(f"key_start must be [B]; got {tuple(key_start.shape)}")
        key_start = key_start.to(device=q.device, dtype=torch.int32).contiguous()
    if Tq == 0:
        return q.new_empty(q.shape)

    interp = _interpreting()
    BLOCK_N, num_warps, num_stages = INTERPRET_DECODE if interp else DECODE_CONFIG
    BLOCK_M = 16 if Tq <= 16 else (32 if (interp or Tq <= 32) else 64)
    n_m = triton.cdiv(Tq, BLOCK_M)
    if num_splits is None:
        num_splits = _num_splits(B * H * n_m, Tk, BLOCK_N, q.device)
    keys_per_split = triton.cdiv(triton.cdiv(Tk, num_splits), BLOCK_N) * BLOCK_N
    num_splits = triton.cdiv(Tk, keys_per_split)

    sm_scale, mult = _scales(scale, D, has_c)
    o_part = _empty((num_splits, B, H, Tq, D), torch.float32, q.device)
    lse_part = _empty((num_splits, B, H, Tq), torch.float32, q.device)
    cq = cum_q if has_c else lse_part
    ck = cum_k if has_c else lse_part
    cq_strides = cum_q.stride() if has_c else (0, 0, 0)
    ck_strides = cum_k.stride() if has_c else (0, 0, 0)
    ks = key_start if has_ks else lse_part
    _decode_kernel[(B * H, n_m, num_splits)](
        q, k, v, cq, ck, ks, o_part, lse_part, *_strides4(q), *_strides4(k), *_strides4(v), *cq_strides, *ck_strides,
        Tq, Tk, H, keys_per_split, sm_scale, mult,
        HAS_C=has_c, HAS_KS=has_ks, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, UPCAST=_upcast(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip

    if num_splits == 1:
        out = o_part[0]
    else:
        # merge: weight each split's normalised output by its share of the total softmax mass (base 2)
        m = lse_part.amax(dim=0)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        w = torch.exp2(lse_part - m)  # [S, B, H, Tq]; 0 for empty splits
        out = (w[..., None] * o_part).sum(0) / w.sum(0).clamp_min(1e-30)[..., None]
    return out.permute(0, 2, 1, 3).to(q.dtype)  # [B, H, Tq, D] -> [B, Tq, H, D]
