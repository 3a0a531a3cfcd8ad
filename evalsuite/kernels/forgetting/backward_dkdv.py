"""Forgetting Attention backward, key side: dK, dV and the column sums of dS, one program per key block.

Launched by :func:`evalsuite.kernels.forgetting.backward._bwd` (see there for the two-kernel split).
Causal block skipping, mirrored: a key block visits only the query blocks at or below its diagonal; the diagonal
block and the ragged tail (queries past T) are masked, the full blocks between them are not.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.forgetting.common import VECTOR_STRIDES, _mm
from evalsuite.kernels.forgetting.gate_operands import GATE_LANES


@triton.jit
def _bwd_dkdv_inner(
    dk,
    dv,
    dck,
    k,
    v,
    ck,
    ka,
    q_ptrs,
    do_ptrs,
    cq_ptrs,
    qa_ptrs,
    lse_ptrs,
    delta_ptrs,
    descs,
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
    USE_TMA: tl.constexpr,
    GATE_MMA: tl.constexpr,
):
    """Accumulate dK, dV, dc_k of one key block over queries [lo, hi). Pointers start at query ``lo``.

    Works on transposed tiles ([BLOCK_N keys, BLOCK_M queries]) so dK/dV accumulate without transposes.
    MASK: causal mask and queries past T (diagonal block and ragged tail).
    USE_TMA: q, dO, LSE, Delta and QA tiles come from the descriptors ``descs`` (in that order; rows past T read as
    zeros, which the mask then drops). GATE_MMA: the bias through the tensor cores as in the forward,
    ``s_t += ka @ qa^T`` with the key block's operands ``ka`` [BLOCK_N, GATE_LANES] and the query block's; then
    ``mult`` carries the scale.
    """
    offs_m0 = tl.arange(0, BLOCK_M)
    for start_m in range(lo, hi, BLOCK_M):
        offs_m = start_m + offs_m0
        row_ok = offs_m < T
        if USE_TMA:
            q = descs[0].load([start_m, 0])
            do = descs[1].load([start_m, 0])
            lse = descs[2].load([start_m])
            delta = descs[3].load([start_m])
        elif MASK:
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
            if GATE_MMA:
                if USE_TMA:
                    qa = descs[4].load([start_m, 0])
                elif MASK:
                    qa = tl.load(qa_ptrs, mask=row_ok[:, None], other=0.0)
                else:
                    qa = tl.load(qa_ptrs)
                s_t = _mm(ka, tl.trans(qa), s_t, UPCAST)
            else:
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
        qa_ptrs += BLOCK_M * GATE_LANES
        lse_ptrs += BLOCK_M * stride_lt
        delta_ptrs += BLOCK_M * stride_lt
    return dk, dv, dck


@triton.jit(do_not_specialize=VECTOR_STRIDES)
def _bwd_dkdv_kernel(
    Q,
    K,
    V,
    C,
    QA,
    KA,
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
    USE_TMA: tl.constexpr,
    GATE_MMA: tl.constexpr,
):
    """dK, dV [B, T, H, D] and dc_k = -colsum(dS) into DC [B, T, H] (fp32). Grid: (B*H, cdiv(T, BLOCK_N)).

    One key block per program. LSE / DELTA are [B*H, T] with time stride ``stride_lt`` (1). The dQ kernel,
    launched after this one, adds the row sums to DC. GATE_MMA: the bias from the gate operands QA, KA ``[B, H, T,
    GATE_LANES]`` (contiguous; :func:`gate_operands`) through the tensor cores, instead of C (then not read).
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
    if HAS_C and not GATE_MMA:
        ck = tl.load(c_base + offs_n.to(tl.int64) * stride_ct, mask=col_ok, other=0.0)
    else:
        ck = tl.zeros([BLOCK_N], dtype=tl.float32)
    offs_a = tl.arange(0, GATE_LANES)
    a_base = pid_bh.to(tl.int64) * T * GATE_LANES
    if GATE_MMA:
        ka = tl.load(KA + a_base + rows_n * GATE_LANES + offs_a[None, :], mask=col_ok[:, None], other=0.0)
    else:
        ka = tl.zeros([BLOCK_N, GATE_LANES], dtype=K.dtype.element_ty)

    # pointers at query `start_n` (the diagonal)
    start64 = start_n.to(tl.int64)
    q_ptrs = Q + b * stride_qb + h * stride_qh + start64 * stride_qt
    q_ptrs += offs_m[:, None] * stride_qt + offs_d[None, :] * stride_qd
    do_ptrs = DO + b * stride_dob + h * stride_doh + start64 * stride_dot
    do_ptrs += offs_m[:, None] * stride_dot + offs_d[None, :] * stride_dod
    cq_ptrs = c_base + start64 * stride_ct + offs_m * stride_ct
    qa_ptrs = QA + a_base + (start64 + offs_m[:, None]) * GATE_LANES + offs_a[None, :]
    lse_ptrs = LSE + (pid_bh.to(tl.int64) * T + start64 + offs_m) * stride_lt
    delta_ptrs = DELTA + (pid_bh.to(tl.int64) * T + start64 + offs_m) * stride_lt

    if USE_TMA:
        rows = pid_bh.to(tl.int64) * T
        q_desc = tl.make_tensor_descriptor(Q + b * stride_qb + h * stride_qh, [T, HEAD_DIM], strides=[stride_qt, 1],
                                           block_shape=[BLOCK_M, HEAD_DIM])  # fmt: skip
        do_desc = tl.make_tensor_descriptor(DO + b * stride_dob + h * stride_doh, [T, HEAD_DIM],
                                            strides=[stride_dot, 1], block_shape=[BLOCK_M, HEAD_DIM])  # fmt: skip
        lse_desc = tl.make_tensor_descriptor(LSE + rows, [T], strides=[1], block_shape=[BLOCK_M])
        delta_desc = tl.make_tensor_descriptor(DELTA + rows, [T], strides=[1], block_shape=[BLOCK_M])
        if GATE_MMA:
            qa_desc = tl.make_tensor_descriptor(QA + a_base, [T, GATE_LANES], strides=[GATE_LANES, 1],
                                                block_shape=[BLOCK_M, GATE_LANES])  # fmt: skip
            descs = (q_desc, do_desc, lse_desc, delta_desc, qa_desc)
        else:
            descs = (q_desc, do_desc, lse_desc, delta_desc, None)
    else:
        descs = (None, None, None, None, None)

    dk = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], dtype=tl.float32)
    dck = tl.zeros([BLOCK_N], dtype=tl.float32)

    # 1) diagonal: queries [start_n, start_n + BLOCK_N) (BLOCK_N % BLOCK_M == 0), masked
    hi = tl.minimum(start_n + BLOCK_N, T)
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, ka, q_ptrs, do_ptrs, cq_ptrs, qa_ptrs, lse_ptrs, delta_ptrs, descs, offs_n, start_n, hi,
        T, sm_scale, mult, stride_qt, stride_dot, stride_ct, stride_lt, True, HAS_C, BLOCK_M, UPCAST, USE_TMA, GATE_MMA,
    )  # fmt: skip
    # 2) full query blocks below the diagonal: no mask
    lo = start_n + BLOCK_N
    n_full = tl.maximum(T - lo, 0) // BLOCK_M
    hi = lo + n_full * BLOCK_M
    shift = BLOCK_N
    q_ptrs += shift * stride_qt
    do_ptrs += shift * stride_dot
    cq_ptrs += shift * stride_ct
    qa_ptrs += shift * GATE_LANES
    lse_ptrs += shift * stride_lt
    delta_ptrs += shift * stride_lt
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, ka, q_ptrs, do_ptrs, cq_ptrs, qa_ptrs, lse_ptrs, delta_ptrs, descs, offs_n, lo, hi, T,
        sm_scale, mult, stride_qt, stride_dot, stride_ct, stride_lt, False, HAS_C, BLOCK_M, UPCAST, USE_TMA, GATE_MMA,
    )  # fmt: skip
    # 3) ragged tail [hi, T): masked (at most one step)
    shift64 = (n_full * BLOCK_M).to(tl.int64)
    q_ptrs += shift64 * stride_qt
    do_ptrs += shift64 * stride_dot
    cq_ptrs += shift64 * stride_ct
    qa_ptrs += shift64 * GATE_LANES
    lse_ptrs += shift64 * stride_lt
    delta_ptrs += shift64 * stride_lt
    dk, dv, dck = _bwd_dkdv_inner(
        dk, dv, dck, k, v, ck, ka, q_ptrs, do_ptrs, cq_ptrs, qa_ptrs, lse_ptrs, delta_ptrs, descs, offs_n,
        tl.maximum(hi, lo), T, T, sm_scale, mult, stride_qt, stride_dot, stride_ct, stride_lt, True, HAS_C, BLOCK_M,
        UPCAST, USE_TMA, GATE_MMA,
    )  # fmt: skip

    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + h * stride_dkh + rows_n * stride_dkt + offs_d[None, :] * stride_dkd,
             dk.to(DK.dtype.element_ty), mask=col_ok[:, None])  # fmt: skip
    tl.store(DV + b * stride_dvb + h * stride_dvh + rows_n * stride_dvt + offs_d[None, :] * stride_dvd,
             dv.to(DV.dtype.element_ty), mask=col_ok[:, None])  # fmt: skip
    if HAS_C:
        tl.store(DC + b * stride_dcb + h * stride_dch + offs_n.to(tl.int64) * stride_dct, dck, mask=col_ok)
