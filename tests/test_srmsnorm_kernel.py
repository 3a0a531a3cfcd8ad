"""The Triton SRMSNorm kernels against the PyTorch twin, on CPU under ``TRITON_INTERPRET=1``: the forward and the
gradient against a float64 evaluation of the twin on the same (rounded) inputs, several widths (powers of two and
not, one row a program and several), leading shapes and dtypes. Outputs are NaN-poisoned and every load and store
bounds-checked (conftest), so an unwritten element or a read past a row shows up."""

import pytest
import torch

pytest.importorskip("triton")
from conftest import interpreted_kernel_modules, rel_err

from evalsuite.kernels import srmsnorm as entry
from evalsuite.kernels import triton_utils
from evalsuite.kernels.srmsnorm import srmsnorm, srmsnorm_reference

fused = interpreted_kernel_modules("evalsuite.kernels.srmsnorm", {"fused": "_forward"})["fused"]
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2}  # the interpreter truncates float32 -> bf16: bf16 room for it

pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")


@pytest.fixture(autouse=True)
def bounds_checked():
    with triton_utils.interpreter_bounds_check():
        yield


@pytest.mark.parametrize("shape", [(5, 48), (2, 3, 64), (7, 3072 // 16), (3, 5000)])  # 5000: one row a program
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_gradient_match_the_twin(shape, dtype):
    g = torch.Generator().manual_seed(shape[-1])
    x = (torch.randn(shape, generator=g) * 3 + 0.5).to(dtype).requires_grad_()
    dy = torch.randn(shape, generator=g).to(dtype)
    y = srmsnorm(x, 1e-6, backend="triton")
    assert y.dtype == dtype and y.shape == x.shape
    x64 = x.detach().double().requires_grad_()
    y64 = srmsnorm_reference(x64, 1e-6)
    assert rel_err(y, y64) < TOL[dtype]
    (dx,) = torch.autograd.grad(y, x, dy)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double())
    assert dx.dtype == dtype and rel_err(dx, dx64) < TOL[dtype] * 4


def test_eps_and_the_mean_are_the_twins():
    """A row of tiny values is where eps shows: a kernel that dropped it, or normed by the sum instead of the mean,
    is off by orders of magnitude; the gradient of a constant row's scale is zero along the row."""
    x = torch.full((2, 40), 1e-4)
    torch.testing.assert_close(srmsnorm(x, 1e-6, backend="triton"), srmsnorm_reference(x, 1e-6), rtol=1e-6, atol=0)
    assert srmsnorm(x, 1e-6, backend="triton")[0, 0].item() == pytest.approx(1e-4 / (1e-8 + 1e-6) ** 0.5, rel=1e-6)
    ones = torch.ones(1, 40, requires_grad=True)
    (dx,) = torch.autograd.grad(srmsnorm(ones, 0.0, backend="triton"), ones, torch.ones(1, 40))
    torch.testing.assert_close(dx, torch.zeros(1, 40), atol=1e-6, rtol=0)


def test_backends_and_dispatch():
    x = torch.randn(3, 16)
    torch.testing.assert_close(srmsnorm(x, backend="reference"), srmsnorm_reference(x, 1e-6))
    assert srmsnorm(x).dtype == x.dtype  # auto on a CPU tensor: the twin
    assert entry.triton_available(x) and not entry.triton_available(torch.randn(1, entry.MAX_D + 1))
    with pytest.raises(ValueError, match="unknown SRMSNorm backend 'cuda'"):
        srmsnorm(x, backend="cuda")
    assert fused._tile(3072)[:2] == (4096, 1) and fused._tile(48)[:2] == (64, 64)
    for block_d in (64, 1024, 4096, 32768, 65536):  # the GPU's candidates: 1-16 rows, at most 32K elements a program
        rows = {c.kwargs["ROWS"] for c in fused._gpu_configs(block_d)}
        assert rows and all(r * block_d <= max(32768, block_d) for r in rows)
    assert {c.kwargs["ROWS"] for c in fused._gpu_configs(4096)} == {1, 2, 4, 8}
