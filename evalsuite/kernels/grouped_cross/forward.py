"""Grouped Cross Attention forward (FlashGCA, arXiv:2410.01651 App. B Algorithm 1), with autograd.

Public entry point: :func:`gca_triton`; the backward kernel is in :mod:`.backward`, shapes and numerics in
:mod:`.common`.

Design:
* One program per (batch, chunk, head, BLOCK_M query rows); grid ``(B*C*H, cdiv(Sq, BLOCK_M))``. On GPU BLOCK_M is
  the query chunk rounded up to a power of two (at most 128), so each retrieved chunk's K/V is read once per
  (chunk, head). For each retrieved chunk k the program runs an online-softmax pass over that chunk's key blocks
  (Alg. 1 lines 8-14, with the off-by-one init of :mod:`.common`), normalises it (line 15) and accumulates
  ``w_k O'_k`` in registers (line 16). O is written once.
* Saved for the backward: q, k, v, w and the per-chunk log-sum-exp ``L [B*C*H, K, Sq]`` float32 (Alg. 1 line 18).
  The per-chunk outputs ``O'_k`` (Alg. 1 line 17) are *not* written: they would cost K times the output
  (K * 2 * D bytes per query row and head in bf16, 1 KiB at K = 8, D = 64), against ``4 K`` bytes for L (32 B).
  The backward needs ``O'_k`` only through ``D_k = rowsum(dO o O'_k)``, which equals ``rowsum(P_k o dP_k)``
  with the probabilities it recomputes anyway (:mod:`.backward`). O itself is not saved either.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import fold_rule
from evalsuite.kernels.grouped_cross import common
from evalsuite.kernels.grouped_cross.common import _load_tile
from evalsuite.kernels.jit_helpers import in_range, mm


@triton.jit
def _fwd_kernel(
    Q, K, V, W, Out, L,
    sqb, sqc, sqs, sqh, sqd,
    skb, skc, skk, sks, skh, skd,
    svb, svc, svk, svs, svh, svd,
    sob, soc, sos, soh, sod,
    C, H, NK, SQ, SKV, mult,
    SOFTMAX_ONE: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_KV: tl.constexpr, EVEN_KV: tl.constexpr, UPCAST: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """O ``[B, C, Sq, H, D]`` (q dtype) and L ``[B*C*H, K, Sq]`` (float32, base 2) for one query block."""
    pid = tl.program_id(0)
    h = (pid % H).to(tl.int64)
    bc = (pid // H).to(tl.int64)
    c = bc % C
    b = bc // C
    rows = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = rows < SQ
    q = _load_tile(Q + b * sqb + c * sqc + h * sqh, rows, SQ, sqs, sqd, HEAD_DIM, False)
    k_base = K + b * skb + c * skc + h * skh
    v_base = V + b * svb + c * svc + h * svh
    offs_n = tl.arange(0, BLOCK_N)
    out = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for kk in range(NK):  # the retrieved chunks (Alg. 1 line 7)
        w = tl.load(W + bc * NK + kk)
        if SOFTMAX_ONE:  # the "+1": a zero logit (m = 0) already counted in the denominator (l_i = 1)
            m = tl.zeros([BLOCK_M], dtype=tl.float32)
            l_i = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        else:
            m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
            l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
        for j in tl.static_range(NUM_KV):  # Alg. 1 lines 9-14: online softmax over the chunk's key blocks
            cols = j * BLOCK_N + offs_n
            kt = _load_tile(k_base + kk * skk, cols, SKV, sks, skd, HEAD_DIM, EVEN_KV)
            vt = _load_tile(v_base + kk * svk, cols, SKV, svs, svd, HEAD_DIM, EVEN_KV)
            s = mm(q, tl.trans(kt), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST, PREC) * mult
            if not EVEN_KV:
                s = tl.where((cols < SKV)[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = mm(p.to(vt.dtype), vt, acc * alpha[:, None], UPCAST, PREC)
            m = m_new
        out += acc * (w / l_i)[:, None]  # lines 15-16: O += w_k diag(l)^-1 acc
        tl.store(L + (pid * NK + kk).to(tl.int64) * SQ + in_range(rows, SQ), m + tl.log2(l_i), mask=row_ok)
    offs_d = tl.arange(0, HEAD_DIM)
    o_ptrs = Out + b * sob + c * soc + h * soh + in_range(rows, SQ)[:, None] * sos + offs_d[None, :] * sod
    tl.store(o_ptrs, out.to(Out.dtype.element_ty), mask=row_ok[:, None])


def gca_fwd(q, k, v, w32, softmax_one: bool, scale: float, config=None):
    """Launch the forward. Returns ``(o [B, C, Sq, H, D]`` in q's dtype, ``lse [B*C*H, K, Sq]`` float32).

    q, k, v as checked by :func:`common.check_inputs`; ``w32`` ``[B, C, K]`` contiguous float32. ``config``:
    ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, default :func:`common.fwd_config`'s (tests, tuning).
    """
    B, C, Sq, H, D = q.shape
    NK, Skv = k.shape[2], k.shape[3]
    BM, BN, nw, ns = config or common.fwd_config(Sq, D, q.element_size())
    num_kv, even_kv = common.kv_blocks(Skv, BN)
    o = triton_utils.empty((B, C, Sq, H, D), q.dtype, q.device)
    lse = triton_utils.empty((B * C * H, NK, Sq), torch.float32, q.device)
    _fwd_kernel[(B * C * H, triton.cdiv(Sq, BM))](
        q, k, v, w32, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        C, H, NK, Sq, Skv, scale * common.LOG2E,
        SOFTMAX_ONE=softmax_one, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, NUM_KV=num_kv, EVEN_KV=even_kv,
        UPCAST=common.upcast(q.dtype), PREC=common.precision(q.dtype), num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return o, lse


class GCAFunction(torch.autograd.Function):
    """Autograd wrapper of :func:`gca_fwd` and :func:`.backward.gca_bwd`; returns ``(o, L)`` (L an output so that it
    can be saved; not differentiable) and saves q, k, v, w (float32) and L. Under ``torch.vmap`` the cells of a
    stacked model fold into the batch (:mod:`evalsuite.kernels.cells`)."""

    @staticmethod
    def forward(q, k, v, w, softmax_one, scale, config):
        launch = common.fwd_config(q.shape[2], q.shape[-1], q.element_size(), config)
        return gca_fwd(q, k, v, _w32(w), softmax_one, scale, config=launch)

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, w, _, scale, config = inputs
        ctx.save_for_backward(q, k, v, _w32(w), output[1])
        ctx.mark_non_differentiable(output[1])
        ctx.scale, ctx.w_dtype, ctx.config = scale, w.dtype, config

    @staticmethod
    def backward(ctx, do, _dlse):
        from evalsuite.kernels.grouped_cross.backward import gca_bwd

        q, k, v, w32, lse = ctx.saved_tensors
        launch = common.bwd_config(q.shape[2], q.shape[-1], q.element_size(), ctx.config)
        dq, dk, dv, dw = gca_bwd(do.to(q.dtype), q, k, v, w32, lse, ctx.scale, config=launch)
        return dq, dk, dv, dw.to(ctx.w_dtype), None, None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, w, softmax_one, scale, config):
        args = (q, k, v, w, softmax_one, scale, config)
        return fold_rule(GCAFunction.apply, info, in_dims, args, batched=(0, 1, 2, 3))


def _w32(w: torch.Tensor) -> torch.Tensor:
    return w.detach().to(torch.float32).contiguous()


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


@torch.compiler.disable
def gca_triton(q, k, v, w, *, softmax_one: bool = True, scale: float | None = None,
               config: common.BlockConfig | None = None) -> torch.Tensor:  # fmt: skip
    """Grouped cross attention with the Triton kernels, differentiable in q, k, v and w.

    Args:
        q: ``[B, C, Sq, H, D]``; k, v: ``[B, C, K, Skv, H, D]`` -- one dtype of bf16/fp16/fp32, any strides, one
            device (CUDA, or CPU under ``TRITON_INTERPRET=1``); D in (16, 32, 64, 128); Sq <= 128 when a
            gradient is needed (the backward holds a query chunk in one tile).
        w: ``[B, C, K]`` fusion weights (computed in float32; its gradient comes back in w's dtype).
        softmax_one: Softmax_1 (``exp(x_i) / (1 + sum_j exp(x_j))``) per retrieved chunk, else plain softmax.
        scale: logit scale, default ``1/sqrt(D)``.
        config: block settings (tuning, tests); default :func:`common.block_config`.
    Returns:
        ``[B, C, Sq, H, D]`` in q's dtype.
    """
    common.check_inputs(q, k, v, w)
    scale = common.scale_of(scale, q.shape[-1])
    if q.numel() == 0 or k.numel() == 0:  # no queries, no retrieved chunks or empty chunks: the reference's answer
        from evalsuite.kernels.grouped_cross.reference import gca_reference

        return gca_reference(q, k, v, w, softmax_one=softmax_one, scale=scale)
    if q.shape[2] > common.MAX_SQ and _needs_grad(q, k, v, w):
        raise ValueError(f"the GCA backward takes query chunks of at most {common.MAX_SQ} rows, got {q.shape[2]}")
    return GCAFunction.apply(q, k, v, w, bool(softmax_one), scale, config)[0]
