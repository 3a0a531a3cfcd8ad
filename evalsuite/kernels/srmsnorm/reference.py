"""SRMSNorm in plain PyTorch: the twin of the Triton kernels (:mod:`.fused`) and the tests' ground truth.

SRMSNorm (TransNormerLLM, arXiv:2405.17381 eq. 14) is ``x / (||x||_2 / sqrt(d))`` over the last dim, with no gain;
like :func:`evalsuite.models.layers.rms_norm` (which the TNL model calls with no weight) an ``eps`` is added to the
mean square: ``y = x * rsqrt(mean(x^2) + eps)``, computed in float32 (float64 for float64 inputs) and returned in
x's dtype.
"""

from __future__ import annotations

import torch


def srmsnorm_reference(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., d]`` -> ``[..., d]`` in x's dtype; autograd's backward is the reference gradient."""
    xf = x.double() if x.dtype == torch.float64 else x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
