"""The Triton GSA kernels (chunked forward/backward, decode step) against the PyTorch references, on CPU under
``TRITON_INTERPRET=1``.

References run in float64 on the same (rounded) inputs (they compute in float64 for float64 inputs).
Errors are relative, ``|out - ref| / |ref|``. Every kernel output buffer starts as NaN (``poison``), so an element a
kernel never writes fails the check. Interpreter blocks (common.INTERPRET_CONFIG): chunks of 32 rows in sub-chunks
of 16, head-dim tiles of 16, so T = 40..70 spans two or three chunks with off-diagonal sub-blocks and a ragged tail;
state scans in segments of 2 chunks, so T <= 64 walks the sequence at once and T > 64 takes the segment scan.
Interpreted kernels are slow, so shapes stay small (B * H <= 4 programs per chunk).
"""

import pytest
import torch

pytest.importorskip("triton")

from conftest import interpreted_kernel_modules, rel_err

from evalsuite.kernels import triton_utils
from evalsuite.kernels.gated_slot import gated_slot_attention, reference

# One kernel per module (None: binds the others'), checked to be interpreted (conftest.interpreted_kernel_modules).
_KERNELS = {"common": "_load_u", "state_kernels": "_state_fwd_kernel", "chunk_kernels": "_read_kernel", "chunk": None,
            "decode": "_decode_keys_kernel"}  # fmt: skip
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


def check(B, T, H, dk, dv, m, dtype, gate, init, scale=0.5, grads=True, seed=0, config=None, final_grad=True):
    """Forward, final state and (with ``grads``) every gradient against the float64 token loop; ``final_grad``: the
    loss takes the final state too (else the output alone: no final-state adjoint enters the backward)."""
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
    n_out = 3 if final_grad else 1
    got = torch.autograd.grad((o, *final)[:n_out], leaves, (do, *d_final)[:n_out])
    want = torch.autograd.grad(
        (o_ref, *final_ref)[:n_out], ref_leaves, tuple(d.double() for d in (do, *d_final))[:n_out]
    )
    for name, a, b in zip(("dq", "dk", "dv", "dlog_alpha", "dhk0", "dhv0"), got, want, strict=False):
        assert a.shape == b.shape, name
        errors[name] = rel_err(a, b)
    assert got[3].dtype == torch.float32 and got[0].dtype == dtype
    assert not got[3][log_alpha < reference.LOG_ALPHA_FLOOR].any()  # the kernels' clamp passes no gradient below it
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


# gsa-tiny (models/gsa-tiny.yaml): 2 heads of 32 dims and 16 slots, trained at 256x2 and 2048x8 on a GPU.
GUARD = 256  # NaN elements on each side of every guarded input and kernel output


def _guarded(x, bands: list):
    """x copied into the middle of a NaN buffer with GUARD elements on each side (appended to ``bands``)."""
    flat = torch.full((x.numel() + 2 * GUARD,), float("nan"), dtype=x.dtype)
    bands.append(flat)
    return flat[GUARD : GUARD + x.numel()].view(x.shape).copy_(x)


@pytest.mark.parametrize("B,T", [(1, 256), (2, 100)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gsa_tiny_stays_in_its_buffers(monkeypatch, dtype, B, T):
    """gsa-tiny's heads under the GPU's block settings, forward and backward: every input (the clamped log gates and
    the output's cotangent too) and every buffer a kernel writes lies between NaN guard bands, so a read past a
    buffer carries NaN into the results and a write past one overwrites a band. Every lane's address is checked as
    well; for a ragged T only the active ones (rows past T address past the buffers under their mask)."""
    bands = []

    def nan_buffer(shape, dt, device):
        return _guarded(torch.full(shape, float("nan"), dtype=dt), bands)

    monkeypatch.setattr(triton_utils, "empty", nan_buffer)
    q, k, v, log_alpha, _ = make_inputs(B, T, 2, 32, 32, 16, dtype, "extreme", False)
    g = log_alpha.clamp(min=reference.LOG_ALPHA_FLOOR)
    do = torch.randn(B, T, 2, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    leaves = [_guarded(x, bands).requires_grad_() for x in (q, k, v, g)]
    cotangent, n_inputs = _guarded(do, bands), len(bands)
    cfg = dict(common.GPU_CONFIG)
    with triton_utils.interpreter_bounds_check(masked_lanes=T % cfg["CHUNK"] == 0):
        o = chunk._GSAChunk.apply(*leaves, 0.5, None, None, False, cfg)[0]
        got = [o, *torch.autograd.grad(o, leaves, cotangent)]
    assert len(bands) > n_inputs and all(b[:GUARD].isnan().all() and b[-GUARD:].isnan().all() for b in bands)
    ref_leaves = [x.detach().double().requires_grad_() for x in leaves]
    o_ref = reference.gsa_recurrent(*ref_leaves, 0.5)[0]
    want = [o_ref, *torch.autograd.grad(o_ref, ref_leaves, do.double())]
    for name, a, b, tol in zip(("o", "dq", "dk", "dv", "dg"), got, want, (TOL[dtype][0],) + 4 * (TOL[dtype][1],),
                               strict=True):  # fmt: skip
        assert rel_err(a, b) < tol, name


def test_gsa_tiny_launch_shapes():
    """The launchers' shape rules at the GPU settings, no kernel run: gsa-tiny's sizes are accepted; the read
    kernel's d step is no wider than its slot tile at every supported size (common.read_tiles: 16 over gsa-tiny's 16
    slots, not min(READ_BD, dk) = 32 as when its training step faulted on an H200) while the shipped shapes keep
    theirs; the state scans walk 256x2 and 2048x8 at once (32 chunks, within a segment)."""
    cfg = common.GPU_CONFIG
    common.check_sizes(32, 32, 16)
    assert common.read_tiles(cfg, 32, 16) == (16, 16)
    assert [common.read_tiles(cfg, d, m) for d, m in ((128, 64), (128, 128), (32, 32), (16, 16))] == [
        (64, 64), (64, 64), (32, 32), (16, 16)
    ]  # fmt: skip
    for d in common.HEAD_DIMS:
        for m in common.SLOTS:
            bd, bm = common.read_tiles(cfg, d, m)
            assert bd <= bm and d % bd == 0 and m % bm == 0, (d, m)
    walks = 2 * 32 // min(cfg["STATE_BD"], 32) * 2  # (dk + dv) / BD d tiles x H, per batch row
    for (T, B), segments in (((256, 2), 1), ((2048, 8), 1)):
        n_chunks = -(-T // cfg["CHUNK"])
        assert -(-n_chunks // common.segment_chunks(n_chunks, walks * B, cfg)) == segments


# The state scans in segments (state_kernels; common.segment_chunks), (dtype, B, T, dk, dv, m, gate, init,
# final_grad, SEG_CHUNKS): 4 segments of one chunk, the last ragged, in two batches; 3 segments, the last of one
# chunk; 2 segments of 3 and 2 chunks; saturated gates (the scan's decays underflow to 0) and mild ones.
SEGMENT_CASES = [
    (torch.float32, 2, 100, 16, 16, 16, "extreme", True, True, 1),
    (torch.bfloat16, 1, 140, 16, 32, 32, "extreme", False, True, 2),
    (torch.float32, 1, 140, 16, 16, 16, "mild", True, False, 3),
]


@pytest.mark.parametrize("dtype,B,T,dk,dv,m,gate,init,final_grad,seg", SEGMENT_CASES)
def test_segment_scan_forward_backward(dtype, B, T, dk, dv, m, gate, init, final_grad, seg):
    """Several segments against the float64 token loop: output, final state, every gradient (the initial state's
    included), with and without the final state's adjoint; no active lane leaves its buffer."""
    config = dict(common.INTERPRET_CONFIG, SEG_CHUNKS=seg)
    n_chunks = -(-T // config["CHUNK"])
    assert common.segment_chunks(n_chunks, 1, config) == seg < n_chunks
    with triton_utils.interpreter_bounds_check(masked_lanes=False):  # rows past T: masked lanes past the buffers
        check(B, T, 1, dk, dv, m, dtype, gate, init, config=config, final_grad=final_grad)


def test_segments_match_one_walk():
    """Segmented and one-walk state scans (SEG_PROGRAMS = 0: never segment) give the same results to float32
    rounding: the segments change only the order of the additions."""
    q, k, v, log_alpha, state = make_inputs(1, 100, 2, 16, 16, 16, torch.float32, "mild", True, seed=5)
    do = torch.randn(1, 100, 2, 16, generator=torch.Generator().manual_seed(6))
    results = []
    for overrides in ({"SEG_CHUNKS": 1}, {"SEG_PROGRAMS": 0}):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, log_alpha, *state)]
        o, final = chunk.gsa_chunk_triton(*leaves[:4], 0.5, tuple(leaves[4:]), True,
                                          config={**common.INTERPRET_CONFIG, **overrides})  # fmt: skip
        results.append([o, *final, *torch.autograd.grad(o, leaves, do)])
    for name, a, b in zip(("o", "hk", "hv", "dq", "dk", "dv", "dg", "dhk0", "dhv0"), *results, strict=True):
        assert rel_err(a, b) < 2e-6, name


@pytest.mark.parametrize(
    "B,T,H,D,walks,segments",
    [
        (64, 1024, 16, 64, 4096, 1),  # the benchmark at 65,536 tokens per call: enough heads, one walk each
        (4, 16384, 16, 64, 256, 1),  # 2 walks per SM: still one walk each
        (2, 32768, 16, 64, 1024, 8),  # few heads: segments of 64 chunks
        (1, 65536, 16, 64, 1024, 16),
        (1, 1 << 20, 16, 64, 4096, 64),  # segments lengthened to 256 chunks (at most SEG_WALKS walks)
        (128, 512, 4, 128, 4096, 1),  # the MQAR d = 512 cell
        (1, 300, 1, 64, 4, 1),  # shorter than a segment
    ],
)
def test_gpu_segment_rule(B, T, H, D, walks, segments):
    """The GPU's segmenting (no kernel runs): walks per launch and segments; grids within CUDA's limits."""
    cfg = common.GPU_CONFIG
    n_chunks = -(-T // cfg["CHUNK"])
    tiles = 2 * D // min(cfg["STATE_BD"], D)
    seg = common.segment_chunks(n_chunks, tiles * B * H, cfg)
    n_seg = -(-n_chunks // seg)
    assert (tiles * B * H * n_seg, n_seg) == (walks, segments)
    assert (n_seg - 1) * seg < n_chunks <= n_seg * seg and max(n_seg, B * H) <= 65535
    assert common.segment_chunks(n_chunks, tiles * B * H, {**cfg, "SEG_PROGRAMS": 0}) == n_chunks


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
    (hk a transposed view, so strided) are updated in place and returned. dk = 32 and dv = 64 take 2 and 4 tiles of
    the interpreter's DECODE_BD = 16: the logits are summed from several key tiles' parts."""
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
