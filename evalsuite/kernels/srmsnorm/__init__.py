"""SRMSNorm (TransNormerLLM, arXiv:2405.17381 eq. 14): one entry point that picks the Triton kernels or the PyTorch
twin.

``srmsnorm(x, eps)`` with ``x [..., d]`` returns ``x * rsqrt(mean(x^2) + eps)`` over the last dim in x's dtype.
Backends: ``"auto"`` (Triton on a CUDA tensor with d up to :data:`MAX_D`, the twin elsewhere), ``"triton"``,
``"reference"``. Modules: ``reference.py`` (no triton needed), ``fused.py`` (the forward and backward kernels and the
autograd function; imported on first use). ``evalsuite bench srmsnorm`` times them (the paper's Figure 7).
"""

from __future__ import annotations

import torch

from evalsuite.kernels.srmsnorm.reference import srmsnorm_reference
from evalsuite.kernels.triton_utils import interpreting, triton_installed

BACKENDS = ("auto", "triton", "reference")
MAX_D = 65536  # the widest row the kernels hold in one program's registers; wider rows take the twin


def triton_available(x: torch.Tensor) -> bool:
    """Whether the Triton kernels run on ``x``: a CUDA tensor (or any under the interpreter) with d <= MAX_D."""
    return triton_installed() and (x.is_cuda or interpreting()) and x.shape[-1] <= MAX_D


def srmsnorm(x: torch.Tensor, eps: float = 1e-6, backend: str = "auto") -> torch.Tensor:
    """SRMSNorm of ``x [..., d]`` over its last dim with ``backend``; see the module docstring."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown SRMSNorm backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "triton" or (backend == "auto" and x.is_cuda and triton_available(x)):
        from evalsuite.kernels.srmsnorm.fused import srmsnorm_triton

        return srmsnorm_triton(x, eps)
    return srmsnorm_reference(x, eps)


__all__ = ["BACKENDS", "srmsnorm", "srmsnorm_reference", "triton_available"]
