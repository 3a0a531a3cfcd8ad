"""Forgetting Attention forward over a full causal sequence, with autograd (FlashAttention-2 style).

Public entry point: :func:`forgetting_attention_triton` -- full causal forward with autograd (dq, dk, dv, dcum);
the backward kernels are in :mod:`evalsuite.kernels.forgetting.backward`. Shapes, the function and the numerics
shared with the other kernels: :mod:`evalsuite.kernels.forgetting.common`.

Design notes:
* One program per (batch, head, BLOCK_M query rows), sweeping keys BLOCK_N at a time with an online softmax;
  it writes O and the row log-sum-exp (LSE, base 2) that the backward reuses.
* Causal block skipping: a query block visits only the key blocks at or left of its diagonal, and only the
  diagonal blocks pay for masking. Ragged tails (T not a multiple of the block) are masked on load.
* On Hopper and newer the forward reads K/V tiles through per-(batch, head) TMA tensor descriptors (``BlockConfig.tma``;
  rows past T come back as zeros); pointer loads elsewhere, and for strides TMA cannot take.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import fold_rule
from evalsuite.kernels.forgetting import common
from evalsuite.kernels.forgetting.backward import _bwd
from evalsuite.kernels.forgetting.common import (
    VECTOR_STRIDES,
    BlockConfig,
    _check_inputs,
    _mm,
    _scales,
    _softmax_update,
    _strides4,
    _tma_usable,
    _upcast,
)
from evalsuite.kernels.forgetting.gate_operands import GATE_LANES, gate_operands
from evalsuite.kernels.triton_utils import install_tma_allocator, interpreting


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
    c_desc,
    qa,
    ka_ptrs,
    ka_desc,
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
    C_TMA: tl.constexpr,
    GATE_MMA: tl.constexpr,
):
    """Online-softmax sweep over keys [lo, hi) for one query block. Pointers start at key ``lo``.

    acc: [BLOCK_M, D] f32 unnormalised output; l_i, m_i: [BLOCK_M] row sums / reference maxima of s (natural units,
    softmax taken as exp2(s * mult)). MASK: diagonal block (causal mask, keys may run past T).
    USE_TMA: K/V tiles come from the tensor descriptors ``k_desc``/``v_desc`` (rows past T read as zeros),
    else from the pointers; C_TMA: the key cumsums from ``c_desc`` (zeros past T), else from ``c_ptrs``.
    GATE_MMA: the bias comes from the tensor cores instead, ``s += qa @ ka^T`` with the query block's gate operands
    ``qa`` [BLOCK_M, GATE_LANES] and the key block's (``ka_desc`` with USE_TMA, else ``ka_ptrs``): then s is in
    units of the scaled score and ``mult`` carries the scale (:func:`gate_operands`).
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
            if GATE_MMA:
                if USE_TMA:
                    ka = ka_desc.load([start_n, 0])
                elif MASK:
                    ka = tl.load(ka_ptrs, mask=cols[:, None] < T, other=0.0)
                else:
                    ka = tl.load(ka_ptrs)
            elif C_TMA:
                ck = c_desc.load([start_n])
            elif MASK:
                ck = tl.load(c_ptrs, mask=cols < T, other=0.0)
            else:
                ck = tl.load(c_ptrs)
        s = _mm(q, tl.trans(k), tl.zeros([q.shape[0], BLOCK_N], dtype=tl.float32), UPCAST)
        if HAS_C:
            if GATE_MMA:
                s = _mm(qa, tl.trans(ka), s, UPCAST)
            else:
                # subtract the two cumsums first (fp32), then add to the scaled scores
                s = s * sm_scale + (cq[:, None] - ck[None, :])
        if MASK:
            s = tl.where(offs_m[:, None] >= cols[None, :], s, float("-inf"))
        acc, l_i, m_i = _softmax_update(acc, l_i, m_i, s, v, mult, UPCAST)
        k_ptrs += BLOCK_N * stride_kt
        v_ptrs += BLOCK_N * stride_vt
        c_ptrs += BLOCK_N * stride_ct
        ka_ptrs += BLOCK_N * GATE_LANES
    return acc, l_i, m_i


@triton.jit(do_not_specialize=VECTOR_STRIDES)
def _fwd_kernel(
    Q,
    K,
    V,
    C,
    QA,
    KA,
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
    C_TMA: tl.constexpr,
    GATE_MMA: tl.constexpr,
):
    """Forward. Grid: (B*H, cdiv(T, BLOCK_M)). Writes O [B, T, H, D] and LSE [B, H, T] (log2 units).

    USE_TMA: read K/V through per-(batch, head) tensor descriptors ([T, HEAD_DIM], unit stride on the head dim,
    16-byte aligned rows: checked by the launcher), so Hopper's TMA unit fetches the tiles. C_TMA: read the key
    cumsums through a 1-D descriptor per (batch, head) (time-contiguous C, as :func:`cumsum_over_time` returns it;
    checked by the launcher): as pointer loads they can take one asynchronous copy per element and thread, in the
    score layout's columns (seen at D = 128). GATE_MMA: the bias from the gate operands QA, KA ``[B, H, T,
    GATE_LANES]`` (contiguous; :func:`gate_operands`) through the tensor cores, instead of C.
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
    if C_TMA:
        c_desc = tl.make_tensor_descriptor(c_base, [T], strides=[1], block_shape=[BLOCK_N])
    else:
        c_desc = None
    c_ptrs = c_base + offs_n * stride_ct
    if HAS_C:
        cq = tl.load(c_base + offs_m.to(tl.int64) * stride_ct, mask=row_ok, other=0.0)
    else:
        cq = tl.zeros([BLOCK_M], dtype=tl.float32)
    offs_a = tl.arange(0, GATE_LANES)
    a_base = (b * H + h) * T * GATE_LANES
    ka_ptrs = KA + a_base + offs_n[:, None] * GATE_LANES + offs_a[None, :]
    if GATE_MMA:
        qa_ptrs = QA + a_base + offs_m[:, None].to(tl.int64) * GATE_LANES + offs_a[None, :]
        qa = tl.load(qa_ptrs, mask=row_ok[:, None], other=0.0)
        if USE_TMA:
            ka_desc = tl.make_tensor_descriptor(
                KA + a_base, [T, GATE_LANES], strides=[GATE_LANES, 1], block_shape=[BLOCK_N, GATE_LANES]
            )
        else:
            ka_desc = None
    else:
        qa = tl.zeros([BLOCK_M, GATE_LANES], dtype=Q.dtype.element_ty)
        ka_desc = None

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    # keys strictly left of the block: no mask (BLOCK_M % BLOCK_N == 0, so blocks never straddle start_m)
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, cq, k_ptrs, v_ptrs, k_desc, v_desc, c_ptrs, c_desc, qa, ka_ptrs, ka_desc, offs_m, 0,
        start_m, T, sm_scale, mult, stride_kt, stride_vt, stride_ct, False, HAS_C, BLOCK_N, UPCAST, USE_TMA, C_TMA,
        GATE_MMA,
    )  # fmt: skip
    # diagonal blocks: causal mask
    k_ptrs += start_m.to(tl.int64) * stride_kt
    v_ptrs += start_m.to(tl.int64) * stride_vt
    c_ptrs += start_m.to(tl.int64) * stride_ct
    ka_ptrs += start_m.to(tl.int64) * GATE_LANES
    acc, l_i, m_i = _fwd_inner(
        acc, l_i, m_i, q, cq, k_ptrs, v_ptrs, k_desc, v_desc, c_ptrs, c_desc, qa, ka_ptrs, ka_desc, offs_m,
        start_m, tl.minimum(start_m + BLOCK_M, T), T, sm_scale, mult, stride_kt, stride_vt, stride_ct, True, HAS_C,
        BLOCK_N, UPCAST, USE_TMA, C_TMA, GATE_MMA,
    )  # fmt: skip

    # every valid row sees at least its own key, so l_i > 0 and m_i is finite there
    o = acc / l_i[:, None]
    o_ptrs = (
        Out + b * stride_ob + h * stride_oh + offs_m[:, None].to(tl.int64) * stride_ot + offs_d[None, :] * stride_od
    )
    tl.store(o_ptrs, o.to(Out.dtype.element_ty), mask=row_ok[:, None])
    lse = m_i * mult + tl.log2(l_i)
    tl.store(LSE + pid_bh.to(tl.int64) * T + offs_m, lse, mask=row_ok)


def _fwd(q, k, v, cum, scale, config=None, tma=None, c_tma=None, gate_mma=None):
    """Launch the forward. Returns o [B, T, H, D] (q dtype) and lse [B, H, T] fp32 (log2 units).

    q, k, v ``[B, T, H, D]``, cum ``[B, T, H]`` fp32 or None (inputs checked by the caller). ``config`` is the
    block config ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` and ``tma`` whether to read K/V through TMA
    (default: :func:`common.block_config`'s); TMA is still used only where :func:`_tma_usable` allows it. ``c_tma``:
    whether the key cumsums go through TMA too (default :func:`common.key_cumsums_through_tma`; only where K/V do and
    the storage allows it). ``gate_mma``: the bias through the tensor cores (:mod:`.gate_operands`; bf16 only, whose
    range holds ``c / sm_scale``; default :func:`common.gate_through_mma`).
    """
    B, T, H, D = q.shape
    shipped = common.block_config(D)
    BLOCK_M, BLOCK_N, num_warps, num_stages = config or shipped.fwd
    assert BLOCK_M % BLOCK_N == 0, "forward needs BLOCK_M % BLOCK_N == 0"
    has_c = cum is not None
    gate_mma = common.gate_through_mma(D, T, q.dtype) if gate_mma is None else gate_mma
    gate_mma = bool(gate_mma and has_c and q.dtype == torch.bfloat16)
    sm_scale, mult = _scales(scale, D, has_c and not gate_mma)
    o = triton_utils.empty((B, T, H, D), q.dtype, q.device)
    lse = triton_utils.empty((B, H, T), torch.float32, q.device)
    use_tma = shipped.tma if tma is None else tma
    use_tma = use_tma and _tma_usable(k, v)
    c_tma = common.key_cumsums_through_tma(T) if c_tma is None else c_tma
    c_tma = bool(use_tma and has_c and c_tma and common._time_contiguous(cum))
    if use_tma and not interpreting():
        install_tma_allocator()
    c = cum if has_c else lse  # dummy pointer, never read
    c_strides = cum.stride() if has_c else (0, 0, 0)
    qa, ka = gate_operands(cum, sm_scale) if gate_mma else (lse, lse)  # (dummies: never read)
    grid = (B * H, triton.cdiv(T, BLOCK_M))
    _fwd_kernel[grid](
        q, k, v, c, qa, ka, o, lse, *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(o), *c_strides,
        T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, UPCAST=_upcast(q.dtype),
        USE_TMA=use_tma, C_TMA=c_tma and not gate_mma, GATE_MMA=gate_mma,
        num_warps=num_warps, num_stages=num_stages,
    )  # fmt: skip
    return o, lse


# The kernels as two operators (torch.library), so that torch.compile (training/train.py, compile=True) keeps a model's
# forward and backward whole around them instead of breaking its graph there; Inductor runs them as they are (its own
# rewrite of the Triton kernel fails to compile, torch 2.11 / triton 3.6). The forward returns the fp32 LSE
# ``[B, H, T]`` the backward reuses; the backward returns an empty dcum without a gate. ``config``: a
# :class:`BlockConfig` as :meth:`BlockConfig.flat`, or None for the shipped one.
@torch.library.custom_op("evalsuite::forgetting_attention_fwd", mutates_args=())
def _fwd_op(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cum: torch.Tensor | None, scale: float | None,
    config: list[int] | None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    if config is None:
        return _fwd(q, k, v, cum, scale)
    cfg = BlockConfig.unflat(config)
    return _fwd(q, k, v, cum, scale, config=cfg.fwd, tma=cfg.tma)


@_fwd_op.register_fake
def _(q, k, v, cum, scale, config):
    B, T, H, _ = q.shape
    return q.new_empty(q.shape), q.new_empty((B, H, T), dtype=torch.float32)


@torch.library.custom_op("evalsuite::forgetting_attention_bwd", mutates_args=())
def _bwd_op(
    do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cum: torch.Tensor | None, o: torch.Tensor,
    lse: torch.Tensor, scale: float | None, config: list[int] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:  # fmt: skip
    cfg = None if config is None else BlockConfig.unflat(config)
    dq, dk, dv, dcum = _bwd(do, q, k, v, cum, o, lse, scale, dkdv_config=cfg and cfg.dkdv, dq_config=cfg and cfg.dq)
    return dq, dk, dv, lse.new_empty(0) if dcum is None else dcum


@_bwd_op.register_fake
def _(do, q, k, v, cum, o, lse, scale, config):
    dcum = lse.new_empty(0) if cum is None else lse.new_empty(cum.shape)
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape), dcum


def _save_for_backward(ctx, inputs, output):
    q, k, v, cum, scale, config = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, cum, o, lse)
    ctx.scale, ctx.config = scale, config


def _backward(ctx, do, _dlse):
    q, k, v, cum, o, lse = ctx.saved_tensors
    dq, dk, dv, dcum = _bwd_op(do, q, k, v, cum, o, lse, ctx.scale, ctx.config)
    return dq, dk, dv, None if cum is None else dcum, None, None


_fwd_op.register_autograd(_backward, setup_context=_save_for_backward)


@_fwd_op.register_vmap
def _(info, in_dims, q, k, v, cum, scale, config):  # the cells of a stack as more rows (kernels/cells.py)
    return fold_rule(_fwd_op, info, in_dims, (q, k, v, cum, scale, config), batched=(0, 1, 2, 3))


def forgetting_attention_triton(q, k, v, cum=None, *, scale=None, config: BlockConfig | None = None):
    """Causal Forgetting Attention (full sequence), differentiable.

    Args:
        q, k, v: ``[B, T, H, D]`` bfloat16 or float16, any strides; D in (16, 32, 64, 128).
        cum: ``[B, T, H]`` float32 cumulative log forget gates (``cumsum(log f, dim=1)``; on GPU prefer
            :func:`cumsum_over_time`, torch's dim=1 cumsum is slow at long T), or None for plain causal
            attention. Gradients flow to ``cum`` (``dcum_i = sum_j dS_ij - sum_j dS_ji``); autograd through the
            caller's cumsum turns them into ``d log f``.
        scale: logit scale, default ``1/sqrt(D)``.
        config: the forward's and backward's launch settings, default :func:`common.block_config` (tuning, tests).
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
    flat = None if config is None else config.flat()
    return _fwd_op(q, k, v, cum, None if scale is None else float(scale), flat)[0]
