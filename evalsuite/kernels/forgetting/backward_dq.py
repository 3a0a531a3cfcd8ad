"""Forgetting Attention backward, query side: dQ and the row sums of dS, one program per query block.

Launched by :func:`evalsuite.kernels.forgetting.backward._bwd` after the dK/dV kernel, whose column sums it
completes into ``dcum``. Causal block skipping as in the forward: key blocks left of the diagonal unmasked, the
diagonal block masked.
"""

from __future__ import annotations

import triton
import triton.language as tl

from evalsuite.kernels.forgetting.common import VECTOR_STRIDES, _mm
from evalsuite.kernels.forgetting.gate_operands import GATE_LANES


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
    qa,
    ka_ptrs,
    descs,
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
    GATE_MMA: tl.constexpr,
):
    """Accumulate dQ and dc_q of one query block over keys [lo, hi). Pointers start at key ``lo``.

    USE_TMA: K and V tiles come from the descriptors ``descs`` (K, V, then KA; rows past T read as zeros, which the
    causal mask drops). GATE_MMA: the bias through the tensor cores as in the forward, ``s += qa @ ka^T`` with the
    query block's operands ``qa`` [BLOCK_M, GATE_LANES] and the key block's; then ``mult`` carries the scale.
    """
    offs_n0 = tl.arange(0, BLOCK_N)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n0
        if USE_TMA:
            k = descs[0].load([start_n, 0])
            v = descs[1].load([start_n, 0])
        elif MASK:
            k = tl.load(k_ptrs, mask=cols[:, None] < T, other=0.0)
            v = tl.load(v_ptrs, mask=cols[:, None] < T, other=0.0)
        else:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            if GATE_MMA:
                if USE_TMA:
                    ka = descs[2].load([start_n, 0])
                elif MASK:
                    ka = tl.load(ka_ptrs, mask=cols[:, None] < T, other=0.0)
                else:
                    ka = tl.load(ka_ptrs)
                s = _mm(qa, tl.trans(ka), s, UPCAST)
            else:
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
        ka_ptrs += BLOCK_N * GATE_LANES
    return dq, dcq


@triton.jit(do_not_specialize=VECTOR_STRIDES)
def _bwd_dq_kernel(
    Q,
    K,
    V,
    C,
    QA,
    KA,
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
    USE_TMA: tl.constexpr,
    GATE_MMA: tl.constexpr,
):
    """dQ [B, T, H, D] and DC += dc_q (DC holds dc_k from the dK/dV kernel). Grid: (B*H, cdiv(T, BLOCK_M)).

    GATE_MMA: the bias from the gate operands QA, KA ``[B, H, T, GATE_LANES]`` (contiguous; :func:`gate_operands`)
    through the tensor cores, instead of C (which is then not read)."""
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
    if HAS_C and not GATE_MMA:
        cq = tl.load(c_base + offs_m.to(tl.int64) * stride_ct, mask=row_ok, other=0.0)
    else:
        cq = tl.zeros([BLOCK_M], dtype=tl.float32)
    offs_a = tl.arange(0, GATE_LANES)
    a_base = pid_bh.to(tl.int64) * T * GATE_LANES
    ka_ptrs = KA + a_base + offs_n[:, None] * GATE_LANES + offs_a[None, :]
    if GATE_MMA:
        qa = tl.load(QA + a_base + rows * GATE_LANES + offs_a[None, :], mask=row_ok[:, None], other=0.0)
    else:
        qa = tl.zeros([BLOCK_M, GATE_LANES], dtype=Q.dtype.element_ty)

    k_ptrs = K + b * stride_kb + h * stride_kh + offs_n[:, None] * stride_kt + offs_d[None, :] * stride_kd
    v_ptrs = V + b * stride_vb + h * stride_vh + offs_n[:, None] * stride_vt + offs_d[None, :] * stride_vd
    ck_ptrs = c_base + offs_n * stride_ct

    if USE_TMA:
        k_desc = tl.make_tensor_descriptor(K + b * stride_kb + h * stride_kh, [T, HEAD_DIM], strides=[stride_kt, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])  # fmt: skip
        v_desc = tl.make_tensor_descriptor(V + b * stride_vb + h * stride_vh, [T, HEAD_DIM], strides=[stride_vt, 1],
                                           block_shape=[BLOCK_N, HEAD_DIM])  # fmt: skip
        if GATE_MMA:
            ka_desc = tl.make_tensor_descriptor(KA + a_base, [T, GATE_LANES], strides=[GATE_LANES, 1],
                                                block_shape=[BLOCK_N, GATE_LANES])  # fmt: skip
            descs = (k_desc, v_desc, ka_desc)
        else:
            descs = (k_desc, v_desc, None)
    else:
        descs = (None, None, None)

    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    dcq = tl.zeros([BLOCK_M], dtype=tl.float32)
    dq, dcq = _bwd_dq_inner(
        dq, dcq, q, do, cq, lse, delta, k_ptrs, v_ptrs, ck_ptrs, qa, ka_ptrs, descs, offs_m, 0, start_m, T, sm_scale,
        mult, stride_kt, stride_vt, stride_ct, False, HAS_C, BLOCK_N, UPCAST, USE_TMA, GATE_MMA,
    )  # fmt: skip
    start64 = start_m.to(tl.int64)
    k_ptrs += start64 * stride_kt
    v_ptrs += start64 * stride_vt
    ck_ptrs += start64 * stride_ct
    ka_ptrs += start64 * GATE_LANES
    dq, dcq = _bwd_dq_inner(
        dq, dcq, q, do, cq, lse, delta, k_ptrs, v_ptrs, ck_ptrs, qa, ka_ptrs, descs, offs_m, start_m,
        tl.minimum(start_m + BLOCK_M, T), T, sm_scale, mult, stride_kt, stride_vt, stride_ct, True, HAS_C, BLOCK_N,
        UPCAST, USE_TMA, GATE_MMA,
    )  # fmt: skip

    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + rows * stride_dqt + offs_d[None, :] * stride_dqd,
             dq.to(DQ.dtype.element_ty), mask=row_ok[:, None])  # fmt: skip
    if HAS_C:  # this program owns these rows of DC: a plain read-modify-write, no atomics
        dc_ptrs = DC + b * stride_dcb + h * stride_dch + offs_m.to(tl.int64) * stride_dct
        tl.store(dc_ptrs, tl.load(dc_ptrs, mask=row_ok, other=0.0) + dcq, mask=row_ok)
