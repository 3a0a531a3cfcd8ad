"""Grouped Cross Attention backward (FlashGCA, arXiv:2410.01651 App. B Algorithm 2): dq, dk, dv and dw.

With ``s = scale * Q K_k^T`` the logits of retrieved chunk k, ``P_k = exp(s - L_k)`` its (off-by-one) softmax,
``O'_k = P_k V_k`` and ``O = sum_k w_k O'_k``, per query row i (Alg. 2 lines 4, 14-21):

    dP_k = dO V_k^T                      D_{i,k} = rowsum(dO o O'_k) = rowsum(P_k o dP_k)
    dV_k = w_k P_k^T dO                  dS_k   = w_k P_k o (dP_k - D_k)
    dQ   = scale * sum_k dS_k K_k        dK_k   = scale * dS_k^T Q
    dw_k = sum_{rows, heads} D_k         (dO / dw_k = O'_k)

The "+1" of Softmax_1 enters only through L: ``d exp(s_j) / (1 + sum exp) / ds_l`` has the same form as for
plain softmax, so the formulas are those of FlashAttention-2 with a weight per chunk.

Design (no atomics, deterministic):
* One program per (batch, chunk, head), grid ``(B*C*H,)``, holding the whole query chunk in one tile (Sq <= 128,
  BLOCK_M = Sq rounded up to a power of two) with Q, dO and a float32 dQ accumulator in registers. For each retrieved
  chunk k it recomputes P and dP block by block from L, writes that chunk's dK and dV blocks (no other program
  touches them: chunk (c, k) only sees the queries of chunk c), and adds its dS K to dQ. dQ is written once.
* D needs the whole row: with one key block (Skv <= BLOCK_N, DRT's 64-token chunks on GPU) it is the row sum of
  the P o dP already in registers; with several, a first pass over the key blocks computes it (two extra dots per
  block) before the gradient pass.
* dw: each program writes ``sum_rows D_k`` per (b, c, h, k) to a float32 ``[B*C*H, K]`` buffer; torch sums the
  heads (Alg. 2 line 26).
* Nothing but L ``[B*C*H, K, Sq]`` is read from the forward; O and O'_k are never needed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.grouped_cross import common
from evalsuite.kernels.grouped_cross.common import _load_tile
from evalsuite.kernels.jit_helpers import in_range, mm


@triton.jit
def _probs(q, do, lse, k_ptr, v_ptr, cols, SKV, sks, skd, svs, svd, mult,
           HEAD_DIM: tl.constexpr, EVEN_KV: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """One key block: ``(K tile, V tile, P = exp2(s - L), dP = dO V^T)``; P is 0 on keys past Skv (Alg. 2 13-16)."""
    kt = _load_tile(k_ptr, cols, SKV, sks, skd, HEAD_DIM, EVEN_KV)
    vt = _load_tile(v_ptr, cols, SKV, svs, svd, HEAD_DIM, EVEN_KV)
    zeros = tl.zeros([q.shape[0], cols.shape[0]], dtype=tl.float32)
    s = mm(q, tl.trans(kt), zeros, UPCAST, PREC) * mult
    if not EVEN_KV:
        s = tl.where((cols < SKV)[None, :], s, float("-inf"))
    p = tl.exp2(s - lse[:, None])
    dp = mm(do, tl.trans(vt), zeros, UPCAST, PREC)
    return kt, vt, p, dp


@triton.jit
def _grads(q, do, kt, vt, p, dp, delta, w, dq, dk_ptr, dv_ptr, cols, SKV, sdks, sdkd, sdvs, sdvd, scale,
           HEAD_DIM: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Store this key block's dK, dV and return ``dq + dS K`` (unscaled; Alg. 2 lines 15, 18, 20-21)."""
    zeros = tl.zeros([cols.shape[0], HEAD_DIM], dtype=tl.float32)
    dv = mm(tl.trans(p).to(do.dtype), do, zeros, UPCAST, PREC) * w
    ds = p * (dp - delta[:, None]) * w
    dk = mm(tl.trans(ds).to(q.dtype), q, zeros, UPCAST, PREC) * scale
    offs_d = tl.arange(0, HEAD_DIM)
    ca = in_range(cols, SKV)[:, None]
    col_ok = (cols < SKV)[:, None]
    tl.store(dk_ptr + ca * sdks + offs_d[None, :] * sdkd, dk.to(dk_ptr.dtype.element_ty), mask=col_ok)
    tl.store(dv_ptr + ca * sdvs + offs_d[None, :] * sdvd, dv.to(dv_ptr.dtype.element_ty), mask=col_ok)
    return mm(ds.to(kt.dtype), kt, dq, UPCAST, PREC)


@triton.jit
def _bwd_kernel(
    Q, K, V, DO, W, L, DQ, DK, DV, DWP,
    sqb, sqc, sqs, sqh, sqd,
    skb, skc, skk, sks, skh, skd,
    svb, svc, svk, svs, svh, svd,
    sob, soc, sos, soh, sod,
    sdqb, sdqc, sdqs, sdqh, sdqd,
    sdkb, sdkc, sdkk, sdks, sdkh, sdkd,
    sdvb, sdvc, sdvk, sdvs, sdvh, sdvd,
    C, H, NK, SQ, SKV, mult, scale,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, NUM_KV: tl.constexpr,
    EVEN_KV: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """dQ of one (b, c, h), dK/dV of its K retrieved chunks, and ``sum_rows D`` per chunk into DWP [B*C*H, K]."""
    pid = tl.program_id(0)
    h = (pid % H).to(tl.int64)
    bc = (pid // H).to(tl.int64)
    c = bc % C
    b = bc // C
    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < SQ
    q = _load_tile(Q + b * sqb + c * sqc + h * sqh, rows, SQ, sqs, sqd, HEAD_DIM, False)
    do = _load_tile(DO + b * sob + c * soc + h * soh, rows, SQ, sos, sod, HEAD_DIM, False)
    k_base = K + b * skb + c * skc + h * skh
    v_base = V + b * svb + c * svc + h * svh
    dk_base = DK + b * sdkb + c * sdkc + h * sdkh
    dv_base = DV + b * sdvb + c * sdvc + h * sdvh
    offs_n = tl.arange(0, BLOCK_N)
    dq = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for kk in range(NK):  # Alg. 2 line 5
        w = tl.load(W + bc * NK + kk)
        # rows past Sq: L = +inf, so P = 0 there
        lse = tl.load(L + (pid * NK + kk).to(tl.int64) * SQ + in_range(rows, SQ), mask=row_ok, other=float("inf"))
        k_ptr, v_ptr = k_base + kk * skk, v_base + kk * svk
        dk_ptr, dv_ptr = dk_base + kk * sdkk, dv_base + kk * sdvk
        if NUM_KV == 1:  # the whole chunk in one key block: D from the P o dP in registers
            kt, vt, p, dp = _probs(q, do, lse, k_ptr, v_ptr, offs_n, SKV, sks, skd, svs, svd, mult,
                                   HEAD_DIM, EVEN_KV, UPCAST, PREC)  # fmt: skip
            delta = tl.sum(p * dp, 1)
            dq = _grads(q, do, kt, vt, p, dp, delta, w, dq, dk_ptr, dv_ptr, offs_n, SKV, sdks, sdkd, sdvs, sdvd,
                        scale, HEAD_DIM, UPCAST, PREC)  # fmt: skip
        else:
            delta = tl.zeros([BLOCK_M], dtype=tl.float32)
            for j in tl.static_range(NUM_KV):  # pass 1: D = rowsum(P o dP) over the whole chunk
                cols = j * BLOCK_N + offs_n
                kt, vt, p, dp = _probs(q, do, lse, k_ptr, v_ptr, cols, SKV, sks, skd, svs, svd, mult,
                                       HEAD_DIM, EVEN_KV, UPCAST, PREC)  # fmt: skip
                delta += tl.sum(p * dp, 1)
            for j in tl.static_range(NUM_KV):  # pass 2: the gradients
                cols = j * BLOCK_N + offs_n
                kt, vt, p, dp = _probs(q, do, lse, k_ptr, v_ptr, cols, SKV, sks, skd, svs, svd, mult,
                                       HEAD_DIM, EVEN_KV, UPCAST, PREC)  # fmt: skip
                dq = _grads(q, do, kt, vt, p, dp, delta, w, dq, dk_ptr, dv_ptr, cols, SKV, sdks, sdkd, sdvs, sdvd,
                            scale, HEAD_DIM, UPCAST, PREC)  # fmt: skip
        tl.store(DWP + pid.to(tl.int64) * NK + kk, tl.sum(delta, 0))  # dw_k of this head: sum_rows D_k
    offs_d = tl.arange(0, HEAD_DIM)
    dq_ptrs = DQ + b * sdqb + c * sdqc + h * sdqh + in_range(rows, SQ)[:, None] * sdqs + offs_d[None, :] * sdqd
    tl.store(dq_ptrs, (dq * scale).to(DQ.dtype.element_ty), mask=row_ok[:, None])


def gca_bwd(do, q, k, v, w32, lse, scale: float, config=None):
    """Launch the backward. Returns ``dq`` (q's shape and dtype), ``dk``, ``dv`` (k's), ``dw [B, C, K]`` float32.

    do: ``[B, C, Sq, H, D]`` in q's dtype, any strides; q, k, v, w32, lse, scale as saved by the forward.
    ``config``: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, default :func:`common.bwd_config`'s (tests, tuning);
    BLOCK_M must cover Sq.
    """
    B, C, Sq, H, D = q.shape
    NK, Skv = k.shape[2], k.shape[3]
    BM, BN, nw, ns = config or common.bwd_config(Sq, D, q.element_size())
    assert BM >= Sq, "the backward holds the whole query chunk in one tile"
    num_kv, even_kv = common.kv_blocks(Skv, BN)
    dev = q.device
    dq = triton_utils.empty(tuple(q.shape), q.dtype, dev)
    dk = triton_utils.empty(tuple(k.shape), k.dtype, dev)
    dv = triton_utils.empty(tuple(v.shape), v.dtype, dev)
    dwp = triton_utils.empty((B * C * H, NK), torch.float32, dev)
    _bwd_kernel[(B * C * H,)](
        q, k, v, do, w32, lse, dq, dk, dv, dwp,
        *q.stride(), *k.stride(), *v.stride(), *do.stride(), *dq.stride(), *dk.stride(), *dv.stride(),
        C, H, NK, Sq, Skv, scale * common.LOG2E, scale,
        HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, NUM_KV=num_kv, EVEN_KV=even_kv,
        UPCAST=common.upcast(q.dtype), PREC=common.precision(q.dtype), num_warps=nw, num_stages=ns,
    )  # fmt: skip
    dw = dwp.view(B, C, H, NK).sum(2)
    return dq, dk, dv, dw
