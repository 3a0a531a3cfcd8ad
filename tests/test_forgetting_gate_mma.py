"""The forget gate's bias through the tensor cores (kernels/forgetting/gate_operands.py) on CPU under the Triton
interpreter: the operands' pass against its PyTorch twin, the exactness of the three-part split, and the forward and
the backward with the bias through the MMA against float64 beside the bias on the ALU."""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreted_kernel_modules, rel_err

from evalsuite.kernels.forgetting import reference

_KERNELS = {
    "forward": "_fwd_kernel",
    "gate_operands": "_gate_operands_kernel",
    "common": None,
    "backward_dkdv": "_bwd_dkdv_kernel",
    "backward_dq": "_bwd_dq_kernel",
    "backward": "_bwd_preprocess_kernel",
}
_modules = interpreted_kernel_modules("evalsuite.kernels.forgetting", _KERNELS)
forward, backward, gate_operands, common = (_modules[n] for n in ("forward", "backward", "gate_operands", "common"))

pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # conftest: NaN outputs, guard bands


def _cumsums(B, T, H, scale_of_c, seed=0):
    """Cumulative log forget gates ``[B, T, H]`` reaching ``|c|`` ~ ``scale_of_c``, in time-major storage as
    ``cumsum_over_time`` returns them, and in plain storage."""
    g = torch.Generator().manual_seed(seed)
    log_f = -torch.rand(B, T, H, generator=g) * (2 * scale_of_c / T)
    cum = log_f.cumsum(1)
    return cum.transpose(1, 2).contiguous().transpose(1, 2), cum.contiguous()


@pytest.mark.parametrize("T", [1, 17, 40])
@pytest.mark.parametrize("scale", [0.125, 128**-0.5])
def test_operands_pass_equals_its_twin_bit_for_bit(T, scale):
    for cum in _cumsums(2, T, 3, 1.2e5):
        kernel = gate_operands.gate_operands(cum, scale)
        twin = gate_operands.gate_operands_reference(cum, scale)
        for a, b in zip(kernel, twin, strict=True):
            assert a.shape == (2, 3, T, 16) and a.dtype == torch.bfloat16 and a.is_contiguous()
            assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("magnitude", [1.0, 3e3, 1.2e5, 2.0**20 + 5e4])  # the last: left padding's PAD_BIAS
def test_operands_give_the_bias_exactly(magnitude):
    """``qa_i . ka_j`` in float64 is ``(c_i - c_j) / scale`` with ``c / scale`` taken in float32, exactly: the
    three bf16 parts hold all of float32's bits (what the MMA then adds up is the only rounding)."""
    cum = _cumsums(1, 37, 2, magnitude, seed=3)[0]
    scale = 128**-0.5
    qa, ka = gate_operands.gate_operands(cum, scale)
    bias = qa.double() @ ka.double().transpose(-1, -2)
    x = (cum.transpose(1, 2) * gate_operands._inverse_scale(scale)).double()  # float32 products, exact in float64
    assert torch.equal(bias, x[..., :, None] - x[..., None, :])


@pytest.mark.parametrize("T, D", [(70, 64), (33, 32), (48, 128)])
@pytest.mark.parametrize("tma", [True, False])
def test_forward_through_the_mma_matches_float64(T, D, tma):
    """Both ways of adding the bias against float64, at |c| up to 1.2e5; the same LSE up to rounding."""
    g = torch.Generator().manual_seed(T + D)
    q, k, v = (torch.randn(2, T, 2, D, generator=g).bfloat16() for _ in range(3))
    cum = _cumsums(2, T, 2, 1.2e5)[0] - 3e3
    ref = reference.attention_dense(q.double(), k.double(), v.double(), cum.double(), cum.double())
    (o_alu, lse_alu), (o_mma, lse_mma) = (forward._fwd(q, k, v, cum, None, tma=tma, gate_mma=m) for m in (False, True))
    err_alu, err_mma = rel_err(o_alu, ref), rel_err(o_mma, ref)
    assert err_mma < 1e-2 and err_mma < 1.5 * err_alu + 1e-4, (err_mma, err_alu)
    assert (lse_mma - lse_alu).abs().max() < 1e-2


@pytest.mark.parametrize("T, D", [(70, 64), (33, 32), (48, 128)])
def test_backward_through_the_mma_matches_float64(T, D):
    """The backward's gradients with the bias through the MMA against float64, beside the ALU's (the same forward's
    LSE for both); its descriptor and pointer paths give the same bits."""
    g = torch.Generator().manual_seed(T * D)
    q, k, v, do = (torch.randn(2, T, 2, D, generator=g).bfloat16() for _ in range(4))
    cum = _cumsums(2, T, 2, T / 4)[0] - 1e4  # gates of ~0.8 (sharper ones leave dq ~ 0), offset to |c| ~ 1e4
    leaves = [x.double().requires_grad_() for x in (q, k, v, cum)]
    out = reference.attention_dense(*leaves[:3], leaves[3], leaves[3])
    refs = torch.autograd.grad(out, leaves, do.double())
    o, lse = forward._fwd(q, k, v, cum, None, gate_mma=False)
    alu = backward._bwd(do, q, k, v, cum, o, lse, None, tma=False, gate_mma=False)
    mma, mma_tma = (backward._bwd(do, q, k, v, cum, o, lse, None, tma=t, gate_mma=True) for t in (False, True))
    for name, a, m, m_tma, ref in zip("qkvc", alu, mma, mma_tma, refs, strict=True):
        assert torch.equal(m, m_tma), name
        err_alu, err_mma = rel_err(a, ref), rel_err(m, ref)
        assert err_mma < 2e-2 and err_mma < 1.5 * err_alu + 1e-4, (name, err_mma, err_alu)
    if D != 64:  # the MMA path ran: it rounds the bias at another point (at D = 64 the scale, 1/8, scales exactly)
        assert not torch.equal(mma[3], alu[3])


def test_float16_keeps_the_bias_on_the_alu():
    """fp16's range does not hold c / scale: a request for the MMA gives the ALU path's bits, forward and backward."""
    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 40, 2, 32, generator=g).half() for _ in range(4))
    cum = _cumsums(1, 40, 2, 1e3)[0]
    (mma, lse), (alu, _) = (forward._fwd(q, k, v, cum, None, gate_mma=m) for m in (True, False))
    assert torch.equal(mma, alu)
    grads = [backward._bwd(do, q, k, v, cum, alu, lse, None, gate_mma=m) for m in (True, False)]
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_default_rule():
    """From GATE_MMA_MIN_T (forward) and BWD_GATE_MMA_MIN_T (backward) on a GPU, bf16 only; always for bf16 under the
    interpreter, so the tests cover it."""
    assert common.gate_through_mma(64, 16, torch.bfloat16)
    assert not common.gate_through_mma(64, 1 << 20, torch.float16)
    assert all(t in common.GATE_MMA_MIN_T for t in (64, 128))
    assert common.backward_gate_through_mma(64, 16, torch.bfloat16)
    assert not common.backward_gate_through_mma(64, 1 << 20, torch.float16)


def test_padding_bias_survives_the_fused_exp2_through_the_mma():
    """Through the MMA the scores are ``s / scale`` and the softmax's multiplier ``scale * log2 e``: at left padding's
    bias the fused multiply-add still lands within 0.25 of the rounded product (test_forgetting_triton.py checks the
    ALU path the same way)."""
    from test_forgetting_triton import _fused_exp2_error

    from evalsuite.models.fox.model import PAD_BIAS

    for D in (32, 64, 128):
        scale = D**-0.5
        for c_query in (0.0, -1234.5, -1.0e5):
            assert abs(_fused_exp2_error((c_query - PAD_BIAS) / scale, scale * common.LOG2E)) < 0.25
