"""The Triton Grouped Cross Attention kernels against the PyTorch reference, on CPU under ``TRITON_INTERPRET=1``.

Forward and all four gradients (q, k, v, w) are compared with ``gca_reference`` run in float64 on the same (rounded)
inputs, by relative error ``|out - ref| / |ref|``. Every kernel output buffer starts as NaN between NaN guard bands
(conftest ``poisoned_kernel_outputs``), so an element a kernel never writes fails the finiteness check of
``rel_err``. Interpreter blocks (``common.INTERPRET_CONFIG``): forward 16 query rows x 16 keys, backward the whole query
chunk x 16 keys, so Sq, Skv in {5, 7, 33, 64, 65} cover one and several blocks and ragged tails of both;
``test_gpu_block_shapes`` runs the GPU's one-key-block path (64-key blocks, whole-chunk query tiles).
"""

import pytest
import torch

pytest.importorskip("triton")

from conftest import GCA_KERNELS, interpreted_kernel_modules, rel_err

from evalsuite.kernels import triton_utils
from evalsuite.kernels.grouped_cross import MAX_TRITON_SQ, grouped_cross_attention
from evalsuite.kernels.grouped_cross.reference import gca_reference

_modules = interpreted_kernel_modules("evalsuite.kernels.grouped_cross", GCA_KERNELS)
common, forward, backward = _modules["common"], _modules["forward"], _modules["backward"]

# (forward, gradients); fp32 runs use exact fp32 dots under the interpreter, so any logic error shows. bf16: the
# interpreter truncates fp32 -> bf16 (P and dS are rounded to bf16 before their dots).
TOL = {torch.float32: (1e-5, 2e-5), torch.bfloat16: (2e-2, 4e-2)}
NAMES = ("o", "dq", "dk", "dv", "dw")

pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # conftest: NaN outputs, guard bands


def make_inputs(B, C, Sq, K, Skv, H, D, dtype=torch.float32, zero_slots=False, strided=False, seed=0):
    """q, k, v in dtype (k/v as permuted views when ``strided``), w float32 in [0, 1] (a zero slot per chunk when
    ``zero_slots``), and an output gradient."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, C, Sq, H, D, generator=g).to(dtype)
    if strided:  # [B, C, K, H, Skv, D] storage viewed as [B, C, K, Skv, H, D]; q with a padded head dim
        k = torch.randn(B, C, K, H, Skv, D, generator=g).to(dtype).transpose(3, 4)
        v = torch.randn(B, C, K, H, Skv, D, generator=g).to(dtype).transpose(3, 4)
        q = torch.cat([q, q], -1)[..., :D]
    else:
        k = torch.randn(B, C, K, Skv, H, D, generator=g).to(dtype)
        v = torch.randn(B, C, K, Skv, H, D, generator=g).to(dtype)
    w = torch.rand(B, C, K, generator=g)
    if zero_slots:
        w[..., -1] = 0.0
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-6)
    do = torch.randn(B, C, Sq, H, D, generator=g).to(dtype)
    return q, k, v, w, do


def check(B, C, Sq, K, Skv, H, D, *, softmax_one, dtype=torch.float32, scale=None, config=None, **kw):
    """Kernel vs float64 reference: forward and the gradients of q, k, v, w. Returns the relative errors."""
    q, k, v, w, do = make_inputs(B, C, Sq, K, Skv, H, D, dtype, **kw)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, w)]
    o = forward.gca_triton(*leaves, softmax_one=softmax_one, scale=scale, config=config)
    assert o.shape == q.shape and o.dtype == dtype
    grads = torch.autograd.grad(o, leaves, do)
    ref_leaves = [x.detach().double().requires_grad_() for x in (q, k, v, w)]
    o_ref = gca_reference(*ref_leaves, softmax_one=softmax_one, scale=scale)
    ref_grads = torch.autograd.grad(o_ref, ref_leaves, do.double())
    for g, x in zip(grads, leaves, strict=True):
        assert g.shape == x.shape and g.dtype == x.dtype
    pairs = zip(NAMES, (o, *grads), (o_ref, *ref_grads), strict=True)
    errors = {name: rel_err(a, b) for name, a, b in pairs}
    tol_fwd, tol_bwd = TOL[dtype]
    assert errors["o"] < tol_fwd and max(errors.values()) < tol_bwd, errors
    return errors


# (B, C, Sq, K, Skv, H, D, softmax_one, extra): ragged and exact block multiples on both sides, K = 1..8, D 16-64.
CASES = [
    (1, 2, 5, 3, 7, 2, 16, True, {}),
    (1, 2, 5, 3, 7, 2, 16, False, {"scale": 0.3}),
    (1, 1, 65, 2, 33, 1, 16, True, {"zero_slots": True}),
    (1, 1, 64, 1, 65, 1, 32, False, {}),
    (2, 1, 8, 8, 16, 1, 16, True, {"strided": True}),
    (1, 2, 16, 4, 64, 2, 64, False, {"zero_slots": True, "scale": 0.2}),
]


@pytest.mark.parametrize("B,C,Sq,K,Skv,H,D,softmax_one,extra", CASES)
def test_parity_fp32(B, C, Sq, K, Skv, H, D, softmax_one, extra):
    check(B, C, Sq, K, Skv, H, D, softmax_one=softmax_one, **extra)


def test_parity_bf16():
    check(1, 2, 9, 3, 20, 2, 32, softmax_one=True, dtype=torch.bfloat16, zero_slots=True)


@pytest.mark.parametrize("Skv", [64, 40])
def test_gpu_block_shapes(Skv):
    """The GPU's blocks: one 64-key block per retrieved chunk (D from registers), a 128-row query tile for Sq = 65."""
    gpu = common.BlockConfig((128, 64, 1), (64, 1))
    assert common.fwd_config(65, 64, config=gpu)[:2] == (128, 64) and common.kv_blocks(Skv, 64)[0] == 1
    check(1, 1, 65, 3, Skv, 2, 64, softmax_one=True, zero_slots=True, config=gpu)
    check(1, 1, 64, 2, Skv, 1, 64, softmax_one=False, config=gpu)


def test_every_output_element_is_written():
    """With NaN-filled buffers (the fixture), O, L, dq, dk, dv and dw come back finite: every element is written."""
    assert triton_utils.empty((2,), torch.float32, "cpu").isnan().all()  # the poison is on
    q, k, v, w, do = make_inputs(1, 2, 7, 2, 9, 2, 16)
    s = 16**-0.5
    o, lse = forward.gca_fwd(q, k, v, w, True, s)
    assert torch.isfinite(o).all() and torch.isfinite(lse).all() and lse.shape == (4, 2, 7)
    assert (lse >= 0).all()  # log2(1 + sum exp) >= 0 with softmax_one
    for g in backward.gca_bwd(do, q, k, v, w, lse, s):
        assert torch.isfinite(g).all()


def test_in_bounds_on_every_lane():
    """No lane of any load or store, masked-off lanes included, leaves its buffer (ragged rows and keys)."""
    with triton_utils.interpreter_bounds_check():
        check(1, 2, 5, 2, 7, 2, 16, softmax_one=True, strided=True)
        check(1, 1, 33, 2, 20, 1, 16, softmax_one=False)


def test_dispatcher_and_input_rules():
    q, k, v, w, _ = make_inputs(1, 1, 4, 2, 5, 1, 16)
    ref = gca_reference(q, k, v, w)
    torch.testing.assert_close(grouped_cross_attention(q, k, v, w), ref)  # auto on CPU: the reference
    mixed = grouped_cross_attention(q, k.double(), v.bfloat16().float(), w, backend="triton")  # cast to q's dtype
    torch.testing.assert_close(mixed, gca_reference(q, k, v.bfloat16().float(), w), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="unknown GCA backend"):
        grouped_cross_attention(q, k, v, w, backend="flash")
    with pytest.raises(TypeError, match="share one dtype"):
        forward.gca_triton(q, k.double(), v, w)
    with pytest.raises(ValueError, match="head dim"):
        forward.gca_triton(q[..., :8], k[..., :8], v[..., :8], w)
    long_q = torch.zeros(1, 1, MAX_TRITON_SQ + 1, 1, 16, requires_grad=True)
    with pytest.raises(ValueError, match="at most 128 rows"):
        forward.gca_triton(long_q, k, v, w)
    with torch.no_grad():  # forward only: any Sq
        torch.testing.assert_close(forward.gca_triton(long_q, k, v, w), gca_reference(long_q, k, v, w))
    w64 = w.double().requires_grad_()
    (dw,) = torch.autograd.grad(forward.gca_triton(q, k, v, w64).sum(), w64)
    assert dw.dtype == torch.float64


def test_auto_keeps_fp32_backward_within_shared_memory():
    """H100 measurement (the GPU parity test, tests/gpu/test_gca.py): the fp32 backward of a 65-row chunk needs
    246-288 KB of shared memory, over the 227 KB there; "auto" sends fp32 chunks of more than 64 rows with a gradient
    to the reference."""
    from evalsuite.kernels.grouped_cross import _fits_triton

    def fits(Sq, D, dtype, grad=True):
        q, k, v, w, _ = make_inputs(1, 1, Sq, 2, 8, 1, D)
        return _fits_triton(q.to(dtype).requires_grad_(grad), k, v, w)

    assert fits(64, 64, torch.float32) and fits(65, 64, torch.bfloat16) and fits(128, 64, torch.float16)
    assert not fits(65, 64, torch.float32) and not fits(64, 128, torch.float32)
    assert fits(65, 64, torch.float32, grad=False) and not fits(MAX_TRITON_SQ + 1, 64, torch.bfloat16)


# ---------------------------------------------------------------------------------------------------------------
# The reference itself
# ---------------------------------------------------------------------------------------------------------------


def test_reference_softmax_one_is_a_zero_key_value_row():
    """Softmax_1 over a chunk = plain softmax over the chunk with one more key and value, both zero."""
    q, k, v, w, _ = make_inputs(2, 3, 6, 4, 5, 2, 16, dtype=torch.float64, zero_slots=True)
    q = 3 * q  # sharp and flat rows alike
    pad = (0, 0, 0, 0, 0, 1)  # one zero row at the end of Skv
    plain = gca_reference(q, torch.nn.functional.pad(k, pad), torch.nn.functional.pad(v, pad), w, softmax_one=False)
    torch.testing.assert_close(gca_reference(q, k, v, w, softmax_one=True), plain, rtol=1e-12, atol=1e-12)
    # a key far below the zero logit: with Softmax_1 the chunk contributes (almost) nothing, plain softmax all of v
    key, one = torch.full((1, 1, 1, 1, 1, 1), -1e3, dtype=torch.float64), torch.ones(1, 1, 1, 1, 1, dtype=torch.float64)
    assert gca_reference(one, key, torch.ones_like(key), torch.ones(1, 1, 1)).abs().max() < 1e-300
    assert gca_reference(one, key, torch.ones_like(key), torch.ones(1, 1, 1), softmax_one=False).item() == 1.0


@pytest.mark.parametrize("softmax_one", [True, False])
def test_reference_gradcheck(softmax_one):
    q, k, v, w, _ = make_inputs(1, 2, 3, 2, 4, 1, 4, dtype=torch.float64)
    leaves = [x.requires_grad_() for x in (q, k, v, w.double())]
    assert torch.autograd.gradcheck(lambda *xs: gca_reference(*xs, softmax_one=softmax_one, scale=0.7), leaves)
