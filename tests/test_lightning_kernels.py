"""The Triton Lightning Attention kernels against the PyTorch reference, on CPU under ``TRITON_INTERPRET=1``.

Every check compares the kernels (bf16/fp16/fp32 inputs, fp32 accumulation) with a float64 evaluation of the
reference math on the same (rounded) inputs -- ``reference.lightning_parallel`` plus the initial/final-state terms in
closed form -- by relative error ``|out - ref| / |ref|``; gradients (q, k, v, the initial state, and through the
returned final state) against autograd through that float64 reference. Kernel outputs are poisoned with NaN before
each launch, so an element a kernel never writes fails the check, and sit between NaN guard bands, so a read past
either end of one shows up as NaN.

Memory safety: the interpreter reads raw host memory and never faults, so every test runs under
``triton_utils.interpreter_bounds_check``: each load and store of every launch must stay inside one tensor argument,
on every lane, masked-off lanes included. ``test_gpu_segmenting_matches_recurrent`` runs the GPU's segmenting rule
at interpreter scale on the segment layouts of GPU shapes (the benchmark's), against the float64 token loop.

Interpreter chunking (``common.chunking``): chunks of 16 positions, segments of 2 chunks, segment scans of 2
segments per step, walks over state slices of at most 16 columns; the lengths below are not multiples of 16 and
span several segments and scan steps (see ``test_shapes_cover_several_chunks_segments_and_scan_steps``).
"""

import importlib
import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
import triton
import triton.language as tl
from conftest import interpreted_kernel_modules, rel_err

from evalsuite.kernels import triton_utils
from evalsuite.kernels.lightning import lightning_attention, reference

# One kernel per module (None: binds the others'), checked to be interpreted (conftest.interpreted_kernel_modules).
_KERNELS = {"evalsuite.kernels.jit_helpers": "mm", "common": None, "walk": "_walk_kernel",
            "scan": "_segment_scan_kernel", "decode": "_decode_kernel", "chunk": None}  # fmt: skip
_modules = interpreted_kernel_modules("evalsuite.kernels.lightning", _KERNELS)
common, chunk, decode = _modules["common"], _modules["chunk"], _modules["decode"]

# The interpreter truncates float32 -> bf16 (no round-to-nearest), which doubles bf16 rounding errors there; the
# bf16 bounds leave room for that. fp32 runs use full-precision dots, so their bounds catch any logic error.
TOL = {torch.float32: (2e-5, 5e-5), torch.float16: (3e-3, 5e-3), torch.bfloat16: (2e-2, 3e-2)}  # (fwd, grads)


pytestmark = pytest.mark.usefixtures("poisoned_kernel_outputs")  # conftest: NaN outputs, guard bands


@pytest.fixture(autouse=True)
def bounds_checked():
    """No lane of any load or store leaves its buffer (see the module doc)."""
    with triton_utils.interpreter_bounds_check():
        yield


def ref64(q, k, v, slope, h0=None):
    """(o, final state) in float64: the masked quadratic form plus the initial state's terms, differentiable."""
    T = q.shape[1]
    lam = torch.exp(-slope.double())  # [H]
    o = reference.lightning_parallel(q, k, v, slope)
    t = torch.arange(T, dtype=torch.float64)
    tail = lam[None, :] ** (T - 1 - t[:, None])  # [T, H]: lambda^(T-1-s)
    ht = torch.einsum("bshk,bshv,sh->bhkv", k.double(), v.double(), tail)
    if h0 is not None:
        h0 = h0.double()
        head = lam[None, :] ** (t[:, None] + 1)  # [T, H]: lambda^(t+1)
        o = o + torch.einsum("bthk,bhkv,th->bthv", q.double(), h0, head)
        ht = ht + lam[None, :, None, None] ** T * h0
    return o, ht


def make_inputs(B, T, H, dk, dv, dtype, seed=0, packed=False):
    """Random q, k, v; ``packed``: strided views into one [B, T, 3, H, d] tensor (needs dk == dv)."""
    g = torch.Generator().manual_seed(seed)
    if packed:
        qkv = torch.randn(B, T, 3, H, dk, generator=g).to(dtype)
        return qkv.unbind(2)
    q, k = (torch.randn(B, T, H, dk, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(B, T, H, dv, generator=g).to(dtype)
    return q, k, v


def check_full(B, T, H, dk, dv, dtype, slopes, *, h0=False, final=True, packed=False, seed=0, config=None):
    """Forward (o, final state) and gradients (q, k, v, h0) of the chunk kernels against the float64 reference."""
    q, k, v = make_inputs(B, T, H, dk, dv, dtype, seed, packed)
    slope = torch.tensor(slopes, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed + 1)
    init = torch.randn(B, H, dk, dv, generator=g) if h0 else None
    do = torch.randn(B, T, H, dv, generator=g).to(dtype)
    dht = torch.randn(B, H, dk, dv, generator=g) if final else None

    leaves = [x.clone().requires_grad_() for x in (q, k, v)] + ([init.clone().requires_grad_()] if h0 else [])
    o, ht = chunk.lightning_chunk_triton(*leaves[:3], slope, leaves[3] if h0 else None, final, config=config)
    assert o.shape == (B, T, H, dv) and o.dtype == dtype
    assert (ht is not None) == final
    outs, grads_out = [o], [do]
    if final:
        assert ht.shape == (B, H, dk, dv) and ht.dtype == torch.float32
        outs.append(ht)
        grads_out.append(dht)
    grads = torch.autograd.grad(outs, leaves, grads_out)

    ref_leaves = [x.double().requires_grad_() for x in leaves]
    o_ref, ht_ref = ref64(*ref_leaves[:3], slope, ref_leaves[3] if h0 else None)
    loss = (o_ref * do.double()).sum() + ((ht_ref * dht.double()).sum() if final else 0)
    grads_ref = torch.autograd.grad(loss, ref_leaves)

    tol_fwd, tol_bwd = TOL[dtype]
    errors = {"o": rel_err(o, o_ref)}
    if final:
        errors["ht"] = rel_err(ht, ht_ref)
    for name, leaf, gr, gr_ref in zip(("dq", "dk", "dv", "dh0")[: len(leaves)], leaves, grads, grads_ref, strict=True):
        assert gr.shape == leaf.shape and gr.dtype == leaf.dtype, name
        errors[name] = rel_err(gr, gr_ref)
    fwd_names = {"o", "ht"}
    assert all(e < tol_fwd for n, e in errors.items() if n in fwd_names), errors
    assert all(e < tol_bwd for n, e in errors.items() if n not in fwd_names), errors
    return errors


# (dtype, B, T, H, dk, dv, slopes, h0, final): ragged lengths over several chunks, segments and scan steps; slope 0
# (no decay), small, large (8: a few positions of memory) and extreme (20: lambda^1 ~ 2e-9, underflow); dk = 2 dv
# (LRPE's doubled keys) and dk < dv; with and without the initial state and the final state.
FULL_CASES = [
    (torch.float32, 1, 70, 2, 32, 16, [0.0, 0.1], True, True),
    (torch.bfloat16, 1, 70, 2, 64, 32, [0.02, 8.0], False, True),
    (torch.bfloat16, 2, 33, 1, 16, 32, [1.0], True, False),
    (torch.float16, 1, 40, 2, 32, 32, [0.5, 20.0], True, True),
]


def test_shapes_cover_several_chunks_segments_and_scan_steps():
    BT, G = common.chunking(100, 1, common.launch_config())
    SB = common.launch_config().scan[0]
    assert (BT, G, SB) == (16, 2, 2)
    n_segments = []
    for T in [c[2] for c in FULL_CASES]:
        n_chunks = math.ceil(T / BT)
        assert T % BT and n_chunks > G, T  # ragged tail, several segments
        n_segments.append(math.ceil(n_chunks / G))
    assert max(n_segments) > SB  # several scan steps


@pytest.mark.parametrize("dtype,B,T,H,dk,dv,slopes,h0,final", FULL_CASES)
def test_full_forward_backward(dtype, B, T, H, dk, dv, slopes, h0, final):
    check_full(B, T, H, dk, dv, dtype, slopes, h0=h0, final=final)


# GPU shapes (B, T, H) and, for each, a shape (B, T, H) plus a target of (batch, head, segment) programs and a scan
# step (segments per scan step: 16 on GPU) with which the GPU's segmenting rule, at interpreter scale (chunks of 16,
# not 64), gives the same segment layout (see _layout) at a size the interpreter runs in seconds.
GPU_SCALED = {
    # the parity shape: segments halved to 4 chunks, one segment past a full scan step (a scan block with one live
    # lane), a last segment of one chunk and a last chunk of one row
    "parity-2x4097x16": ((2, 4097, 16), (2, 257, 1), 10, 4),
    # the benchmark at 65536 tokens per call: one segment of 16 chunks (15 of 16 scan lanes masked off); 16 segments,
    # exactly one full scan step
    "bench-64x1024x16": ((64, 1024, 16), (1, 256, 2), 2, 16),
    "bench-4x16384x16": ((4, 16384, 16), (1, 512, 1), 2, 2),
}


def _layout(T, chunks, SB):
    """What the kernels' index arithmetic branches on: chunks per segment, segments past the last full scan step and
    whether there is a full one, chunks in the last segment, rows in the last chunk (0: a full chunk)."""
    BT, G, NT, NSEG = common.geometry(T, chunks)
    return G, NSEG % SB, NSEG >= SB, NT - (NSEG - 1) * G, T % BT


@pytest.mark.parametrize("gpu_shape,shape,min_programs,SB", GPU_SCALED.values(), ids=GPU_SCALED.keys())
def test_gpu_segmenting_matches_recurrent(gpu_shape, shape, min_programs, SB):
    """Forward and every gradient with the GPU's segmenting rule, against the float64 token loop (autograd)."""
    (B0, T0, H0), (B, T, H) = gpu_shape, shape
    gpu = common.chunking(T0, B0 * H0, common.GPU_CONFIG)
    config = replace(common.INTERPRET_CONFIG, seg_chunks=common.GPU_CONFIG.seg_chunks, min_programs=min_programs,
                     scan=(SB, *common.INTERPRET_CONFIG.scan[1:]))  # fmt: skip
    assert config.chunk == 16
    assert _layout(T, common.chunking(T, B * H, config), SB) == _layout(T0, gpu, common.GPU_CONFIG.scan[0])

    dk, dv = 16, 16
    q, k, v = make_inputs(B, T, H, dk, dv, torch.float32, seed=21)
    slope = torch.tensor([0.01, 0.3][:H])
    g = torch.Generator().manual_seed(22)
    h0, dht = (torch.randn(B, H, dk, dv, generator=g) for _ in range(2))
    do = torch.randn(B, T, H, dv, generator=g)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, h0)]
    o, ht = chunk.lightning_chunk_triton(*leaves[:3], slope, leaves[3], True, config=config)
    grads = torch.autograd.grad([o, ht], leaves, [do, dht])

    ref_leaves = [x.double().requires_grad_() for x in (q, k, v, h0)]
    o_ref, ht_ref = reference.lightning_recurrent(*ref_leaves[:3], slope, ref_leaves[3], True)
    grads_ref = torch.autograd.grad([o_ref, ht_ref], ref_leaves, [do.double(), dht.double()])
    errors = {"o": rel_err(o, o_ref), "ht": rel_err(ht, ht_ref)}
    errors.update({n: rel_err(a, b) for n, a, b in zip(("dq", "dk", "dv", "dh0"), grads, grads_ref, strict=True)})
    assert all(e < 1e-5 for e in errors.values()), errors


@pytest.mark.parametrize("B,T,H", [(2, 4097, 16), (4, 16384, 16), (1, 65536, 16), (64, 1024, 16), (1, 65536, 2)])
def test_gpu_launch_geometry(B, T, H):
    """On GPU (no kernel runs): the segments tile the chunks exactly and every grid fits CUDA's limits (grid y and z
    at most 65535: walks (tiles, segments, B*H), scan (tiles, B*H))."""
    chunks = common.chunking(T, B * H, common.GPU_CONFIG)
    BT, G, NT, NSEG = common.geometry(T, chunks)
    assert BT == common.GPU_CONFIG.chunk and G in (1, 2, 4, 8, 16)
    assert (NT - 1) * BT < T <= NT * BT and (NSEG - 1) * G < NT <= NSEG * G  # no empty chunk or segment
    assert B * H * NSEG >= common.GPU_CONFIG.min_programs or G == 1
    assert max(NSEG, B * H) <= 65535


@triton.jit
def _shifted_copy(X, Y, N, SHIFT):
    i = tl.arange(0, 16)
    tl.store(Y + i, tl.load(X + i - SHIFT, mask=(i - SHIFT >= 0) & (i - SHIFT < N), other=0.0))


def test_bounds_check_flags_addresses_outside_the_buffers():
    """The checker that the fixture installs is live (it patches interpreter internals): a lane below or past a
    buffer is reported, masked off or not; the interpreter alone would read whatever memory lies there."""
    x, y = torch.arange(16.0), torch.zeros(16)
    _shifted_copy[(1,)](x, y, 16, 0)
    assert torch.equal(y, x)
    with pytest.raises(Exception, match="lane 0 \\(masked off\\) at element -3 of 'X'"):
        _shifted_copy[(1,)](x, y, 16, 3)
    with pytest.raises(Exception, match="lane 15 \\(active\\) at element 16 of 'X'"):
        _shifted_copy[(1,)](x, y, 17, -1)


@pytest.mark.parametrize("T", [1, 16, 64])
def test_short_and_block_aligned_lengths(T):
    """One position; exactly one chunk; exactly two full segments (every chunk and segment full)."""
    check_full(1, T, 1, 16, 16, torch.float32, [0.3], h0=True, final=True)


@pytest.mark.parametrize("seg_chunks", [1, 4])
def test_other_segment_sizes(seg_chunks):
    """Segments of one chunk (every walk one step long) and of four (the GPU shrinks G for short inputs)."""
    config = replace(common.INTERPRET_CONFIG, seg_chunks=seg_chunks)
    assert common.chunking(50, 1, config) == (16, seg_chunks)
    check_full(1, 50, 1, 16, 16, torch.float32, [0.4], h0=True, final=True, config=config)


def test_packed_strided_inputs():
    """q, k, v as strided views into one packed [B, T, 3, H, d] tensor (dk == dv)."""
    check_full(1, 50, 2, 16, 16, torch.bfloat16, [0.0, 2.0], packed=True, final=False)


def test_lrpe_head_sizes():
    """dk = 256, dv = 128 (TNL's first layer: LRPE doubles the key size). Wider interpreter state slices keep it
    quick; still several per walk (dv / 64 and dk / 64)."""
    config = replace(common.INTERPRET_CONFIG, walk_columns=64)
    check_full(1, 20, 1, 256, 128, torch.float32, [0.05], h0=True, final=True, config=config)


def test_matches_recurrent_ground_truth():
    """The kernel against ``lightning_recurrent`` (the token loop, fp32) directly, with a state in and out."""
    q, k, v = make_inputs(2, 45, 2, 32, 16, torch.float32, seed=4)
    slope = torch.tensor([0.0, 0.7])
    h0 = torch.randn(2, 2, 32, 16, generator=torch.Generator().manual_seed(5))
    o, ht = chunk.lightning_chunk_triton(q, k, v, slope, h0, True)
    o_ref, ht_ref = reference.lightning_recurrent(q, k, v, slope, h0, True)
    assert rel_err(o, o_ref) < 1e-5 and rel_err(ht, ht_ref) < 1e-5


def test_gradient_of_output_only_and_of_state_only():
    """Backward with only one of the two outputs in the loss (the other's gradient arrives as None)."""
    q, k, v = (x.requires_grad_() for x in make_inputs(1, 37, 1, 16, 16, torch.float32, seed=6))
    slope = torch.tensor([0.2])
    o, ht = chunk.lightning_chunk_triton(q, k, v, slope, None, True)
    (dq_state,) = torch.autograd.grad(ht.sum(), [q], retain_graph=True)
    assert dq_state.abs().max() == 0  # the final state does not depend on q
    dv_out, dv_state = (torch.autograd.grad(x.sum(), [v], retain_graph=True)[0] for x in (o, ht))
    qd, kd, vd = (x.detach().double().requires_grad_() for x in (q, k, v))
    o_ref, ht_ref = ref64(qd, kd, vd, slope)
    assert rel_err(dv_out, torch.autograd.grad(o_ref.sum(), [vd])[0]) < 1e-5
    assert rel_err(dv_state, torch.autograd.grad(ht_ref.sum(), [vd])[0]) < 1e-5


def test_empty_sequence():
    q = torch.zeros(1, 0, 2, 16)
    h0 = torch.randn(1, 2, 16, 16)
    o, ht = chunk.lightning_chunk_triton(q, q, q, torch.ones(2), h0, True)
    assert o.shape == (1, 0, 2, 16) and torch.equal(ht, h0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_steps_update_state_in_place(dtype):
    """Several decode steps from a random state equal the token loop; the state tensor itself is updated."""
    B, H, dk, dv, steps = 2, 2, 64, 32, 3
    q, k, v = make_inputs(B, steps, H, dk, dv, dtype, seed=7)
    slope = torch.tensor([0.0, 1.5])
    h0 = torch.randn(B, H, dk, dv, generator=torch.Generator().manual_seed(8))
    state = h0.clone()
    ptr = state.data_ptr()
    outs = []
    for t in range(steps):
        o, returned = decode.lightning_decode_triton(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], slope, state)
        assert returned is state and state.data_ptr() == ptr
        assert o.shape == (B, 1, H, dv) and o.dtype == dtype
        outs.append(o)
    o_ref, ht_ref = ref64(q, k, v, slope, h0)
    assert rel_err(torch.cat(outs, 1), o_ref) < TOL[dtype][0]
    assert rel_err(state, ht_ref) < 1e-5  # the state update is exact fp32 on the same inputs
    _, ht_rec = reference.lightning_recurrent(q, k, v, slope, h0, True)
    assert rel_err(state, ht_rec) < 1e-5


def test_prefill_then_decode():
    """Chunk prefill's final state, continued by decode steps, equals the token loop over the whole sequence."""
    q, k, v = make_inputs(1, 24, 2, 32, 32, torch.bfloat16, seed=9)
    slope = torch.tensor([0.05, 3.0])
    o_pre, state = chunk.lightning_chunk_triton(q[:, :21], k[:, :21], v[:, :21], slope, None, True)
    outs = [o_pre]
    for t in range(21, 24):
        outs.append(decode.lightning_decode_triton(q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], slope, state)[0])
    o_ref, ht_ref = ref64(q, k, v, slope)
    assert rel_err(torch.cat(outs, 1), o_ref) < TOL[torch.bfloat16][0]
    assert rel_err(state, ht_ref) < TOL[torch.bfloat16][0]  # bf16 products (decayed k rounded to bf16)


def test_decode_strided_state():
    """A state that is a transposed view (strided) is updated in place too."""
    q, k, v = make_inputs(1, 1, 2, 16, 32, torch.float32, seed=10)
    slope = torch.tensor([0.1, 0.2])
    store = torch.randn(1, 2, 32, 16, generator=torch.Generator().manual_seed(11))
    state = store.transpose(2, 3)  # [1, 2, 16, 32], not contiguous
    expected = reference.lightning_recurrent(q, k, v, slope, state.clone(), True)
    o, returned = decode.lightning_decode_triton(q, k, v, slope, state)
    assert returned is state
    assert rel_err(o, expected[0]) < 1e-5 and rel_err(store.transpose(2, 3), expected[1]) < 1e-5


def test_dispatcher_triton_backend():
    """``lightning_attention(..., backend="triton")``: full sequences through the chunk kernels (differentiable);
    one token with a state under no_grad through the in-place decode step."""
    q, k, v = make_inputs(1, 35, 2, 16, 16, torch.bfloat16, seed=12)
    slope = torch.tensor([0.1, 4.0])
    qg = q.clone().requires_grad_()
    o, ht = lightning_attention(qg, k, v, slope, output_final_state=True, backend="triton")
    o_ref, ht_ref = ref64(q, k, v, slope)
    assert rel_err(o, o_ref) < TOL[torch.bfloat16][0] and rel_err(ht, ht_ref) < TOL[torch.bfloat16][0]
    (dq,) = torch.autograd.grad(o.float().sum(), [qg])  # an expanded (stride-0) output gradient
    qd = q.double().requires_grad_()
    (dq_ref,) = torch.autograd.grad(ref64(qd, k, v, slope)[0].sum(), [qd])
    assert rel_err(dq, dq_ref) < TOL[torch.bfloat16][1]

    state = ht.detach().clone()
    q1, k1, v1 = make_inputs(1, 1, 2, 16, 16, torch.bfloat16, seed=13)
    expected = reference.lightning_recurrent(q1, k1, v1, slope, state.clone(), True)
    with torch.no_grad():
        o1, new_state = lightning_attention(q1, k1, v1, slope, initial_state=state, backend="triton")
    assert new_state is state  # the decode kernel ran (in place)
    assert rel_err(o1, expected[0]) < TOL[torch.bfloat16][0] and rel_err(state, expected[1]) < 1e-5


def test_input_validation():
    x = torch.randn(1, 8, 1, 48)
    with pytest.raises(ValueError, match="head sizes"):
        chunk.lightning_chunk_triton(x, x, x, torch.ones(1))
    x = torch.randn(1, 8, 1, 32)
    with pytest.raises(TypeError):
        chunk.lightning_chunk_triton(x, x, x.to(torch.bfloat16), torch.ones(1))
    with pytest.raises(TypeError):
        chunk.lightning_chunk_triton(x.double(), x.double(), x.double(), torch.ones(1))
    with pytest.raises(ValueError):
        chunk.lightning_chunk_triton(x, x, x, torch.ones(2))
    state = torch.zeros(1, 1, 32, 32)
    with pytest.raises(ValueError, match="T = 1"):
        decode.lightning_decode_triton(x, x, x, torch.ones(1), state)
    with pytest.raises(TypeError):
        decode.lightning_decode_triton(x[:, :1], x[:, :1], x[:, :1], torch.ones(1), state.to(torch.bfloat16))


def test_gpu_configs():
    """Every supported (dk, dv) and dtype has GPU walk and decode configs whose tiles divide the heads, fit tl.dot
    (>= 16) and keep the walk's state slice within the register budget."""
    gpu = common.GPU_CONFIG
    for da in common.HEAD_DIMS:
        for dc in common.HEAD_DIMS:
            for dtype in common.DTYPES:
                bc, warps, stages = common.walk_config(da, dc, dtype, gpu)
                assert dc % bc == 0 and bc >= 16 and warps in (4, 8) and stages in (1, 2, 3)
                assert da * bc <= gpu.walk_state_elems or bc == 16
            bk, bv = common.DECODE_CONFIGS[(da, dc)][:2]
            assert da % bk == 0 and dc % bv == 0 and bk >= 16 and bv >= 16
    sb, be, _ = gpu.scan
    assert sb >= 16 and all(dk * dv % min(be, dk * dv) == 0 for dk in common.HEAD_DIMS for dv in common.HEAD_DIMS)
    assert (gpu.chunk, gpu.seg_chunks) == (64, 16)


def test_dispatcher_imports_without_triton(monkeypatch):
    """The package's dispatcher loads on machines without triton (the kernel modules are imported on first use)."""
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` now raises ImportError
    path = Path(reference.__file__).with_name("__init__.py")
    spec = importlib.util.spec_from_file_location("_fresh_lightning", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.BACKENDS[0] == "auto"


def test_tune_sweeps_settings_passed_as_a_config():
    """``bench tune lightning``'s sweep under the interpreter at a tiny shape: every setting timed, the best one of
    them, and the shipped tables untouched."""
    from evalsuite.bench.tune.lightning import tune

    before = common.INTERPRET_CONFIG
    report = tune(seq_len=48, tokens=48, heads=2, head_dim=16, seg_chunks=(1, 2), launches=((4, 1),), verbose=False)
    assert [(r["seg_chunks"], r["walk_launch"]) for r in report["records"]] == [(1, [4, 1]), (2, [4, 1])]
    assert all(r["fwd_ms"] > 0 and r["fwdbwd_ms"] > 0 for r in report["records"])
    assert report["best"] in [{"seg_chunks": g, "walk_launch": [4, 1]} for g in (1, 2)]
    assert common.INTERPRET_CONFIG is before
