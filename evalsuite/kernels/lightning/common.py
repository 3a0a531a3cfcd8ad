"""What the Lightning Attention kernels share: chunking, block-config tables, jit helpers, input checks.

Every kernel computes (part of) the function of :mod:`evalsuite.kernels.lightning.reference` (0-based positions):

    kv_t = lambda kv_{t-1} + k_t v_t^T   (kv_{-1} = h0),   o_t = kv_t^T q_t,   lambda = exp(-slope) per head

Layouts: q, k ``[B, T, H, dk]``, v ``[B, T, H, dv]`` (any strides), slope ``[H]`` float32; states ``[dk, dv]``
float32 per (batch, head). Internal state buffers are contiguous ``[B*H, n, dk, dv]``.

Chunking (:func:`chunking`): the sequence is cut into chunks of ``BT`` positions (64 on GPU) and the chunks into
segments of ``G`` chunks (16 on GPU: 1024 positions; fewer for short sequences with few heads). The forward
(:mod:`.chunk`) runs three kernels:

1. :mod:`.states` ``_chunk_states_kernel`` -- grid (state tiles, segments, B*H): one program walks the ``G`` chunks
   of its segment in order and keeps the segment-local state in registers, storing it at each chunk start
   (``HLOC``) and the segment's total at the end (``SEG``). Parallel over segments, so the work per program and
   the number of programs stay the same at any T for a fixed B*T (the paper's "constant speed").
2. :mod:`.states` ``_segment_scan_kernel`` -- grid (state-element tiles, B*H): turns the segment totals into the
   global state at each segment start (in place), ``SB`` segments per step through a small decay-matrix product,
   and writes the final state.
3. :mod:`.chunk` ``_chunk_fwd_kernel`` -- grid (dv tiles, chunks, B*H), fully parallel: the state before chunk n is
   ``HLOC[n] + lambda^(a_n - a_seg) SEG[seg]``; the output is the intra-chunk left product with the decay mask
   plus the inter-chunk right product (Algorithm 5's two terms).

The backward (Algorithm 6) reruns kernel 1 for the forward states (they are recomputed, not stored), runs kernels 1
and 2 time-reversed on (lambda^(c+1) q, dO) for the state adjoints (``dKV``), and then one parallel kernel per chunk
(:mod:`.chunk_bwd`) for dq, dk, dv. The reverse scan's end value is the gradient of the initial state.

Decay conventions (all exponents are distances, >= 0, so every factor is a power of lambda <= 1 and nothing
overflows for any slope >= 0): within a chunk of length L (ragged at the tail) with 0-based row c, the query-side
inter-chunk factor is ``lambda^(c+1)``, the key-side factor of the chunk's state update ``lambda^(L-1-c)``, the chunk
decay ``lambda^L`` and the intra mask ``M[r, c] = lambda^(r-c)`` for ``r >= c`` (Algorithm 5 with 1-based rows).

Addresses: no lane of any load or store points outside its buffer, masked-off lanes included (:func:`_in_range`):
rows past the ragged end of the sequence address its last row, segments past either end of a partial scan block
its first or last segment. A masked-off lane is not meant to be read, but in a software-pipelined loop (the
chunk-state walk, the scan) it still goes out as a zero-byte ``cp.async`` at the computed address, and the compiler
issues such copies ahead of time for iterations that never run too -- e.g. the reverse walk's chunk before the first
one, ``BT`` rows before q and dO -- so the kernels keep even those addresses inside the buffers. The interpreter
tests check every lane (:func:`evalsuite.kernels.triton_utils.interpreter_bounds_check`). Launch geometry: the
forward chooses ``(BT, G)`` once (:func:`chunking`) and its backward reuses it (saved on the autograd context);
grids are (tiles, segments, B*H), (tiles, B*H), (tiles, chunks, B*H) and (chunks, B*H), so chunks and B*H must
each stay <= 65535 (CUDA's grid y/z limit: T <= 4M positions).

Numerics: products accumulate in float32. With bf16 inputs the segment-local chunk states ``HLOC`` are stored in
bf16 (they feed bf16 tensor-core products anyway); with fp16 and fp32 inputs they stay float32 (fp16's range is too
small for undecayed states) and the state products run in float32 (tf32 for fp16 inputs, 3xTF32 for fp32 inputs).
Segment states, the scan (full-precision fp32 dots) and the returned states are always float32. Under
``TRITON_INTERPRET=1`` the interpreter's ``tl.dot`` mishandles bf16, so bf16 operands are upcast first (``UPCAST``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels.lightning.reference import _check
from evalsuite.kernels.triton_utils import interpreting

LOG2E = 1.4426950408889634
LOG2E_JIT = tl.constexpr(LOG2E)  # the form jit functions may read as a global
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Chunk length BT and chunks per segment G. GPU: 64 (the paper's B) and 1: on an H100 (triton 3.6) the backward
# faulted ("illegal memory access") at every shape with G > 1 and ran at every shape with G = 1, although the
# interpreter's bounds check finds no lane outside its buffer (results/bench/h100/linear/README.md); until that is
# understood the GPU uses one chunk per segment. Interpreter: 16 and 2, so tests at T <= 100 still cover several
# chunks per segment, several segments, several scan steps and a ragged tail.
CHUNK, SEG_CHUNKS = 64, 1
MIN_SEGMENT_PROGRAMS = 512
INTERPRET_CHUNK, INTERPRET_SEG_CHUNKS = 16, 2


def _tile(d: int, cap: int) -> int:
    return min(d, cap)


# Block configurations per (dk, dv). Not timed on hardware yet: sized so that dk = dv = 64 is one tile (no recomputed
# score matrix), larger heads loop over 64-wide tiles; compiled offline for sm90 (triton 3.9), bf16/fp16 without
# register spills (the backward's dv tile is 32 for that; fp32 inputs spill a little: not the fast path).
# states: (BK, BV, num_warps, num_stages) -- one program per [BK, BV] state tile, segment, (batch, head).
# fwd: (BK, BV, num_warps, num_stages) -- one program per [BT, BV] output tile; loops over dk in BK steps.
# bwd: (BK, BV, num_warps, num_stages) -- one program per chunk; loops over dk and dv tiles.
# decode: (BK, BV, num_warps) -- one program per dv tile, looping over dk in BK steps.
STATES_CONFIGS = {(dk, dv): (_tile(dk, 64), _tile(dv, 64), 4, 2) for dk in HEAD_DIMS for dv in HEAD_DIMS}
FWD_CONFIGS = {
    (dk, dv): (_tile(dk, 64), _tile(dv, 64), 4 if dk * dv <= 64 * 64 else 8, 2) for dk in HEAD_DIMS for dv in HEAD_DIMS
}
BWD_CONFIGS = {(dk, dv): (_tile(dk, 64), _tile(dv, 32), 8, 1) for dk in HEAD_DIMS for dv in HEAD_DIMS}
DECODE_CONFIGS = {(dk, dv): (_tile(dk, 64), _tile(dv, 32), 4) for dk in HEAD_DIMS for dv in HEAD_DIMS}
# Segment scan: (SB segments per step, BE state elements per program, num_warps). SB >= 16 for tl.dot on GPU.
SCAN_CONFIG = (16, 128, 4)
# Under the interpreter: tiles of at most 32 (dk) x 16 (dv), so the tests' head sizes span several tiles.
INTERPRET_TILE = (32, 16)
INTERPRET_SCAN = (2, 1 << 16, 4)  # one program per (batch, head): the interpreter pays per program


def interpret_tiles(dk: int, dv: int, extra=(4, 1)):
    """Interpreter block config ``(BK, BV, *extra)``: tiles capped at :data:`INTERPRET_TILE` (read at call time)."""
    return (_tile(dk, INTERPRET_TILE[0]), _tile(dv, INTERPRET_TILE[1]), *extra)


def chunking(T: int, BH: int) -> tuple[int, int]:
    """(BT, G): chunk length and chunks per segment for a sequence of ``T`` positions and ``BH`` = batch * heads.

    Fixed (small) under the interpreter. On GPU, :func:`segment_rule` with BT = 64, G = 16 and
    :data:`MIN_SEGMENT_PROGRAMS`. The forward picks it once and hands it to its backward (saved on the autograd
    context), so both always walk the same chunks and segments.
    """
    if interpreting():
        return INTERPRET_CHUNK, INTERPRET_SEG_CHUNKS
    return segment_rule(T, BH, CHUNK, SEG_CHUNKS, MIN_SEGMENT_PROGRAMS)


def segment_rule(T: int, BH: int, chunk: int, seg_chunks: int, min_programs: int) -> tuple[int, int]:
    """The GPU's rule, with its constants as arguments (tests run it at interpreter scale): chunks of ``chunk``
    positions, ``seg_chunks`` chunks per segment halved while fewer than ``min_programs`` (batch, head, segment)
    programs would run the sequential state kernel (short sequences with few heads)."""
    n_chunks = triton.cdiv(T, chunk)
    g = seg_chunks
    while g > 1 and BH * triton.cdiv(n_chunks, g) < min_programs:
        g //= 2
    return chunk, g


def geometry(T: int, chunks: tuple[int, int]) -> tuple[int, int, int, int]:
    """``(BT, G, NT, NSEG)``: chunk length, chunks per segment, number of chunks and of segments."""
    BT, G = chunks
    NT = triton.cdiv(T, BT)
    return BT, G, NT, triton.cdiv(NT, G)


# ----------------------------------------------------------------------------------------------------------------
# Jit helpers
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _in_range(idx, n):
    """``idx`` clamped into ``[0, n)``, as int64: the index that addresses memory.

    Masked-off lanes (rows past the ragged end of the sequence, segments past either end of a partial scan block)
    keep their mask but address an element inside the buffer, so no lane of any load or store -- nor the loads a
    software-pipelined loop issues ahead for an iteration that never runs -- points outside its buffer.
    """
    return tl.minimum(tl.maximum(idx, 0), n - 1).to(tl.int64)


@triton.jit
def _mm(a, b, acc, UPCAST: tl.constexpr, PREC: tl.constexpr):
    """``acc + a @ b`` with float32 accumulation (bf16 operands upcast under the interpreter, see module doc)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PREC)


# ----------------------------------------------------------------------------------------------------------------
# Host helpers
# ----------------------------------------------------------------------------------------------------------------


def check_inputs(q, k, v, slope, initial_state):
    """Shapes (as the reference), one dtype of bf16/fp16/fp32 for q, k, v, head sizes in :data:`HEAD_DIMS`."""
    _check(q, k, v, slope, initial_state)
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype of bf16/fp16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    dk, dv = q.shape[-1], v.shape[-1]
    if dk not in HEAD_DIMS or dv not in HEAD_DIMS:
        raise ValueError(f"head sizes dk={dk}, dv={dv} not supported; each must be one of {HEAD_DIMS}")
    devices = {q.device, k.device, v.device} | ({initial_state.device} if initial_state is not None else set())
    if len(devices) != 1:
        raise ValueError("q, k, v (and the state) must be on one device")


def slope_f32(slope, device):
    """The per-head slopes as a contiguous float32 vector on the kernels' device (no gradient)."""
    return slope.detach().to(device=device, dtype=torch.float32).contiguous()


def strides4(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def upcast(dtype) -> bool:
    """The ``UPCAST`` flag: bf16 dot operands go through float32 under the interpreter only."""
    return interpreting() and dtype == torch.bfloat16


def precision(dtype) -> str:
    """``input_precision`` for the kernels' dots: 3xTF32 for fp32 inputs (about fp32 accuracy on tensor cores; the
    "ieee" FMA dots spill badly on Hopper at 64 x 64 tiles), the default (tf32, unused by bf16/fp16 dots) otherwise."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def state_dtype(dtype) -> torch.dtype:
    """Storage of the segment-local chunk states: bf16 for bf16 inputs, float32 otherwise (module doc)."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32
