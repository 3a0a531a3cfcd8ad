"""The few-row GEMV kernel on a GPU at decode shapes (bf16, 1-16 rows, the linear maps of the 760M-1.3B models)
against a float64 evaluation on the same inputs; inside a CUDA graph, and inside ``torch.compile(fullgraph=True)``
(the operator kept whole: the same bits as the eager kernel)."""

import pytest
import torch
import torch.nn.functional as F

from evalsuite.kernels.gemv import few_row_linear, kernel_applies

pytestmark = pytest.mark.gpu

SHAPES = [(1792, 2048), (11008, 2048), (2048, 5504), (3072, 1024)]  # (N, K)


def _rel(a, b) -> float:
    assert a.isfinite().all()
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _inputs(m, n, k, bias=True, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed + n + k + m)
    x = torch.randn(m, k, device="cuda", generator=g).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=g) / k**0.5).bfloat16()
    b = torch.randn(n, device="cuda", generator=g).bfloat16() if bias else None
    return x, w, b


def _f64(x, w, b):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("n, k", SHAPES)
@pytest.mark.parametrize("m", [1, 8, 16])
def test_kernel_matches_float64_at_decode_shapes(m, n, k):
    for bias in (True, False):
        x, w, b = _inputs(m, n, k, bias)
        assert kernel_applies(x, w, b)
        y = few_row_linear(x, w, b, backend="triton")
        assert y.shape == (m, n) and y.dtype == torch.bfloat16
        assert _rel(y, _f64(x, w, b)) < 5e-3  # bf16 output rounding: about 2e-3
        assert _rel(y, F.linear(x, w, b)) < 5e-3
    x3 = x.view(m, 1, k)  # a decode step's [B, 1, K]
    torch.testing.assert_close(few_row_linear(x3, w, b, backend="triton"), y.view(m, 1, n), rtol=0, atol=0)


@pytest.mark.parametrize("n, k", [(1792, 2048), (2048, 5504)])
def test_kernel_in_a_cuda_graph(n, k):
    x, w, b = _inputs(4, n, k)
    static_x = x.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        few_row_linear(static_x, w, b, backend="triton")  # compiled and warm before the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = few_row_linear(static_x, w, b, backend="triton")
    for seed in (1, 2):
        fresh, _, _ = _inputs(4, n, k, seed=seed)
        static_x.copy_(fresh)
        static_y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(static_y, _f64(fresh, w, b)) < 5e-3
        torch.testing.assert_close(static_y, few_row_linear(fresh, w, b, backend="triton"), rtol=0, atol=0)


def test_kernel_under_torch_compile():
    x, w, b = _inputs(8, 3072, 1024)
    eager = few_row_linear(x.view(8, 1, 1024), w, b, backend="triton")
    compiled = torch.compile(lambda x, w, b: few_row_linear(x, w, b, backend="triton"), fullgraph=True)
    out = compiled(x.view(8, 1, 1024), w, b)
    torch.testing.assert_close(out, eager, rtol=0, atol=0)  # the operator itself, not a lowering of F.linear
    assert _rel(out, _f64(x, w, b).view(8, 1, 3072)) < 5e-3


def test_auto_takes_the_kernel_where_it_measured_faster():
    """``auto`` on CUDA, called eagerly: the kernel for a small map and an LM head (the same bits as ``triton``),
    cuBLAS for a stacked map between them (the same bits as F.linear)."""
    import evalsuite.kernels.gemv as gemv

    for n, k, kernel in ((1024, 1024, True), (50257, 1536, True), (7168, 1536, False)):
        x, w, _ = _inputs(1, n, k)
        assert gemv.kernel_is_faster(1, n, k) == kernel
        expected = few_row_linear(x, w, backend="triton") if kernel else F.linear(x, w)
        torch.testing.assert_close(few_row_linear(x, w), expected, rtol=0, atol=0)
