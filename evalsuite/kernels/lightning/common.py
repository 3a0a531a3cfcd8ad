"""What the Lightning Attention kernels share: chunking, block configs, jit helpers, input checks.

Every kernel computes (part of) the function of :mod:`evalsuite.kernels.lightning.reference` (0-based positions):

    kv_t = lambda kv_{t-1} + k_t v_t^T   (kv_{-1} = h0),   o_t = kv_t^T q_t,   lambda = exp(-slope) per head

Layouts: q, k ``[B, T, H, dk]``, v ``[B, T, H, dv]`` (any strides), slope ``[H]`` float32; states ``[dk, dv]``
float32 per (batch, head). Internal state buffers are contiguous ``[B*H, n, dk, dv]``.

Chunking (:func:`chunking`, with a :class:`LaunchConfig`): the sequence is cut into chunks of ``BT`` positions (64 on
GPU: the paper's block size B) and the chunks into segments of ``G`` chunks (16 on GPU: 1024 positions; fewer for
short sequences with few heads). Every pass is a walk over the chunks of each segment with the state in registers
(:mod:`.walk`: the paper's Algorithms 5-6 within a segment), parallel over segments, joined by a scan over the
segment totals (:mod:`.scan`); :mod:`.chunk` lists the passes of the forward and the backward.

Decay conventions (all exponents are distances, >= 0, so every factor is a power of lambda <= 1 and nothing
overflows for any slope >= 0): within a chunk of length L (ragged at the tail) with 0-based row c, the query-side
inter-chunk factor is ``lambda^(c+1)``, the key-side factor of the chunk's state update ``lambda^(L-1-c)``, the chunk
decay ``lambda^L`` and the intra mask ``M[r, c] = lambda^(r-c)`` for ``r >= c`` (Algorithm 5 with 1-based rows).

Addresses: no lane of any load or store points outside its buffer, masked-off lanes included (:func:`in_range`):
rows past the ragged end of the sequence address its last row, segments past either end of a partial scan block
its first or last segment. A masked-off lane is not meant to be read, but in a software-pipelined loop (the walk,
the scan) it still goes out as a zero-byte ``cp.async`` at the computed address, and the compiler issues such
copies ahead of time for iterations that never run too -- e.g. the reverse walk's chunk before the first one -- so
the kernels keep even those addresses inside the buffers. The interpreter tests check every lane
(:func:`evalsuite.kernels.triton_utils.interpreter_bounds_check`). Launch geometry: the forward chooses ``(BT, G)``
once (:func:`chunking`) and its backward reuses it (saved on the autograd context); grids are (tiles, segments, B*H)
and (tiles, B*H), so segments and B*H must each stay <= 65535 (CUDA's grid y/z limit).

Numerics: products accumulate in float32 and the running state is float32 in registers. With bf16 inputs the
inter-chunk product takes the state rounded to bf16 (a bf16 tensor-core product, as the intra-chunk ones); with
fp16 inputs it stays float32 (tf32: fp16's range is too small for undecayed states), with fp32 inputs 3xTF32.
Segment states, the scan (full-precision fp32 dots) and the returned states are always float32. Under
``TRITON_INTERPRET=1`` the interpreter's ``tl.dot`` mishandles bf16, so bf16 operands are upcast first (``UPCAST``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from evalsuite.kernels.lightning.reference import _check
from evalsuite.kernels.triton_utils import interpreting

LOG2E = 1.4426950408889634
LOG2E_JIT = tl.constexpr(LOG2E)  # the form jit functions may read as a global
HEAD_DIMS = (16, 32, 64, 128, 256)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# decode: (BK, BV, num_warps) -- one program per dv tile, looping over dk in BK steps.
DECODE_CONFIGS = {(dk, dv): (min(dk, 64), min(dv, 32), 4) for dk in HEAD_DIMS for dv in HEAD_DIMS}


@dataclass(frozen=True)
class LaunchConfig:
    """How the full-sequence kernels cut and launch their work (read-only: a caller with other settings, the tuner
    or a test, passes its own to :func:`~evalsuite.kernels.lightning.chunk.lightning_chunk_triton`).

    Attributes:
        chunk: chunk length BT in positions.
        seg_chunks: chunks per segment G, halved for short inputs with few heads while fewer than ``min_programs``
            (batch, head, segment) walks would run (0: never halved).
        walk_columns: state columns ``BC`` per walk program, at most; None: as many as keep the ``[dA, BC]``
            float32 slice within ``walk_state_elems`` (32 registers per thread at 4 warps).
        walk_launch: the walk's ``(num_warps, num_stages)``; None: from the operand rows' bytes (:func:`walk_config`).
        scan: the segment scan's ``(SB segments per step, BE state elements per program, num_warps)``; SB >= 16 for
            tl.dot on a GPU.
    """

    chunk: int
    seg_chunks: int
    min_programs: int
    walk_columns: int | None = None
    walk_state_elems: int = 64 * 64
    walk_launch: tuple[int, int] | None = None
    scan: tuple[int, int, int] = (16, 128, 4)


# GPU: chunks of 64 (the paper's B) in segments of 16 (1024 positions). Interpreter: 16 and 2, so tests at T <= 100
# still cover several chunks per segment, several segments, several scan steps and a ragged tail; state slices of 16
# columns (several tiles in tests); one scan program per (batch, head) (the interpreter pays per program).
GPU_CONFIG = LaunchConfig(chunk=64, seg_chunks=16, min_programs=512)
INTERPRET_CONFIG = LaunchConfig(chunk=16, seg_chunks=2, min_programs=0, walk_columns=16, walk_launch=(4, 1),
                                scan=(2, 1 << 16, 4))  # fmt: skip


def launch_config() -> LaunchConfig:
    """The shipped settings: :data:`INTERPRET_CONFIG` under the interpreter, else :data:`GPU_CONFIG`."""
    return INTERPRET_CONFIG if interpreting() else GPU_CONFIG


def walk_config(da: int, dc: int, dtype, config: LaunchConfig) -> tuple[int, int, int]:
    """``(BC, num_warps, num_stages)`` of a walk with a ``[da, dc]`` state: state columns per program, chosen so the
    slice fits ``config``'s budget; operand tiles ``[BT, da]`` are triple-buffered when their rows are short
    (at most 128 bytes: bf16 heads of 64), double-buffered up to 256 bytes, single-buffered beyond. Measured on an
    H100 at dk = dv = 64, bf16, T = 16384 (``evalsuite bench tune lightning``, results/linear-kernels/lightning/):
    4 warps and 3 stages beat 4 x 2 and 8 x 2 for forward+backward by 30%."""
    if config.walk_columns is not None:
        bc = min(dc, config.walk_columns)
    else:
        bc = min(dc, max(16, config.walk_state_elems // da))
    if config.walk_launch is not None:
        return bc, *config.walk_launch
    row_bytes = da * torch.finfo(dtype).bits // 8
    if row_bytes > 256:
        return bc, 8, 1
    return bc, 4, (3 if row_bytes <= 128 else 2)


def chunking(T: int, BH: int, config: LaunchConfig) -> tuple[int, int]:
    """(BT, G): chunk length and chunks per segment for a sequence of ``T`` positions and ``BH`` = batch * heads,
    by :func:`segment_rule` with ``config``'s constants. The forward picks it once and hands it to its backward
    (saved on the autograd context), so both always walk the same chunks and segments."""
    return segment_rule(T, BH, config.chunk, config.seg_chunks, config.min_programs)


def segment_rule(T: int, BH: int, chunk: int, seg_chunks: int, min_programs: int) -> tuple[int, int]:
    """Chunks of ``chunk`` positions, ``seg_chunks`` chunks per segment halved while fewer than ``min_programs``
    (batch, head, segment) walks would run (short sequences with few heads)."""
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
