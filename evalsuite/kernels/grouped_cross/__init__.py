"""Grouped Cross Attention (GCA, arXiv:2410.01651): one entry point that picks the Triton kernel or its reference.

``grouped_cross_attention(q, k, v, w, softmax_one=..., scale=..., backend=...)``: q ``[B, C, Sq, H, D]``, k/v
``[B, C, K, Skv, H, D]`` (each query chunk's K retrieved chunks), w ``[B, C, K]`` float32 fusion weights; returns
``[B, C, Sq, H, D]``. Differentiable in q, k, v and w (the gradient of w is what trains DRT's retriever). Math:
:mod:`.reference`; kernels: :mod:`.forward` (Alg. 1) and :mod:`.backward` (Alg. 2).

Backends: ``"auto"`` (Triton on CUDA, the reference elsewhere), ``"triton"``, ``"reference"``.

Dtype rules of the Triton path (the reference computes in float32 whatever it gets): q, k and v take one dtype --
the autocast dtype while autocast is on (the kernels are opaque to it, as a matmul's inputs would be cast), else
q's (k and v are cast to it); w is used in float32. The output is in that dtype. ``"auto"`` takes the reference
when a gradient is needed and a query chunk has more than :data:`MAX_TRITON_SQ` rows (the backward's tile).
"""

from __future__ import annotations

import torch

from evalsuite.kernels.grouped_cross.reference import MAX_TRITON_SQ, check_shapes, gca_reference
from evalsuite.kernels.triton_utils import triton_installed

BACKENDS = ("auto", "triton", "reference")
__all__ = ["BACKENDS", "MAX_TRITON_SQ", "gca_reference", "grouped_cross_attention", "triton_available"]


def triton_available(t: torch.Tensor) -> bool:
    """The kernel runs on CUDA tensors in bf16/fp16/fp32 with head dim 16-128; elsewhere the reference runs."""
    ok = t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32) and t.shape[-1] in (16, 32, 64, 128)
    return ok and triton_installed()


def _triton_inputs(q, k, v):
    """q, k, v in one dtype: autocast's while it is on, else q's (see the module doc)."""
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _fits_triton(q, k, v, w) -> bool:
    """The backward keeps a whole query chunk in one block: up to MAX_TRITON_SQ rows, and in float32 at most 64 rows
    and one 64 x 64 tile (a 65-row chunk, a 128-row block, needs 246 KB of shared memory at D = 32 and 288 KB at
    D = 64; an H100 has 227 KB)."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, w))
    if not needs_grad:
        return True
    device = q.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else q.dtype
    rows = max(16, 1 << (q.shape[2] - 1).bit_length())
    return q.shape[2] <= MAX_TRITON_SQ and (dtype != torch.float32 or (rows <= 64 and rows * q.shape[-1] <= 64 * 64))


def grouped_cross_attention(q, k, v, w, *, softmax_one: bool = True, scale: float | None = None, backend: str = "auto"):
    """Grouped cross attention with the chosen backend; see the module docstring for shapes."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown GCA backend {backend!r}; choose from {', '.join(BACKENDS)}")
    check_shapes(q, k, v, w)
    if backend == "auto":
        backend = "triton" if triton_available(q) and _fits_triton(q, k, v, w) else "reference"
    if backend == "reference":
        return gca_reference(q, k, v, w, softmax_one=softmax_one, scale=scale)
    from evalsuite.kernels.grouped_cross.forward import gca_triton

    q, k, v = _triton_inputs(q, k, v)
    return gca_triton(q, k, v, w, softmax_one=softmax_one, scale=scale)
