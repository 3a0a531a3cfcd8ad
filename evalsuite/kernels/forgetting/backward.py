"""Forgetting Attention backward: launches the preprocessing, dK/dV and dQ kernels.

Design notes:
* The backward is split in two kernels, so no atomics are needed: one program per key block
  (:mod:`~evalsuite.kernels.forgetting.backward_dkdv`) accumulates dK, dV and ``dc_k = -colsum(dS)`` over query
  blocks and writes dc_k; one program per query block (:mod:`~evalsuite.kernels.forgetting.backward_dq`)
  accumulates dQ and ``dc_q = rowsum(dS)`` over key blocks and adds dc_q to its rows of dc. A small
  preprocessing kernel (here) computes ``Dvec = rowsum(dO * O)``. (In exact arithmetic rowsum(dS) = 0, but Dvec
  comes from the rounded O, and the row sums cancel that rounding error in the column sums: with sharp
  attention, dropping them made d(log f) ~10x less accurate in bf16.)
* The probabilities are recomputed from the forward's LSE (base 2), so nothing of size T x T is stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.forgetting import common
from evalsuite.kernels.forgetting.backward_dkdv import _bwd_dkdv_kernel
from evalsuite.kernels.forgetting.backward_dq import _bwd_dq_kernel
from evalsuite.kernels.forgetting.common import _scales, _strides4, _tma_usable, _upcast
from evalsuite.kernels.forgetting.gate_operands import gate_operands
from evalsuite.kernels.triton_utils import install_tma_allocator, interpreting


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


def _bwd(do, q, k, v, cum, o, lse, scale, dkdv_config=None, dq_config=None, tma=None, gate_mma=None):
    """Launch the backward. Returns dq, dk, dv (q dtype, [B, T, H, D]) and dcum ([B, T, H] fp32, or None).

    do: ``[B, T, H, D]`` output gradient (any strides; made unit-stride on D); q, k, v, cum, o, lse, scale as
    saved by the forward (lse ``[B, H, T]`` fp32, log2 units). ``dkdv_config`` / ``dq_config``: the block configs
    ``(BLOCK_M, BLOCK_N, num_warps, num_stages)``, default :func:`common.block_config`'s (tuning, tests); ``tma``
    whether the loops read their tiles through TMA descriptors (default: :func:`common.backward_tiles_through_tma`),
    used only where :func:`_tma_usable` allows it and T is a multiple of 4 (16-byte aligned LSE and Delta rows).
    ``gate_mma``: the bias through the tensor cores (:mod:`.gate_operands`, computed again here rather than kept from
    the forward; bf16 only; default :func:`common.backward_gate_through_mma`). The LSE is the same function of the
    scores either way, so this choice is free of the forward's.
    """
    B, T, H, D = q.shape
    has_c = cum is not None
    gate_mma = common.backward_gate_through_mma(D, T, q.dtype) if gate_mma is None else gate_mma
    gate_mma = bool(gate_mma and has_c and q.dtype == torch.bfloat16)
    sm_scale, mult = _scales(scale, D, has_c and not gate_mma)
    if do.stride(-1) != 1:
        do = do.contiguous()
    dev = q.device
    delta = triton_utils.empty((B, H, T), torch.float32, dev)
    pre_block = 16 if interpreting() else 128  # small under the interpreter: tests cover a ragged tail
    _bwd_preprocess_kernel[(B * H, triton.cdiv(T, pre_block))](
        o, do, delta, *_strides4(o), *_strides4(do), T, H, HEAD_DIM=D, BLOCK_M=pre_block
    )

    dq = triton_utils.empty((B, T, H, D), q.dtype, dev)
    dk = triton_utils.empty((B, T, H, D), k.dtype, dev)
    dv = triton_utils.empty((B, T, H, D), v.dtype, dev)
    dcum = triton_utils.empty((B, T, H), torch.float32, dev) if has_c else None
    c = cum if has_c else delta  # dummy pointers when there is no gate, never read
    c_strides = cum.stride() if has_c else (0, 0, 0)
    dc = dcum if has_c else delta
    dc_strides = dcum.stride() if has_c else (0, 0, 0)
    upcast = _upcast(q.dtype)
    shipped = common.block_config(D)
    use_tma = common.backward_tiles_through_tma(D, T, has_c, gate_mma) if tma is None else tma
    use_tma = use_tma and T % 4 == 0 and _tma_usable(q, k, v, do)
    if use_tma and not interpreting():
        install_tma_allocator()
    qa, ka = gate_operands(cum, sm_scale) if gate_mma else (delta, delta)  # (dummies: never read)

    BM, BN, nw, ns = dkdv_config or shipped.dkdv
    assert BN % BM == 0, "dK/dV kernel needs BLOCK_N % BLOCK_M == 0"
    _bwd_dkdv_kernel[(B * H, triton.cdiv(T, BN))](
        q, k, v, c, qa, ka, do, lse, delta, dk, dv, dc,
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do), *_strides4(dk), *_strides4(dv), *c_strides,
        *dc_strides, 1, T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, UPCAST=upcast, USE_TMA=use_tma, GATE_MMA=gate_mma,
        num_warps=nw, num_stages=ns,
    )  # fmt: skip

    BM, BN, nw, ns = dq_config or shipped.dq
    assert BM % BN == 0, "dQ kernel needs BLOCK_M % BLOCK_N == 0"
    _bwd_dq_kernel[(B * H, triton.cdiv(T, BM))](
        q, k, v, c, qa, ka, do, lse, delta, dq, dc,
        *_strides4(q), *_strides4(k), *_strides4(v), *_strides4(do), *_strides4(dq), *c_strides, *dc_strides,
        T, H, sm_scale, mult,
        HAS_C=has_c, HEAD_DIM=D, BLOCK_M=BM, BLOCK_N=BN, UPCAST=upcast, USE_TMA=use_tma, GATE_MMA=gate_mma,
        num_warps=nw, num_stages=ns,
    )  # fmt: skip
    return dq, dk, dv, dcum
