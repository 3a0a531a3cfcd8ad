"""The few-row linear map in plain PyTorch: the twin of the Triton GEMV (:mod:`.kernel`) and the tests' ground truth.

``y = x @ weight.T + bias`` -- exactly :func:`torch.nn.functional.linear` (cuBLAS on a GPU), which the dispatcher
also falls back to wherever the kernel does not apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def few_row_linear_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x [..., K]``, ``weight [N, K]``, ``bias [N]`` or None -> ``[..., N]`` in x's dtype (differentiable)."""
    return F.linear(x, weight, bias)
