"""The few-row GEMV kernel (evalsuite/kernels/gemv) on CPU under ``TRITON_INTERPRET=1``: parity with a float64
evaluation of the twin on the same (rounded) inputs at 1, 3 and 16 rows, 2-D and 3-D x, N and K off the blocks (ragged
tails in both), K below the block, with and without bias, fp32, bf16 and fp16. Outputs are NaN-poisoned and every load
and store is bounds-checked on every lane (conftest), so an unwritten output or a read past a row or buffer shows up.
Then the dispatcher: the kernel where it applies, ``F.linear`` elsewhere (seen through a launcher that raises)."""

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("triton")
from conftest import interpreted_kernel_modules, rel_err

import evalsuite.kernels.gemv as gemv
from evalsuite.kernels import triton_utils
from evalsuite.kernels.gemv import MAX_ROWS, few_row_linear, few_row_linear_reference, kernel_applies

kernel = interpreted_kernel_modules("evalsuite.kernels.gemv", {"kernel": "_few_row_linear_kernel"})["kernel"]
# The interpreter truncates float32 -> bf16/fp16 (a GPU rounds): room for it, far below a missed block or tail
TOL = {torch.float32: 1e-6, torch.bfloat16: 1e-2, torch.float16: 2e-3}

pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")


@pytest.fixture(autouse=True)
def bounds_checked():
    with triton_utils.interpreter_bounds_check():
        yield


@pytest.fixture
def launches(monkeypatch):
    """The number of kernel launches the dispatcher makes (its operator, counted as it runs)."""
    count = [0]
    real = gemv.few_row_linear_triton

    def counted(*args):
        count[0] += 1
        return real(*args)

    monkeypatch.setattr(gemv, "few_row_linear_triton", counted)
    return count


def _inputs(x_shape, n, dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed + 7919 * n + x_shape[-1])
    k = x_shape[-1]
    x = torch.randn(x_shape, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype) if bias else None
    return x, w, b


def _f64(x, w, b):
    return few_row_linear_reference(x.double(), w.double(), None if b is None else b.double())


# (x shape, N): N 40 and 33 leave a ragged last block of W rows (BLOCK_N 16 under the interpreter); K 80 and 97
# leave a ragged tail after full 32-column blocks, K 20 is below the block (a 16-column block and a 4-column tail),
# K 64 has no tail, K 16 is the smallest
SHAPES = [((1, 80), 40), ((3, 97), 33), ((16, 64), 48), ((16, 97), 17), ((2, 1, 80), 40), ((4, 1, 20), 33),
          ((5, 16), 16), ((80,), 24)]  # fmt: skip


@pytest.mark.parametrize("x_shape, n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bias", [True, False])
def test_kernel_matches_the_twin_in_float64(x_shape, n, dtype, bias, launches):
    x, w, b = _inputs(x_shape, n, dtype, bias)
    y = few_row_linear(x, w, b, backend="triton")
    assert launches[0] == 1
    assert y.dtype == dtype and y.shape == (*x_shape[:-1], n)
    assert rel_err(y, _f64(x, w, b)) < TOL[dtype]


def test_float16_and_every_row_and_column_is_its_own():
    """fp16; and a check per output element: a kernel that mixed up rows of x (or of W) across programs, or wrote
    a row's result to another, fails here even where a norm over the whole output might average it away."""
    x, w, b = _inputs((16, 97), 33, torch.float16)
    y = few_row_linear(x, w, b, backend="triton")
    ref = _f64(x, w, b)
    assert rel_err(y, ref) < TOL[torch.float16]
    torch.testing.assert_close(y.double(), ref, rtol=2e-3, atol=2e-3)


def test_each_tail_column_is_summed_once():
    """All-ones x and W: each output is exactly K (+ bias) -- a tail block summed twice, or skipped, is off by its
    overlap or its width (K 97: three 32-column blocks and a tail of one, re-read as the last 32 columns)."""
    for k, n in ((97, 33), (20, 17), (64, 16)):
        x, w = torch.ones(3, k), torch.ones(n, k)
        b = torch.arange(n, dtype=torch.float32)
        torch.testing.assert_close(few_row_linear(x, w, b, backend="triton"), (k + b).expand(3, n), rtol=0, atol=0)


def test_launch_with_other_settings():
    """A config passed to the launcher: wider tiles (2 programs), a 64-column K step (its K 97 tail re-reads 64)."""
    x, w, b = _inputs((7, 97), 33, torch.float32)
    cfg = kernel.GemvConfig(block_n=32, block_k=64, num_warps=4, num_stages=1)
    y = kernel.few_row_linear_launch(x, w, b, config=cfg)
    assert rel_err(y, _f64(x, w, b)) < TOL[torch.float32]
    with pytest.raises(ValueError, match="do not fit the kernel"):
        kernel.few_row_linear_launch(torch.randn(17, 32), torch.randn(8, 32))


def test_non_contiguous_x_is_copied_first(launches):
    _, w, b = _inputs((3, 64), 24, torch.float32)
    x = torch.randn(64, 3).t()  # [3, 64], strides (1, 3)
    y = few_row_linear(x, w, b, backend="triton")
    assert launches[0] == 1
    assert rel_err(y, _f64(x, w, b)) < TOL[torch.float32]


def test_shipped_settings():
    assert kernel.ROWS == MAX_ROWS == 16
    assert kernel.default_config(torch.bfloat16) == kernel.INTERPRET_CONFIG  # under the interpreter
    for dtype, cfg in kernel.GPU_CONFIGS.items():  # 32 rows of W a program; 16 KB of W a pipeline stage
        assert cfg.block_n == 32 and cfg.block_k * torch.finfo(dtype).bits // 8 * cfg.block_n == 16384
    with pytest.raises(TypeError):
        kernel.GPU_CONFIGS[torch.float32] = kernel.INTERPRET_CONFIG


def _raising(*args):
    raise AssertionError("the Triton kernel was launched")


def _falls_back(monkeypatch, x, w, b=None):
    """``few_row_linear`` equals ``F.linear`` with the kernel's launcher made to raise: it never launched."""
    assert not kernel_applies(x, w, b)
    monkeypatch.setattr(gemv, "few_row_linear_triton", _raising)
    y = few_row_linear(x, w, b, backend="triton")
    assert torch.equal(y, F.linear(x, w, b))
    return y


def test_dispatcher_falls_back_past_sixteen_rows(monkeypatch):
    x, w, b = _inputs((MAX_ROWS + 1, 64), 24, torch.float32)
    assert kernel_applies(x[:MAX_ROWS], w, b)
    _falls_back(monkeypatch, x, w, b)
    _falls_back(monkeypatch, x.view(MAX_ROWS + 1, 1, 64), w, b)


def test_dispatcher_falls_back_when_a_gradient_is_wanted(monkeypatch):
    x, w, b = _inputs((2, 64), 24, torch.float32)
    for grad in ("x", "w", "b"):
        args = [t.clone().requires_grad_(name == grad) for name, t in zip("xwb", (x, w, b), strict=True)]
        y = _falls_back(monkeypatch, *args)
        assert y.requires_grad
        with torch.no_grad():  # no gradient wanted after all: the kernel again
            assert kernel_applies(*args)


def test_dispatcher_falls_back_on_other_layouts_and_types(monkeypatch):
    x, w, b = _inputs((2, 64), 24, torch.float32)
    _falls_back(monkeypatch, x, torch.randn(64, 24).t(), b)  # non-contiguous weight
    _falls_back(monkeypatch, x, w, torch.randn(48)[::2])  # non-contiguous bias
    _falls_back(monkeypatch, x.double(), w.double(), b.double())  # float64
    assert not kernel_applies(x.bfloat16(), w, b) and not kernel_applies(x, w, b.bfloat16())  # F.linear's error
    _falls_back(monkeypatch, x[:, :8], w[:, :8].contiguous(), b)  # K below tl.dot's 16
    _falls_back(monkeypatch, x[:0], w, b)  # no rows


def test_under_autocast_x_and_bias_are_cast_as_f_linear_would(monkeypatch, launches):
    """Autocast (the adapters' bf16 inference: fp32 activations, linear weights cast once): the kernel gets x and
    the bias in the autocast dtype and returns that dtype, as F.linear does; a weight not in it is F.linear's."""
    x, w, b = _inputs((3, 64), 24, torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = few_row_linear(x, w.bfloat16(), b, backend="triton")
        ref = F.linear(x, w.bfloat16(), b)
    assert launches[0] == 1 and y.dtype == ref.dtype == torch.bfloat16
    assert rel_err(y, _f64(x.bfloat16(), w.bfloat16(), b.bfloat16())) < TOL[torch.bfloat16]
    assert rel_err(y, ref) < TOL[torch.bfloat16]
    monkeypatch.setattr(gemv, "few_row_linear_triton", _raising)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # a float32 weight: autocast casts it per call, F.linear's job
        assert torch.equal(few_row_linear(x, w, b, backend="triton"), F.linear(x, w, b))


def test_dispatcher_takes_f_linear_on_cpu_outside_the_interpreter(monkeypatch):
    x, w, b = _inputs((2, 64), 24, torch.float32)
    assert kernel_applies(x, w, b)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    _falls_back(monkeypatch, x, w, b)


def test_auto_leaves_cpu_tensors_to_f_linear_and_reference_is_f_linear(monkeypatch):
    """``auto`` takes the kernel on CUDA tensors only (so CPU tests of models never run it interpreted), even where it
    applies; ``reference`` never takes it; an unknown backend is an error."""
    x, w, b = _inputs((2, 64), 24, torch.float32)
    assert kernel_applies(x, w, b)
    monkeypatch.setattr(gemv, "few_row_linear_triton", _raising)
    for backend in ("auto", "reference"):
        assert torch.equal(few_row_linear(x, w, b, backend=backend), F.linear(x, w, b))
    faster = [(1, 1024, 1024), (1, 50257, 2048), (8, 50257, 1536)]  # measured faster there
    slower = [(1, 7168, 1536), (1, 2048, 2048), (8, 1536, 1536)]  # and not there
    assert all(gemv.kernel_is_faster(*a) for a in faster) and not any(gemv.kernel_is_faster(*a) for a in slower)
    assert all(gemv.kernel_is_faster(*a, launched_early=True) for a in slower)  # compiled steps on Hopper
    with pytest.raises(ValueError, match="unknown GEMV backend"):
        few_row_linear(x, w, b, backend="cublas")


@pytest.mark.parametrize("autocast", [False, True])
def test_operator_stays_whole_in_a_compiled_graph(autocast):
    """``torch.compile(fullgraph=True)`` traces the dispatcher (its autocast queries too: compiled decode steps run
    under autocast) and keeps the kernel as the one opaque operator."""
    from torch._dynamo.testing import CompileCounterWithBackend

    x, w, b = _inputs((2, 1, 48), 40, torch.float32)
    if autocast:
        w = w.bfloat16()
    counter = CompileCounterWithBackend("aot_eager")
    torch._dynamo.reset()
    compiled = torch.compile(lambda x, w, b: few_row_linear(x, w, b, backend="triton") * 2, fullgraph=True,
                             backend=counter)  # fmt: skip
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        y = compiled(x, w, b)
    ops = [str(node.target) for graph in counter.graphs for node in graph.graph.nodes if node.op == "call_function"]
    assert "evalsuite.few_row_linear.default" in ops and counter.frame_count == 1
    assert y.dtype == w.dtype
    assert rel_err(y, 2 * _f64(x.to(w.dtype), w, b.to(w.dtype))) < TOL[w.dtype]


def test_vmap_over_cells_gives_each_cell_its_own_map():
    """``torch.vmap`` over stacked cells (evalsuite/training/stack.py), each with its own weight and bias, or one
    shared: every cell's output is its own ``F.linear``."""
    x, w, b = _inputs((3, 4, 64), 24, torch.float32)
    ws, bs = torch.stack([w, 2 * w, -w]), torch.stack([b, b + 1, 0 * b])
    y = torch.vmap(lambda x, w, b: few_row_linear(x, w, b, backend="triton"))(x, ws, bs)
    shared = torch.vmap(lambda x: few_row_linear(x, w, None, backend="triton"))(x)
    for c in range(3):
        torch.testing.assert_close(y[c], F.linear(x[c], ws[c], bs[c]))
        torch.testing.assert_close(shared[c], F.linear(x[c], w))
