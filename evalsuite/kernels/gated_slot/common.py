"""What the Gated Slot Attention kernels share: block configs, jit helpers, input checks.

Both GLA passes of GSA (``reference.py``; arXiv:2409.07146 App. B, Algorithm 1) keep a state with the slot
dimension first:
``hk^T [m, dk]`` for pass 1 and ``hv [m, dv]`` for pass 2, both updated as ``H_t = diag(alpha_t) H_{t-1} +
s_t x_t^T`` (x = k or v). Pass 1 reads along d (``o1_t = H_t q_t``, an m-vector), pass 2 along m
(``o_t = H_t^T p_t``). The chunked forward and backward are built from four per-chunk shapes of one formula and
two state scans, sequential over the chunks or over segments of them (:mod:`.chunk_kernels`, :mod:`.state_kernels`);
this module holds the pieces they share.

Numerics:
* Gates are log-space float32. Within a chunk ``b`` is the inclusive cumsum of ``log alpha`` (from the chunk start),
  computed in registers (``tl.cumsum``). Every factor taken stays within float32's range (:mod:`.chunk_kernels`),
  so any gate is safe; log alpha is clamped at -20 as each kernel loads it (:data:`G_FLOOR`).
* The write strength ``s = 1 - exp(g) = -expm1(g)`` is computed with a Taylor series near 0 (Triton has no
  ``expm1``), so weak gates keep full relative precision.
* ``tl.dot`` takes operands in the input dtype (bf16/fp16: tensor cores, fp32 accumulation; fp32 inputs: 3xTF32,
  about fp32 accuracy on tensor cores; IEEE FMA dots made an fp32 MQAR training step 10x slower than bf16 on an H100,
  results/mqar/step_time/README.md at commit 164742b), see :func:`dot_flags`. The gate-scaled products of the
  per-chunk kernels carry decay factors in (0, 1]; fp16 would flush the small ones (its smallest normal is 6e-5), so
  for fp16 inputs those take float32 operands as tf32 (``dot_flags(dtype, gated=True)``). Under
  ``TRITON_INTERPRET=1`` the interpreter's ``tl.dot`` mishandles bf16 storage, so operands are rounded to the
  input dtype and multiplied in float32; the interpreter's fp32 -> bf16 conversion truncates (round toward zero),
  so the tests see a slightly worse rounding than a GPU.
* The per-chunk kernels are vectorised: no loops over rows; every in-chunk product is a ``[C, C] x [C, .]`` tile.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from evalsuite.kernels.gated_slot.reference import LOG_ALPHA_FLOOR
from evalsuite.kernels.triton_utils import interpreting

HEAD_DIMS = (16, 32, 64, 128, 256, 512)
SLOTS = (16, 32, 64, 128)

# Rows per micro-block: pairs of rows in one micro-block take their decay as exp(l_r) * exp(-l_s), l the log-gate
# cumsum restarted at the micro-block's start; for s < r, -l_s sums at most MICRO - 1 gates clamped at -20
# (LOG_ALPHA_FLOOR), so the larger factor is <= e^60, inside float32's (and bf16's, tf32's) range of e^88.
MICRO = tl.constexpr(4)
# Every kernel clamps log alpha at this floor as it loads it (the launchers pass it unclamped; chunk.py says why the
# floor), and the dgate kernel zeroes the gradient below it, as torch.clamp's backward would.
G_FLOOR = tl.constexpr(LOG_ALPHA_FLOOR)


# GPU configuration. CHUNK: rows per chunk (one program per chunk in the per-chunk kernels, one step of the
# sequential state scans); SUB: rows per sub-chunk, a multiple of MICRO (pairs across sub-chunks take CHUNK/SUB - 1
# products, pairs across the micro-blocks of a sub-chunk SUB/MICRO - 1, pairs in a micro-block one); STATE_BD: d
# tile per program of the state scans, grid (dk/BD + dv/BD, segments, B*H); SEG_*: when and how the state scans cut
# the sequence into segments (:func:`segment_chunks`); READ_BD and DGATE_BD: inner d step of the read
# and dgate kernels (they contract over d; read's no wider than its slot tile, :func:`read_tiles`); WRITE_BD: d tile
# per program of the kernels whose output is over d (write, write_rev); *_BM: slots per tile (read, dgate: one
# program per tile; pair, write: a loop over the tiles); *_WARPS per kernel family. The per-chunk kernels work on
# ``CHUNK x CHUNK`` and ``CHUNK x BM`` tiles with tl.dot (wgmma on H100). Chosen with ``evalsuite bench tune gsa``
# on an H200 (results/linear-kernels/h200/tune_gsa_*.json): pair and write tiles of 64 slots with a 4-warp pair
# kernel took forward + backward from 17.6 to 15.1 ms at the benchmark's shape (B 4, T 16K, H 16, dk = dv = m = 64:
# whole-m tiles; the pair kernel's sm_90 build spills 80-104 bytes) and from 12.7 to 12.2 ms at the MQAR d = 512
# layer (dk = dv = m = 128, two tiles; spills 456-616 bytes), within 3% of that shape's best (pair tiles of 32).
# Chunks of 32 and sub-chunks of 8 or 32 were slower or no faster. The sweep prints the best as a dict to paste
# here. Both tables are read-only: a caller with other settings passes its own mapping to the launchers
# (``config=``).
GPU_CONFIG = MappingProxyType(
    {
        "CHUNK": 64,
        "SUB": 16,
        "STATE_BD": 32,
        "STATE_WARPS": 4,
        "STATE_STAGES": 2,
        # Segments only when fewer walks than SEG_PROGRAMS (about 2 per SM of an H100/H200's 132) would run: a segmented
        # scan adds a scan across segments and a pass over every chunk's state (the fix-up, state_kernels), which pays
        # only on an underfilled GPU. Then SEG_CHUNKS chunks a segment (4,096 rows) or more, for at most SEG_WALKS
        # walks: at B 1, T 64K, H 16, D = m = 64 on an H200 segments of 64 chunks took forward + backward to 15.9 ms
        # against 16.1 (32 chunks), 16.6 (16) and 21.0 with one walk per sequence
        # (results/linear-kernels/h200/segment_chunks.json, segments_64k.json).
        "SEG_PROGRAMS": 256,
        "SEG_CHUNKS": 64,
        "SEG_WALKS": 4096,
        "READ_BD": 64,
        "READ_BM": 64,  # 32 faults (illegal memory access) on the H100 with triton 3.6 at dk = 128: read_tiles
        "READ_WARPS": 4,
        "PAIR_BM": 64,
        "PAIR_WARPS": 4,
        "WRITE_BD": 64,
        "WRITE_BM": 64,
        "WRITE_WARPS": 4,
        "DGATE_BD": 64,
        "DGATE_BM": 32,
        "DGATE_WARPS": 8,
        "STAGES": 1,
        "DECODE_BD": 32,  # rows of a decode step's state tiles (decode.py): 16 tiles a head of 512
        "DECODE_WARPS": 4,
    }
)
# Interpreter: chunks of 32 in sub-chunks of 16 (so T ~ 40..100 spans several chunks, several sub-chunks and a
# ragged tail), d tiles of 16 (so dk = 32 already takes two tiles), state scans in segments of 2 chunks (so T > 64
# takes the segment scan, T <= 64 the one walk).
INTERPRET_CONFIG = MappingProxyType(
    {
        "CHUNK": 32,
        "SUB": 16,
        "STATE_BD": 16,
        "STATE_WARPS": 1,
        "STATE_STAGES": 1,
        "SEG_PROGRAMS": 1 << 30,  # fixed (no device to ask): every sequence of more than SEG_CHUNKS chunks is segmented
        "SEG_CHUNKS": 2,
        "SEG_WALKS": 1 << 30,
        "READ_BD": 16,
        "READ_BM": 16,
        "READ_WARPS": 1,
        "PAIR_BM": 16,
        "PAIR_WARPS": 1,
        "WRITE_BD": 16,
        "WRITE_BM": 16,
        "WRITE_WARPS": 1,
        "DGATE_BD": 16,
        "DGATE_BM": 16,
        "DGATE_WARPS": 1,
        "STAGES": 1,
        "DECODE_BD": 16,
        "DECODE_WARPS": 1,
    }
)

_TL_DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def config(override: Mapping | None = None) -> Mapping:
    """The block configuration of a launch: ``override`` (a full mapping with every key of :data:`GPU_CONFIG`: tuning,
    tests) or the shipped one, :data:`INTERPRET_CONFIG` under the interpreter, else :data:`GPU_CONFIG`; checked."""
    cfg = override if override is not None else (INTERPRET_CONFIG if interpreting() else GPU_CONFIG)
    if cfg["CHUNK"] % cfg["SUB"] or cfg["SUB"] % MICRO.value:
        raise ValueError(f"GSA kernels: CHUNK must be a multiple of SUB and SUB of {MICRO.value}; got {cfg}")
    if cfg["SEG_CHUNKS"] < 1 or cfg["SEG_WALKS"] < 1:
        raise ValueError(f"GSA kernels: SEG_CHUNKS and SEG_WALKS must be >= 1; got {cfg}")
    return cfg


def segment_chunks(n_chunks: int, walks: int, cfg: Mapping) -> int:
    """Chunks per segment of the state scans (:mod:`.state_kernels`) over ``n_chunks`` chunks, where ``walks`` programs
    (d tiles x B*H) walk each segment: all of them (one segment, a single walk per program) while ``walks`` reaches
    ``cfg["SEG_PROGRAMS"]``; else ``SEG_CHUNKS`` chunks, more where over ``SEG_WALKS`` walks would run (which bounds
    the sequential scan across segments)."""
    if walks >= cfg["SEG_PROGRAMS"]:
        return n_chunks
    return min(n_chunks, max(cfg["SEG_CHUNKS"], triton.cdiv(n_chunks * walks, cfg["SEG_WALKS"])))


def read_tiles(cfg: Mapping, d: int, m: int) -> tuple[int, int]:
    """``(BD, BM)`` of the read kernel over head dim ``d`` and ``m`` slots: ``BM = min(READ_BM, m)`` slots a program
    and a d step ``BD = min(READ_BD, d)`` no wider than BM. Its sm_90 build (triton 3.6) with BD > BM faulted with an
    illegal memory access on an H100 (BM 32, BD 64 at dk = 128; commit 001e2be), and that build differs from the
    clean ones in its shared-memory swizzles (d tiles swizzled twice as wide as the slot tiles). Shapes with dk <= m,
    and the shipped dk = 128 over 64 or 128 slots, keep their tiles; gsa-tiny (dk 32, m 16) steps d by 16."""
    bm = min(cfg["READ_BM"], m)
    return min(cfg["READ_BD"], d, bm), bm


def dot_flags(dtype: torch.dtype, gated: bool = False) -> dict:
    """Constexpr kwargs of every kernel that multiplies. Every plain ``tl.dot`` there reads
    ``tl.dot(a.to(DT).to(MT), b.to(DT).to(MT), acc, input_precision=PREC)``: operands rounded to the input dtype
    DT, multiplied as MT (= DT on a GPU; float32 under the interpreter), 3xTF32 products for fp32 inputs.
    With ``gated`` (the per-chunk kernels) also GT, GMT, GPREC for the gate-scaled products, whose operands may
    be as small as float32 allows: bf16 as DT (float32's exponent range); fp16 -> float32 operands as tf32 (fp16
    would flush them); fp32 -> 3xTF32 (TF32 keeps fp32's exponent range)."""
    emulate = interpreting()
    flags = {
        "DT": _TL_DTYPES[dtype],
        "MT": tl.float32 if emulate else _TL_DTYPES[dtype],
        "PREC": "tf32x3" if dtype == torch.float32 else "tf32",
    }
    if gated:
        gt = tl.float32 if dtype == torch.float16 else _TL_DTYPES[dtype]
        flags.update(GT=gt, GMT=tl.float32 if emulate else gt, GPREC=flags["PREC"])
    return flags


def check_sizes(dk: int, dv: int, m: int) -> None:
    if dk not in HEAD_DIMS or dv not in HEAD_DIMS:
        raise ValueError(f"GSA Triton kernels support head dims {HEAD_DIMS}; got dk={dk}, dv={dv}")
    if m not in SLOTS:
        raise ValueError(f"GSA Triton kernels support slot counts {SLOTS}; got m={m}")


def check_dtypes(q, k, v) -> None:
    if not (q.dtype == k.dtype == v.dtype) or v.dtype not in _TL_DTYPES:
        raise TypeError(f"q, k, v must share one dtype of bf16/fp16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")


# ----------------------------------------------------------------------------------------------------------------
# Jit helpers. Under the interpreter every call of a jit helper re-patches triton.language (milliseconds per call),
# so the kernels call only these few, once per block level or slot tile.
# ----------------------------------------------------------------------------------------------------------------

# Taylor coefficients of -expm1(g) = -g (1 + g/2 + g^2/6 + g^3/24 + g^4/120 + ...), used for g > -0.1 (relative
# error < 1e-8), where 1 - exp(g) would lose bits (_write_strength).
E3 = tl.constexpr(1.0 / 6.0)
E4 = tl.constexpr(1.0 / 24.0)
E5 = tl.constexpr(1.0 / 120.0)


@triton.jit
def _write_strength(g):
    """``s = 1 - exp(g) = -expm1(g)`` of log gates g (any shape, float32), to full relative precision near g = 0."""
    return tl.where(g > -0.1, -g * (1 + g * (0.5 + g * (E3 + g * (E4 + g * E5)))), 1 - tl.exp(g))


@triton.jit
def _local_cumsum(g, C: tl.constexpr, S: tl.constexpr, M: tl.constexpr):
    """Inclusive cumsum over rows of ``g [C, M]``, restarted at every block of S rows."""
    return tl.reshape(tl.cumsum(tl.reshape(g, (C // S, S, M)), 1), (C, M))


@triton.jit
def _earlier_factor(outer, rows, j, C: tl.constexpr, P: tl.constexpr, S: tl.constexpr, M: tl.constexpr):
    """``[C, M]`` decay from row r to the start of child block j of r's parent block (parents of P rows, children of
    S rows): ``exp(outer_ref - outer_r)`` with ``outer_ref`` = outer at the row before child j (the last row of
    child j - 1), for rows r before child j in their parent; 0 for the others. ``outer`` is the log-gate cumsum
    restarted at every parent block (non-increasing within it), so every exponent taken is <= 0."""
    if P == C:  # one parent: the reference row is one row of outer
        ref = tl.sum(tl.where(rows[:, None] == j * S - 1, outer, 0.0), 0)[None, :]
    else:  # every parent's own reference row, broadcast over the parent's rows
        ref = tl.sum(tl.where(tl.arange(0, P)[None, :, None] == j * S - 1, tl.reshape(outer, (C // P, P, M)), 0.0), 1)
        ref = tl.reshape(tl.broadcast_to(ref[:, None, :], (C // P, P, M)), (C, M))
    early = (rows % P < j * S)[:, None]
    return tl.where(early, tl.exp(tl.where(early, ref - outer, 0.0)), 0.0)


@triton.jit
def _load_gates(G, row, ok, offs_m, M: tl.constexpr):
    """The log gates ``G [rows, M]`` of rows ``row`` (0 past T: ``ok`` false) and slots offs_m, clamped at
    :data:`G_FLOOR`, float32 ``[len(row), len(offs_m)]``: how every kernel reads them."""
    return tl.maximum(tl.load(G + row[:, None] * M + offs_m[None, :], mask=ok[:, None], other=0.0), G_FLOOR)


@triton.jit
def _sub_chunk_refs(G, b, n, h, T, H, offs_m, C: tl.constexpr, BC: tl.constexpr, M: tl.constexpr):
    """``[C // BC, BM]``: the in-chunk cumsum of the clamped log gates at the last row of every sub-chunk of BC rows
    (chunk n of sequence b, head h, slots offs_m), as the cumsum of the sub-chunks' totals from a 3-D load of the
    gates. The same values as rows of the ``[C, BM]`` cumsum up to rounding, without extracting rows from that
    tile: on sm_90 each extraction is a masked sum over rows (lane shuffles), the costlier form (the read kernel:
    1.73 -> 1.58 ms at B 4, T 16K, H 16, D = m = 64 on an H200; in the pair and dgate kernels it measured no faster)."""
    r3 = tl.arange(0, C // BC)[:, None, None] * BC + tl.arange(0, BC)[None, :, None]
    row3 = (b * T + n * C + r3).to(tl.int64) * H + h
    g3 = tl.load(G + row3 * M + offs_m[None, None, :], mask=(n * C + r3) < T, other=0.0)
    return tl.cumsum(tl.sum(tl.maximum(g3, G_FLOOR), 1), 0)


@triton.jit
def _earlier_sub_factor(refs, bc, rows, j, C: tl.constexpr, BC: tl.constexpr):
    """:func:`_earlier_factor` at the sub-chunk level (one parent, the chunk) from :func:`_sub_chunk_refs`:
    ``exp(b_ref - b_r)`` with ``b_ref`` the cumsum at the last row of sub-chunk j - 1, for rows r before sub-chunk
    j; 0 for the others. ``[C, BM]``; the exponent is <= 0 up to the rounding of two summation orders."""
    ref = tl.sum(tl.where(tl.arange(0, C // BC)[:, None] == j - 1, refs, 0.0), 0)[None, :]
    early = (rows < j * BC)[:, None]
    return tl.where(early, tl.exp(tl.where(early, ref - bc, 0.0)), 0.0)


@triton.jit
def _softmax_stats(Z, DP, row, ok, M: tl.constexpr, BM: tl.constexpr, MODE: tl.constexpr):
    """Per row of ``Z [rows, M]`` (the pass-1 logits ``scale * hk^T q``), read BM slots at a time: the max, the sum
    of ``exp(z - max)`` and, in MODE 2, ``<p, dP>`` (0 otherwise), for :func:`_u_tile`."""
    # Tiles accumulate elementwise and reduce once after each loop: a row reduction inside the loop trips an
    # assertion in triton 3.6's TritonGPUOptimizeThreadLocality pass on sm_90.
    tile_max = tl.full([row.shape[0], BM], float("-inf"), tl.float32)
    for m0 in tl.range(0, M, BM):
        offs = row[:, None] * M + m0 + tl.arange(0, BM)[None, :]
        tile_max = tl.maximum(tile_max, tl.load(Z + offs, mask=ok[:, None], other=0.0))
    zmax = tl.max(tile_max, 1)
    tile_sum = tl.zeros([row.shape[0], BM], dtype=tl.float32)
    tile_pdp = tl.zeros([row.shape[0], BM], dtype=tl.float32)
    for m0 in tl.range(0, M, BM):
        offs = row[:, None] * M + m0 + tl.arange(0, BM)[None, :]
        ez = tl.exp(tl.load(Z + offs, mask=ok[:, None], other=0.0) - zmax[:, None])
        tile_sum += ez
        if MODE == 2:
            tile_pdp += ez * tl.load(DP + offs, mask=ok[:, None], other=0.0)
    zsum = tl.sum(tile_sum, 1)
    pdp = tl.sum(tile_pdp, 1)
    return zmax, zsum, pdp / zsum


@triton.jit
def _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, offs_m, M: tl.constexpr, MODE: tl.constexpr):
    """The slot weights ``u [rows, len(offs_m)]`` (float32, 0 on rows past T) that a pass contracts over m, for the
    slots offs_m, from the row statistics of :func:`_softmax_stats`. MODE 1: ``p = softmax(Z)`` over the slots.
    MODE 2: ``e = scale * p * (dP - <p, dP>)``, the gradient of pass 1's raw output (softmax backward)."""
    offs = row[:, None] * M + offs_m[None, :]
    u = tl.exp(tl.load(Z + offs, mask=ok[:, None], other=0.0) - zmax[:, None]) / zsum[:, None]
    if MODE == 2:
        u = scale * u * (tl.load(DP + offs, mask=ok[:, None], other=0.0) - pdp[:, None])
    return tl.where(ok[:, None], u, 0.0)


@triton.jit
def _load_u(Z, DP, row, ok, scale, M: tl.constexpr, MODE: tl.constexpr):
    """:func:`_u_tile` over all M slots (the state scans)."""
    zmax, zsum, pdp = _softmax_stats(Z, DP, row, ok, M, M, MODE)
    return _u_tile(Z, DP, row, ok, scale, zmax, zsum, pdp, tl.arange(0, M), M, MODE)
