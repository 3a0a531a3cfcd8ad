"""The Triton Forgetting Attention kernels against the PyTorch reference, on CPU under ``TRITON_INTERPRET=1``.

Every check compares the kernel (bf16/fp16 inputs, fp32 accumulation) with ``reference.attention_dense`` run in
float64 on the same (rounded) inputs, by relative error ``|out - ref| / |ref|``. Outputs are poisoned with NaN
before each launch, so an element the kernel never writes fails the check.
"""

import dataclasses
import importlib
import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreted_kernel_modules, rel_err

from evalsuite.errors import UserError
from evalsuite.kernels import triton_utils
from evalsuite.kernels.forgetting import cumsum_over_time, reference

# One kernel per module, checked to be interpreted (conftest.interpreted_kernel_modules).
_KERNELS = {
    "common": "_mm",
    "backward_dkdv": "_bwd_dkdv_kernel",
    "backward_dq": "_bwd_dq_kernel",
    "backward": "_bwd_preprocess_kernel",
    "forward": "_fwd_kernel",
    "cumsum": "_time_scan_kernel",
}
_modules = interpreted_kernel_modules("evalsuite.kernels.forgetting", _KERNELS)
common, backward, forward, cumsum = (_modules[n] for n in ("common", "backward", "forward", "cumsum"))

# bf16 keeps 8 mantissa bits; gradients also go through the bf16-rounded output (Dvec = rowsum(dO * O)),
# which costs a few more bits when attention is sharp (strong gates). fp16 keeps 11 bits.
TOL = {torch.float16: (3e-3, 5e-3), torch.bfloat16: (1e-2, 2.5e-2)}  # (forward, gradients)


pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # conftest: NaN outputs, guard bands


def make_inputs(B, T, H, D, dtype, gate, seed=0):
    """Random q, k, v [B, T, H, D] and log forget gates [B, T, H] (None for no gate).

    gate "mild": log f ~ -0.01 (long memory); "strong": log f ~ -3 (attention to the last few tokens).
    """
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, D, generator=g).to(dtype) for _ in range(3))
    if gate is None:
        return q, k, v, None
    mean = {"mild": -0.01, "strong": -3.0}[gate]
    logf = mean * (0.5 + torch.rand(B, T, H, generator=g))  # in [1.5 mean, 0.5 mean]
    return q, k, v, logf


def run_kernel(q, k, v, logf, do, fwd_config=None, dkdv_config=None, dq_config=None, config=None):
    """Forward + backward through the kernel; gradients w.r.t. q, k, v and log f (through the cumsum)."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    if logf is not None:
        leaves.append(logf.clone().requires_grad_())
    cum = None if logf is None else leaves[3].cumsum(1)
    if fwd_config is None and dkdv_config is None and dq_config is None:
        o = forward.forgetting_attention_triton(*leaves[:3], cum, config=config)
    else:
        fwd, bwd = forward._fwd, backward._bwd

        class Fn(torch.autograd.Function):  # the same launches, with explicit block configs
            @staticmethod
            def forward(ctx, q, k, v, cum):
                o, lse = fwd(q, k, v, cum, None, config=fwd_config)
                ctx.save_for_backward(q, k, v, cum, o, lse)
                return o

            @staticmethod
            def backward(ctx, do):
                q, k, v, cum, o, lse = ctx.saved_tensors
                return bwd(do, q, k, v, cum, o, lse, None, dkdv_config=dkdv_config, dq_config=dq_config)

        o = Fn.apply(*leaves[:3], cum)
    grads = torch.autograd.grad(o, leaves, do)
    return o.detach(), grads


def run_reference(q, k, v, logf, do):
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    if logf is not None:
        leaves.append(logf.double().requires_grad_())
    cum = None if logf is None else leaves[3].cumsum(1)
    o = reference.attention_dense(*leaves[:3], cum, cum)
    grads = torch.autograd.grad(o, leaves, do.double())
    return o.detach(), grads


def check_full(B, T, H, D, dtype, gate, seed=0, **configs):
    q, k, v, logf = make_inputs(B, T, H, D, dtype, gate, seed)
    do = torch.randn(B, T, H, D, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    o, grads = run_kernel(q, k, v, logf, do, **configs)
    o_ref, grads_ref = run_reference(q, k, v, logf, do)
    assert o.shape == (B, T, H, D) and o.dtype == dtype
    tol_fwd, tol_bwd = TOL[dtype]
    errors = {"o": rel_err(o, o_ref)}
    for name, g, g_ref in zip(("dq", "dk", "dv", "dlogf"), grads, grads_ref, strict=False):
        assert g.shape == g_ref.shape
        errors[name] = rel_err(g, g_ref)
    assert errors["o"] < tol_fwd, errors
    assert all(e < tol_bwd for e in errors.values()), errors
    return errors


# Interpreter block sizes (common.INTERPRET_*): forward and dQ 32 queries x 16 keys, dK/dV 16 queries x 32 keys.
# Sequence lengths below are kept small (the interpreter's cost grows with T^2) but not multiples of 16, and above
# 32, so each launch has several query and key blocks, unmasked off-diagonal blocks, and a ragged last block;
# test_shapes_cover_several_and_ragged_blocks guards that. T = 1 and 17 are the degenerate single-block cases;
# T = 48 is a multiple of 16 but not of 32 (every 16-block full: dK/dV's ragged-tail step is then empty).
# (dtype, T, D, gate): every head dim, every gate kind, both dtypes.
FULL_CASES = [
    (torch.bfloat16, 1, 64, "mild"),
    (torch.bfloat16, 17, 32, "strong"),
    (torch.bfloat16, 70, 64, "mild"),
    (torch.bfloat16, 50, 64, None),
    (torch.bfloat16, 90, 64, "strong"),
    (torch.bfloat16, 48, 128, "mild"),
    (torch.float16, 70, 32, None),
    (torch.float16, 60, 128, "strong"),
    (torch.float16, 100, 32, "mild"),
    (torch.float16, 40, 16, "strong"),
]


def test_shapes_cover_several_and_ragged_blocks():
    """The full-sequence test lengths span several interpreter blocks of 32, the last one partial."""
    assert {*common.INTERPRET_FWD[:2], *common.INTERPRET_DKDV[:2], *common.INTERPRET_DQ[:2]} == {16, 32}
    for T in [t for _, t, _, _ in FULL_CASES if t > 32] + [40, 50]:  # + the TMA and strided-input tests
        assert T > 32 and T % 32, T


@pytest.mark.parametrize("dtype,T,D,gate", FULL_CASES)
def test_full_forward_backward(dtype, T, D, gate):
    check_full(2, T, 2, D, dtype, gate)


def test_gpu_like_block_ratios():
    """Other block shapes than the interpreter defaults (BLOCK_M = 2 * BLOCK_N etc., as on the GPU).

    T = 100 with 64/32 blocks: two query blocks, and the first dK/dV key block has all three phases (diagonal,
    one full query block, a ragged tail); T = 50 with 16 x 16 blocks: square blocks, ragged tail.
    """
    check_full(1, 100, 2, 32, torch.float16, "mild", fwd_config=(64, 32, 4, 1),
               dkdv_config=(32, 64, 4, 1), dq_config=(64, 32, 4, 1))  # fmt: skip
    check_full(1, 50, 1, 32, torch.float16, "strong", fwd_config=(16, 16, 4, 1),
               dkdv_config=(16, 16, 4, 1), dq_config=(16, 16, 4, 1))  # fmt: skip


@pytest.mark.parametrize("tma", [True, False])
def test_tma_and_pointer_loads(tma):
    """The forward reads K/V through TMA tensor descriptors or through pointers: the same function either way."""
    config = dataclasses.replace(common.block_config(32), tma=tma)
    check_full(2, 50, 2, 32, torch.bfloat16, "strong", config=config)
    check_full(1, 40, 2, 32, torch.float16, None, config=config)


def test_tma_falls_back_on_misaligned_strides():
    """Rows that are not 16-byte aligned cannot go through TMA: the launcher takes the pointer path instead."""
    tma = dataclasses.replace(common.block_config(32), tma=True)
    B, T, H, D = 1, 40, 3, 32
    row = H * D + 4  # 200 bytes in bf16: not a multiple of 16
    g = torch.Generator().manual_seed(5)
    store = torch.randn(3, B * T * row, generator=g).to(torch.bfloat16)
    q, k, v = (x.as_strided((B, T, H, D), (T * row, row, D, 1)) for x in store)
    aligned = [x.contiguous() for x in (q, k, v)]
    assert not common._tma_usable(k, v) and common._tma_usable(*aligned[1:])
    cum = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g)).cumsum(1)
    out = forward.forgetting_attention_triton(q, k, v, cum, config=tma)
    ref = reference.attention_dense(q.double(), k.double(), v.double(), cum.double(), cum.double())
    assert rel_err(out, ref) < TOL[torch.bfloat16][0]
    assert torch.equal(out, forward.forgetting_attention_triton(*aligned, cum, config=tma))


def test_cumsum_over_time():
    logf = -torch.rand(2, 37, 3, dtype=torch.float64).float().requires_grad_()
    cum = cumsum_over_time(logf)
    assert cum.shape == logf.shape and cum.dtype == torch.float32
    torch.testing.assert_close(cum, logf.cumsum(1))
    g = torch.randn(2, 37, 3)
    (grad,) = torch.autograd.grad(cum, logf, g)
    torch.testing.assert_close(grad, g.flip(1).cumsum(1).flip(1))


@pytest.mark.parametrize("T", [1, 16, 17, 70])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cumsum_triton_matches_torch(T, dtype):
    """The Triton time scan (blocks of 16 under the interpreter, so T = 70 spans 5 with a carry) against
    torch.cumsum, forward and backward, on a strided [B, T, H] view in float32 and bfloat16."""
    g = torch.Generator().manual_seed(T)
    packed = torch.nn.functional.logsigmoid(torch.randn(2, T, 2, 3, generator=g)).to(dtype)
    logf = packed[:, :, 1].requires_grad_()  # [2, T, 3], not contiguous
    cum = cumsum.cumsum_over_time_triton(logf)
    assert cum.dtype == torch.float32 and cum.stride(1) == 1  # time-major storage
    torch.testing.assert_close(cum, logf.detach().double().cumsum(1).float(), rtol=1e-5, atol=1e-5)
    grad_cum = torch.randn(2, T, 3, generator=g)
    (grad,) = torch.autograd.grad(cum, logf, grad_cum)
    assert grad.dtype == dtype
    expected = grad_cum.double().flip(1).cumsum(1).flip(1)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(grad.double(), expected, rtol=tol, atol=tol)


def test_time_scan_operator_passes_opcheck(monkeypatch):
    """The scan's operator, both ways: schema, fake outputs (shape, dtype and strides: time-major forward, plain
    reverse) as the real ones, autograd registration and AOT dispatch (torch.library.opcheck)."""
    # plain buffers: opcheck would report the poisoned ones' guard band as a storage offset the fake lacks
    monkeypatch.setattr(triton_utils, "empty", lambda shape, dtype, device: torch.empty(shape, dtype=dtype))
    x = torch.randn(2, 20, 3, generator=torch.Generator().manual_seed(3)).requires_grad_()
    for reverse in (False, True):
        torch.library.opcheck(cumsum._time_scan, (x, reverse))


def test_key_cumsums_through_tma_and_pointers():
    """Time-major cumsums (``cumsum_over_time``'s storage, T a multiple of 4) go through 1-D TMA descriptors, others
    through pointers, in the forward and both backward kernels: the same arithmetic, so the same bits, outputs and
    gradients; T = 52 leaves a ragged last block."""
    tma = dataclasses.replace(common.block_config(32), tma=True)
    B, T, H, D = 2, 52, 2, 32
    g = torch.Generator().manual_seed(9)
    q, k, v, do = (torch.randn(B, T, H, D, generator=g).to(torch.bfloat16) for _ in range(4))
    logf = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g) + 2.0)
    time_major = cumsum_over_time(logf)
    plain = time_major.contiguous()
    assert common._time_contiguous(time_major) and not common._time_contiguous(plain)
    runs = []
    for cum in (time_major, plain):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, cum)]
        out = forward.forgetting_attention_triton(*leaves, config=tma)
        runs.append((out, *torch.autograd.grad(out, leaves, do)))
    for a, b in zip(*runs, strict=True):
        assert torch.equal(a, b)
    ref = reference.attention_dense(q.double(), k.double(), v.double(), plain.double(), plain.double())
    assert rel_err(runs[0][0], ref) < TOL[torch.bfloat16][0]


@pytest.mark.parametrize("gate", [None, "strong"])
def test_backward_tiles_through_tma_and_pointers(gate):
    """The backward reads q, dO, LSE, Delta (dK/dV kernel) and K, V (dQ kernel) through TMA descriptors or through
    pointers (``tma``; the default follows the measured T bands, :func:`common.backward_tiles_through_tma`): with the
    same inputs both give the same bits."""
    B, T, H, D = 1, 44, 2, 32
    g = torch.Generator().manual_seed(4)
    q, k, v, do = (torch.randn(B, T, H, D, generator=g).to(torch.float16) for _ in range(4))
    cum = None if gate is None else torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g)).cumsum(1)
    o, lse = forward._fwd(q, k, v, cum, None)
    through_tma = backward._bwd(do, q, k, v, cum, o, lse, None, tma=True)
    through_pointers = backward._bwd(do, q, k, v, cum, o, lse, None, tma=False)
    for a, b in zip(through_tma, through_pointers, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)
    assert common.backward_tiles_through_tma(32, T, gate is not None)  # under the interpreter: always


def test_strided_inputs_and_large_cum():
    """q/k/v are views into a packed [B, T, 3, H, D] tensor, cum is a transposed view, and |c| ~ 1e4.

    A constant shift of c changes nothing mathematically; the kernel must subtract c_i - c_j before adding it
    to the scores to keep the result (the reference runs in float64 on the same fp32 values).
    """
    B, T, H, D = 2, 50, 3, 32
    g = torch.Generator().manual_seed(3)
    qkv = torch.randn(B, T, 3, H, D, generator=g).to(torch.bfloat16)
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    logf = -0.5 * torch.rand(B, T, H, generator=g)
    cum_bht = (logf.cumsum(1) - 1.0e4).transpose(1, 2).contiguous()  # stored [B, H, T]
    cum = cum_bht.transpose(1, 2)  # viewed [B, T, H], strided
    do = torch.randn(B, T, H, D, generator=g).to(torch.bfloat16)

    qs, ks, vs, cs = (x.clone().requires_grad_() for x in (q, k, v, cum))
    o = forward.forgetting_attention_triton(qs, ks, vs, cs)
    grads = torch.autograd.grad(o, (qs, ks, vs, cs), do)

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v, cum)]
    o_ref = reference.attention_dense(*ref_leaves[:3], ref_leaves[3], ref_leaves[3])
    grads_ref = torch.autograd.grad(o_ref, ref_leaves, do.double())
    assert rel_err(o, o_ref) < TOL[torch.bfloat16][0]
    for g_out, g_ref in zip(grads, grads_ref, strict=True):
        assert rel_err(g_out, g_ref) < TOL[torch.bfloat16][1]
    # dcum sums to zero over time (row sums minus column sums of dS)
    assert grads[3].sum(1).abs().max() < 1e-3


def _fused_exp2_error(s: float, mult: float) -> float:
    """How far ``s * mult - m * mult`` with m = s lands from 0 when the GPU fuses it into one multiply-add (the
    product unrounded, ``m * mult`` rounded to float32), emulated in float64; exp2 of it is the block's weight."""
    s32, mult32 = torch.tensor(s, dtype=torch.float32), torch.tensor(mult, dtype=torch.float32)
    exact = s32.double() * mult32.double()  # a product of two float32 is exact in float64
    return float(exact - (s32 * mult32).double())


def test_padding_bias_survives_the_fused_exp2():
    """A real query whose first key blocks are all left padding (FoX model's PAD_BIAS added to their cum) has
    m = s ~ -PAD_BIAS there. At 1e30 the fused multiply-add's error is 6e21: exp2 -> inf, the row NaN on GPU;
    the interpreter computes without fusing, so the bound is checked here and the kernel below on real padding."""
    from evalsuite.models.fox.model import PAD_BIAS

    assert _fused_exp2_error(-1e30, common.LOG2E) > 1e20  # a bias that overflows, so this check can fail
    for c_query in (0.0, -0.37, -1234.5, -1.0e5):  # real queries' cumulative log-forget, long contexts included
        assert abs(_fused_exp2_error(c_query - PAD_BIAS, common.LOG2E)) < 0.25
    assert torch.exp(torch.tensor(-PAD_BIAS + 200.0)) == 0  # padding keys still weigh exactly nothing


def test_left_padding_by_bias_over_whole_blocks():
    """The model's left padding (PAD_BIAS on the padding keys' cum) through the forward kernel equals attention with
    the padding masked (``key_start``), for real rows, with whole key blocks of padding before them."""
    from evalsuite.models.fox.model import PAD_BIAS

    B, T, H, D = 2, 96, 2, 32
    q, k, v, logf = make_inputs(B, T, H, D, torch.bfloat16, "mild", seed=11)
    start = torch.tensor([70, 5])  # row 0: four interpreted key blocks (16) of padding before its first token
    pad = torch.arange(T)[None, :] < start[:, None]
    cum = logf.masked_fill(pad[..., None], 0.0).cumsum(1) + PAD_BIAS * pad[..., None]
    o = forward.forgetting_attention_triton(q, k, v, cum)
    real_cum = logf.masked_fill(pad[..., None], 0.0).cumsum(1).double()
    o_ref = reference.attention_dense(q.double(), k.double(), v.double(), real_cum, real_cum, key_start=start)
    for b in range(B):
        assert torch.isfinite(o[b]).all()
        assert rel_err(o[b, start[b] :], o_ref[b, start[b] :]) < TOL[torch.bfloat16][0]


def test_torch_compile_keeps_the_kernel_in_one_graph():
    """The kernel is an operator to torch.compile: a loss around it compiles as one graph (``fullgraph``: no break
    at the kernel, as there is with ``torch.compiler.disable``), with eager's value and gradients."""
    q, k, v, logf = make_inputs(1, 40, 2, 32, torch.bfloat16, "mild", seed=7)

    def loss(q, k, v, logf):
        o = forward.forgetting_attention_triton(q * 2.0, k, v, logf.cumsum(1))
        return (o.float() ** 2).sum()

    results = []
    for fn in (loss, torch.compile(loss, fullgraph=True)):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, logf)]
        value = fn(*leaves)
        results.append((value, *torch.autograd.grad(value, leaves)))
    for eager, compiled in zip(*results, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=1e-2, atol=1e-3)


def test_a_fox_model_on_the_kernels_compiles_as_one_graph():
    """FoX (Pro), tiny, on the Triton backend: its loss compiles whole (``fullgraph``) -- the MQAR and LM training
    steps compile this way -- and the compiled gradients match eager's. Traced through AOTAutograd without
    Inductor's code generation (CPU C++ builds take a minute here): the kernel under Inductor is
    test_torch_compile_keeps_the_kernel_in_one_graph, a model under Inductor test_train.py."""
    from evalsuite.cards import load_card

    model = load_card("fox-pro-tiny").build_module()
    model.init_weights(0)
    model.set_attention_backend("triton")
    ids = torch.randint(0, 100, (2, 32), generator=torch.Generator().manual_seed(0))

    def loss(ids):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model.logits(model(ids)).float().logsumexp(-1).mean()

    grads = []
    for fn in (loss, torch.compile(loss, fullgraph=True, backend="aot_eager")):
        model.zero_grad(set_to_none=True)
        fn(ids).backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for eager, compiled in zip(*grads, strict=True):
        torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=2e-3)


def test_scale_argument():
    B, T, H, D = 1, 40, 2, 64
    q, k, v, logf = make_inputs(B, T, H, D, torch.float16, "mild", seed=5)
    cum = logf.cumsum(1)
    o = forward.forgetting_attention_triton(q, k, v, cum, scale=0.3)
    o_ref = reference.attention_dense(q.double(), k.double(), v.double(), cum.double(), cum.double(), scale=0.3)
    assert rel_err(o, o_ref) < TOL[torch.float16][0]


def test_no_grad_for_cum_none():
    q, k, v, _ = make_inputs(1, 20, 1, 32, torch.float16, None)
    q.requires_grad_()
    o = forward.forgetting_attention_triton(q, k, v)
    (dq,) = torch.autograd.grad(o.float().sum(), [q])  # an expanded (stride-0) output gradient
    assert torch.isfinite(dq).all()


def test_input_validation():
    q = torch.randn(1, 8, 1, 48, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        forward.forgetting_attention_triton(q, q, q)
    q = torch.randn(1, 8, 1, 32)
    with pytest.raises(TypeError):
        forward.forgetting_attention_triton(q, q, q)
    q = torch.randn(1, 8, 1, 32, dtype=torch.bfloat16)
    with pytest.raises(ValueError):
        forward.forgetting_attention_triton(q, q, q, torch.zeros(1, 7, 1))
    assert math.isclose(common.LOG2E, 1 / math.log(2))


def test_pick_config_follows_the_interpreter(monkeypatch):
    """Fixed small blocks under the interpreter; the tuned table, read at call time, on a GPU."""
    gpu = {64: (128, 64, 4, 4)}
    assert triton_utils.pick_config(gpu, 64, common.INTERPRET_FWD) == common.INTERPRET_FWD
    monkeypatch.delenv("TRITON_INTERPRET")
    assert not triton_utils.interpreting()
    gpu[64] = (256, 64, 8, 3)  # the table as it is at the call
    assert triton_utils.pick_config(gpu, 64, common.INTERPRET_FWD) == (256, 64, 8, 3)


def _exec_fresh(path):
    """Run a module file as a private copy (not in sys.modules), so the real module stays untouched."""
    spec = importlib.util.spec_from_file_location("_fresh_copy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dispatch_modules_import_without_triton(monkeypatch):
    """triton_utils and the package's dispatcher load on machines without triton (they import it lazily)."""
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    assert not _exec_fresh(triton_utils.__file__).triton_installed()
    _exec_fresh(Path(reference.__file__).with_name("__init__.py"))


def test_tma_comparison_tuner_runs_both_paths_under_the_interpreter():
    """``bench tune forgetting-tma`` at a tiny shape: every comparison per T, the same bits on each path, and its
    thresholds read from the per-T ratios (only the structure: CPU timings decide nothing)."""
    from evalsuite.bench.tune import run_tune
    from evalsuite.bench.tune.forgetting_tma import _thresholds

    report = run_tune("forgetting-tma", None, seq_lens=[48], head_dims=[32], n_heads=2, tokens_per_call=48, rounds=2)
    kinds = sorted((r["kind"], r.get("gate")) for r in report["records"])
    assert kinds == [("backward", False), ("backward", True), ("forward", None)]
    assert all(r["same_bits"] for r in report["records"])
    gated = next(r for r in report["records"] if r.get("gate"))
    assert {"gate_mma_ms", "gate_mma_tma_ms", "gate_mma_over_pointers", "gate_mma_tma_over_gate_mma"} <= gated.keys()
    assert set(report["best"]) >= {"forward", "backward_gate", "backward_gate_mma", "backward_gate_mma_tma"}
    with pytest.raises(UserError, match="unknown part 'dq'"):
        run_tune("forgetting-tma", None, seq_lens=[48], head_dims=[32], parts=["forward", "dq"])
    ratios = ((1, 1.05), (4, 0.99), (16, 0.9))
    points = [{"kind": "forward", "D": 64, "T": t, "tma_over_pointers": x} for t, x in ratios]
    assert _thresholds(points) == {"forward": {"64": 4}}
    points[1]["tma_over_pointers"] = 1.01
    assert _thresholds(points) == {"forward": {"64": 16}}
