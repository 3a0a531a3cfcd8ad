"""The Triton GSA kernels (chunked forward/backward, decode step) against the PyTorch references, on CPU under
``TRITON_INTERPRET=1``.

References run in float64 on the same (rounded) inputs (they compute in float64 for float64 inputs).
Errors are relative, ``|out - ref| / |ref|``. Every kernel output buffer starts as NaN (``poison``), so an element a
kernel never writes fails the check. Interpreter blocks (common.INTERPRET_CONFIG): chunks of 32 rows in sub-chunks
of 16, head-dim tiles of 16, so T = 40..70 spans two or three chunks with off-diagonal sub-blocks and a ragged tail.
Interpreted kernels are slow, so shapes stay small (B * H <= 2 programs per chunk).
"""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreted_kernel_modules, rel_err

from evalsuite.kernels.gated_slot import gated_slot_attention, reference

# One kernel per module (None: binds the others'), checked to be interpreted (conftest.interpreted_kernel_modules).
_KERNELS = {"common": "_load_u", "state_kernels": "_state_fwd_kernel", "chunk_kernels": "_read_kernel", "chunk": None,
            "decode": "_decode_kernel"}  # fmt: skip
_modules = interpreted_kernel_modules("evalsuite.kernels.gated_slot", _KERNELS)
common, chunk, decode = _modules["common"], _modules["chunk"], _modules["decode"]

# (forward, gradients). bf16 keeps 8 mantissa bits and the interpreter rounds toward zero (common.py). In float32
# the log-gate gradient is the loosest: the reversed-cumsum identity adds reader and writer terms that cancel under
# strong gates (the final-state term sum_d dh_T * h_T, O(10) here, against a result of O(1e-3)), measured ~1e-5.
TOL = {torch.float32: (1e-5, 1e-4), torch.float16: (3e-3, 5e-3), torch.bfloat16: (1.5e-2, 3e-2)}


pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # conftest: NaN outputs, guard bands


def make_inputs(B, T, H, dk, dv, m, dtype, gate, init, seed=0):
    """q, k, v in dtype; log_alpha float32 [B, T, H, m]; an initial state or None.

    gate "mild": log alpha = logsigmoid(x) / 8 (the paper's damping, alpha ~ 0.9); "strong": uniform in [-5, 0)
    per token (the state forgets within a few tokens; exp(-cumsum) would overflow within a chunk); "extreme": mild,
    with a third of the entries uniform in [-60, -10) and rows 3-11 at -1000 (a trained gate's saturated slots: a
    decay over a few tokens beyond float32's exponent range, which no factoring across a 16-row sub-chunk holds).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, dk, generator=g).to(dtype)
    k = torch.randn(B, T, H, dk, generator=g).to(dtype)
    v = torch.randn(B, T, H, dv, generator=g).to(dtype)
    x = torch.randn(B, T, H, m, generator=g)
    log_alpha = (
        torch.nn.functional.logsigmoid(x) / 8 if gate != "strong" else -5.0 * torch.rand(B, T, H, m, generator=g)
    )
    if gate == "extreme":
        spikes = torch.rand(B, T, H, m, generator=g) < 1 / 3
        log_alpha = torch.where(spikes, -10.0 - 50.0 * torch.rand(B, T, H, m, generator=g), log_alpha)
        log_alpha[:, 3:12] = -1000.0
    state = None
    if init:
        state = (torch.randn(B, H, dk, m, generator=g), torch.randn(B, H, m, dv, generator=g))
    return q, k, v, log_alpha, state


def check(B, T, H, dk, dv, m, dtype, gate, init, scale=0.5, grads=True, seed=0, config=None):
    q, k, v, log_alpha, state = make_inputs(B, T, H, dk, dv, m, dtype, gate, init, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    do = torch.randn(B, T, H, dv, generator=gen).to(dtype)
    d_final = (torch.randn(B, H, dk, m, generator=gen), torch.randn(B, H, m, dv, generator=gen))
    inputs = (q, k, v, log_alpha) + (state if init else ())

    leaves = [x.clone().requires_grad_(grads) for x in inputs]
    o, final = chunk.gsa_chunk_triton(*leaves[:4], scale, tuple(leaves[4:]) if init else None, True, config=config)
    assert o.shape == (B, T, H, dv) and o.dtype == dtype
    assert final[0].shape == (B, H, dk, m) and final[1].shape == (B, H, m, dv)
    assert final[0].dtype == final[1].dtype == torch.float32
    ref_leaves = [x.detach().double().requires_grad_(grads) for x in inputs]
    o_ref, final_ref = reference.gsa_recurrent(*ref_leaves[:4], scale, tuple(ref_leaves[4:]) if init else None, True)
    tol_fwd, tol_bwd = TOL[dtype]
    errors = {"o": rel_err(o, o_ref), "hk": rel_err(final[0], final_ref[0]), "hv": rel_err(final[1], final_ref[1])}
    assert max(errors.values()) < tol_fwd, errors
    if not grads:
        return errors
    got = torch.autograd.grad((o, *final), leaves, (do, *d_final))
    want = torch.autograd.grad((o_ref, *final_ref), ref_leaves, (do.double(), *(d.double() for d in d_final)))
    for name, a, b in zip(("dq", "dk", "dv", "dlog_alpha", "dhk0", "dhv0"), got, want, strict=False):
        assert a.shape == b.shape, name
        errors[name] = rel_err(a, b)
    assert got[3].dtype == torch.float32 and got[0].dtype == dtype
    assert all(e < tol_bwd for e in errors.values()), errors
    return errors


# (dtype, T, dk, dv, m, gate, init): both gate kinds, with and without an initial state, ragged tails (T % 32 != 0).
CASES = [
    (torch.float32, 70, 32, 16, 16, "mild", True),
    (torch.float32, 45, 16, 32, 32, "strong", False),
    (torch.bfloat16, 45, 16, 32, 16, "mild", True),
    (torch.bfloat16, 40, 32, 16, 16, "strong", False),
    (torch.float16, 37, 16, 16, 16, "mild", False),
]


@pytest.mark.parametrize("dtype,T,dk,dv,m,gate,init", CASES)
def test_chunk_forward_backward(dtype, T, dk, dv, m, gate, init):
    check(1, T, 2, dk, dv, m, dtype, gate, init)


@pytest.mark.parametrize("sub", [16, 8])
def test_chunk_gpu_paths(sub):
    """The GPU's block shapes under the interpreter: chunks of 64 in sub-chunks of 16 (the default) or 8 (a choice
    of the tuner's sweep), d tiles of 64/32, two slot tiles of 16; three chunks, a ragged tail, saturated gates."""
    cfg = dict(common.INTERPRET_CONFIG, CHUNK=64, SUB=sub, STATE_BD=32, READ_BD=64, WRITE_BD=64, DGATE_BD=64,
               READ_BM=16, PAIR_BM=16, WRITE_BM=16, DGATE_BM=16)  # fmt: skip
    check(1, 140, 1, 64, 32, 32, torch.float32, "extreme", True, scale=0.125, config=cfg)


def test_chunk_forward_only_shapes():
    """No grad: large slot count and head dims, two heads in two batches, one chunk only (T < 32)."""
    check(2, 20, 1, 64, 16, 64, torch.float32, "mild", True, grads=False)
    check(1, 1, 1, 16, 16, 16, torch.float32, "strong", False, grads=False)


def test_strong_gates_stay_finite():
    """log alpha = -5 per token over 3 chunks (exp of minus the cumsum would be exp(+175)): finite and exact."""
    q, k, v, _, _ = make_inputs(1, 90, 1, 16, 16, 16, torch.float32, "mild", False, seed=3)
    log_alpha = torch.full((1, 90, 1, 16), -5.0)
    o, (hk, hv) = chunk.gsa_chunk_triton(q, k, v, log_alpha, 1.0, None, True)
    o_ref, _ = reference.gsa_recurrent(q.double(), k.double(), v.double(), log_alpha.double(), 1.0)
    assert rel_err(o, o_ref) < 1e-5 and torch.isfinite(hk).all() and torch.isfinite(hv).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extreme_gates_exact(dtype):
    """Saturated gates (log alpha down to -1000 within one sub-chunk): forward and every gradient as exact as under
    mild gates. Factoring in-sub-chunk decays through the sub-chunk's middle row instead overflows to NaN beyond log
    alpha ~ -11 per token (GSA d = 512 MQAR training goes NaN: results/mqar/gsa-d512-probe/ at commit 164742b)."""
    check(1, 45, 2, 16, 32, 16, dtype, "extreme", False)


def test_decode_steps_match_recurrent_in_place():
    """Five decode steps from a random state equal the recurrent reference token by token; the state tensors
    (hk a transposed view, so strided) are updated in place and returned."""
    B, T, H, dk, dv, m = 2, 5, 2, 32, 64, 16
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v, log_alpha, (hk0, hv0) = make_inputs(B, T, H, dk, dv, m, dtype, "mild", True, seed=7)
        hk = hk0.transpose(-1, -2).contiguous().transpose(-1, -2)  # [B, H, dk, m] with strides of [B, H, m, dk]
        hv = hv0.clone()
        outs = []
        for t in range(T):
            sl = slice(t, t + 1)
            o, state = decode.gsa_decode_triton(q[:, sl], k[:, sl], v[:, sl], log_alpha[:, sl], 0.3, (hk, hv))
            assert state[0] is hk and state[1] is hv and o.shape == (B, 1, H, dv) and o.dtype == dtype
            outs.append(o)
        o_ref, (hk_ref, hv_ref) = reference.gsa_recurrent(q.double(), k.double(), v.double(), log_alpha.double(),
                                                          0.3, (hk0.double(), hv0.double()), True)  # fmt: skip
        assert rel_err(torch.cat(outs, 1), o_ref) < TOL[dtype][0]
        assert rel_err(hk, hk_ref) < 1e-6 and rel_err(hv, hv_ref) < 1e-6


def test_dispatcher_triton_backend():
    """backend="triton": the chunked kernels with autograd, and under no_grad a one-token call with a state decodes."""
    q, k, v, log_alpha, state = make_inputs(1, 40, 1, 16, 16, 16, torch.float32, "mild", True, seed=11)
    o, final = gated_slot_attention(q, k, v, log_alpha, scale=0.7, initial_state=state, output_final_state=True,
                                    backend="triton")  # fmt: skip
    o_ref, final_ref = reference.gsa_chunked(q, k, v, log_alpha, 0.7, state, True)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(final[1], final_ref[1]) < 1e-5
    step = [x[:, :1] for x in (q, k, v, log_alpha)]
    ref_step, ref_state = reference.gsa_recurrent(*step, 0.7, final_ref, True)
    live = tuple(s.clone() for s in final)
    with torch.no_grad():
        o1, new_state = gated_slot_attention(*step, scale=0.7, initial_state=live, backend="triton")
    assert new_state[0] is live[0] and rel_err(o1, ref_step) < 1e-5 and rel_err(live[0], ref_state[0]) < 1e-5


def test_empty_sequence_and_validation():
    q, k, v, log_alpha, state = make_inputs(1, 0, 1, 16, 16, 16, torch.float32, "mild", True)
    o, final = chunk.gsa_chunk_triton(q, k, v, log_alpha, 1.0, state, True)
    assert o.shape == (1, 0, 1, 16) and torch.equal(final[0], state[0])
    q, k, v, log_alpha, _ = make_inputs(1, 8, 1, 24, 16, 16, torch.float32, "mild", False)
    with pytest.raises(ValueError):
        chunk.gsa_chunk_triton(q, k, v, log_alpha)  # dk = 24
    q, k, v, log_alpha, _ = make_inputs(1, 8, 1, 16, 16, 48, torch.float32, "mild", False)
    with pytest.raises(ValueError):
        chunk.gsa_chunk_triton(q, k, v, log_alpha)  # m = 48
    q, k, v, log_alpha, _ = make_inputs(1, 8, 1, 16, 16, 16, torch.float32, "mild", False)
    with pytest.raises(TypeError):
        chunk.gsa_chunk_triton(q.half(), k, v, log_alpha)
    with pytest.raises(ValueError):
        decode.gsa_decode_triton(q, k, v, log_alpha, 1.0, None)
