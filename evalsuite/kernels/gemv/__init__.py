"""Few-row linear maps (decode-step GEMVs): one entry point that picks the Triton kernel or ``F.linear``.

``few_row_linear(x, weight, bias=None)``: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or None -> ``[..., N]``,
``x @ weight.T + bias`` in x's dtype. At a decode step x holds 1-16 rows and W (bf16, N 1K-12K, K 1K-4K: 2-24 MB) is
read once, so the map is bound by W's bytes; cuBLAS splits N into 64-column tiles, too few blocks to keep an H200's
memory busy (28 at N = 1792). The kernel (``kernel.py``) gives each 16 rows of W a program and streams them.

It runs where it applies -- triton installed, a CUDA tensor (any tensor under ``TRITON_INTERPRET=1``), 1 to
:data:`MAX_ROWS` rows, K >= 16, one dtype of bf16/fp16/fp32 for x, weight and bias, a contiguous weight (and bias),
no autocast, no gradient wanted -- and ``F.linear`` everywhere else. The kernel is the ``torch.library`` operator
``evalsuite::few_row_linear``, opaque to ``torch.compile``.

Modules: ``reference.py`` (the twin, no triton needed), ``kernel.py`` (the kernel, its launch settings and the
operator; imported with this package where triton is installed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evalsuite.kernels.gemv.reference import few_row_linear_reference
from evalsuite.kernels.triton_utils import interpreting, triton_installed

MAX_ROWS = 16  # the kernel's x tile: a program holds this many rows
MIN_K = 16  # tl.dot's smallest K
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

if triton_installed():
    # Bound here, not imported per call: the dispatcher runs inside torch.compile'd decode steps, where an import
    # statement breaks the graph.
    from evalsuite.kernels.gemv.kernel import few_row_linear_triton


def _wants_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def kernel_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`few_row_linear` takes the Triton kernel for these arguments (see the module docstring)."""
    if not (triton_installed() and (x.is_cuda or interpreting())):
        return False
    if x.dim() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        return False
    k = x.shape[-1]
    if k < MIN_K or not 1 <= x.numel() // k <= MAX_ROWS:
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype or weight.device != x.device or not weight.is_contiguous():
        return False
    if bias is not None and not (
        bias.dtype == x.dtype and bias.device == x.device and bias.shape == weight.shape[:1] and bias.is_contiguous()
    ):
        return False
    return not torch.is_autocast_enabled(x.device.type) and not _wants_grad(x, weight, bias)


def few_row_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K] @ weight[N, K].T + bias [N]`` -> ``[..., N]``: the Triton GEMV where it applies, else F.linear."""
    if kernel_applies(x, weight, bias):
        k = x.shape[-1]
        y = few_row_linear_triton(x.reshape(-1, k).contiguous(), weight, bias)
        return y.view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


__all__ = ["MAX_ROWS", "few_row_linear", "few_row_linear_reference", "kernel_applies"]
