"""The Triton SRMSNorm kernels on a GPU (bf16, the widths of the Lightning paper's Figure 7) against the float64
twin, forward and gradient."""

import pytest
import torch

from evalsuite.kernels.srmsnorm import srmsnorm, srmsnorm_reference

pytestmark = pytest.mark.gpu


def _rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("d", [3072, 8192, 16384, 1000])
def test_kernels_match_the_twin_in_bf16(d):
    g = torch.Generator(device="cuda").manual_seed(d)
    x = torch.randn(4, 512, d, device="cuda", generator=g).bfloat16().requires_grad_()
    dy = torch.randn(x.shape, device="cuda", generator=g).bfloat16()
    y = srmsnorm(x, 1e-6)  # auto: the kernels on a CUDA tensor
    x64 = x.detach().double().requires_grad_()
    y64 = srmsnorm_reference(x64, 1e-6)
    assert _rel(y, y64) < 5e-3
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    assert _rel(dx, dx64) < 1e-2
