"""Forgetting Attention kernels on a GPU: forward and gradients at ragged and long T against a float32 reference,
the decode kernel over long left-padded caches, and the dispatcher's Triton backend against its reference (the check
that lets MQAR train on the kernel). Committed H100 runs stay below 5e-3 (results/kernels/fox-attention/:
attention_bench.json, parity_d32.json)."""

import pytest
import torch

from evalsuite.bench.attention_parity import check_decode_parity_gpu, check_parity_gpu

pytestmark = pytest.mark.gpu
LIMIT = 2e-2  # relative error of bf16 kernels against the float32 reference


def _worst(records):
    return max(v for r in records for k, v in r.items() if k.startswith("rel_err"))


@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_full_sequence_parity(head_dim):
    records = check_parity_gpu((1, 17, 255, 1000, 4097), head_dim=head_dim, verbose=False)
    assert len(records) == 10 and _worst(records) < LIMIT, records


def test_long_sequence_parity():
    records = check_parity_gpu((16384,), head_dim=64, verbose=False)
    assert records[0]["cum_min"] < -1000 and _worst(records) < LIMIT, records  # |c| far beyond bf16's exact range


def test_decode_parity():
    records = check_decode_parity_gpu(cache_lens=(1000, 33000), n_queries=(1, 16), head_dims=(64, 128), verbose=False)
    assert len(records) == 8 and _worst(records) < LIMIT, records


def test_triton_backend_matches_reference_for_training():
    """The kernel against the PyTorch reference through the dispatcher, forward and gradients, gated and not."""
    from evalsuite.kernels.forgetting import attention

    gen = torch.Generator(device="cuda").manual_seed(0)
    worst = 0.0
    for gated in (False, True):
        q, k, v = (torch.randn(2, 512, 2, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
        cum = -torch.rand(2, 512, 2, device="cuda", generator=gen).mul(0.1).cumsum(1) if gated else None
        outs = []
        for backend in ("triton", "reference"):
            qq, kk, vv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            o = attention(qq, kk, vv, cum, cum, backend=backend)
            o.float().square().sum().backward()
            outs.append([o.float(), qq.grad.float(), kk.grad.float(), vv.grad.float()])
        for a, b in zip(*outs, strict=True):
            worst = max(worst, ((a - b).norm() / b.norm()).item())
    assert worst < 5e-2


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("offset", [0.0, -1e5])
def test_gate_through_tensor_cores_matches_float64(head_dim, offset):
    """The forward with the bias through the tensor cores against float64, beside the bias on the ALU: heads from
    weak to strong decay and cumsums offset to |c| ~ 1.2e5, where float32 holds c to ~0.008 (module doc of
    kernels/forgetting/gate_operands.py)."""
    import torch.nn.functional as F

    from evalsuite.kernels.forgetting import cumsum_over_time
    from evalsuite.kernels.forgetting.forward import _fwd
    from evalsuite.kernels.forgetting.reference import attention_dense

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4096, 4, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(3))
    bias = torch.tensor([4.0, 1.0, -1.0, -4.0], device="cuda")
    cum = cumsum_over_time(F.logsigmoid(torch.randn(1, 4096, 4, device="cuda", generator=gen) + bias)) + offset
    ref = attention_dense(q.double(), k.double(), v.double(), cum.double(), cum.double())
    (alu, lse_alu), (mma, lse_mma) = (_fwd(q, k, v, cum, None, gate_mma=on) for on in (False, True))
    err_alu, err_mma = (((o.double() - ref).norm() / ref.norm()).item() for o in (alu, mma))
    assert err_mma < 3e-3 and err_mma < 1.5 * err_alu, (err_mma, err_alu)
    assert (lse_mma - lse_alu).abs().max().item() < 0.02


@pytest.mark.parametrize("head_dim", [64, 128])
def test_backward_gate_through_tensor_cores_matches_float64(head_dim):
    """The backward's gradients with the bias through the tensor cores against float64, beside the ALU's: heads from
    weak to strong decay, cumsums offset to |c| ~ 1e4."""
    import torch.nn.functional as F

    from evalsuite.kernels.forgetting import cumsum_over_time
    from evalsuite.kernels.forgetting.backward import _bwd
    from evalsuite.kernels.forgetting.forward import _fwd
    from evalsuite.kernels.forgetting.reference import attention_dense

    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(1, 2048, 4, head_dim, device="cuda", generator=gen).bfloat16() for _ in range(4))
    bias = torch.tensor([4.0, 1.0, -1.0, -4.0], device="cuda")
    cum = cumsum_over_time(F.logsigmoid(torch.randn(1, 2048, 4, device="cuda", generator=gen) + bias)) - 1e4
    leaves = [x.double().requires_grad_() for x in (q, k, v, cum)]
    refs = torch.autograd.grad(attention_dense(*leaves[:3], leaves[3], leaves[3]), leaves, do.double())
    o, lse = _fwd(q, k, v, cum, None)
    alu, mma = (_bwd(do, q, k, v, cum, o, lse, None, gate_mma=on) for on in (False, True))
    for name, a, m, ref in zip("qkvc", alu, mma, refs, strict=True):
        err_alu, err_mma = (((g.double() - ref).norm() / ref.norm()).item() for g in (a, m))
        assert err_mma < LIMIT and err_mma < 1.5 * err_alu, (name, err_mma, err_alu)
