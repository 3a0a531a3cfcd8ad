"""What the Grouped Cross Attention kernels share: block configs, jit helpers, input checks.

Both kernels compute (part of) the function of :mod:`evalsuite.kernels.grouped_cross.reference` (Hu et al.,
arXiv:2410.01651, §3.2 eqs. 2-3, App. B "FlashGCA"):

    O_c = sum_k w[c, k] * O'_{c,k},   O'_{c,k} = Softmax_1(scale * Q_c K_{c,k}^T) V_{c,k}

Layouts: q ``[B, C, Sq, H, D]``, k/v ``[B, C, K, Skv, H, D]`` (any strides), w ``[B, C, K]`` (taken as float32).
Internal buffers: the per-chunk log-sum-exp ``L [B*C*H, K, Sq]`` and the per-head partial sums of dw
``[B*C*H, K]``, both float32 and contiguous, rows indexed by ``pid = (b * C + c) * H + h``.

Numerics and conventions:
* Softmax runs in base 2 on the scaled logits ``s = scale * log2(e) * q.k`` (one multiply, ``mult``); ``L`` is in
  the same units, ``L = m + log2(l)``, so ``P = exp2(s - L)``.
* Softmax-off-by-one (Algorithm 1 with the released code's init): the running max starts at ``m = 0`` and the
  running denominator at ``l = 1`` -- exactly the "+1" of ``1 + sum_j exp(x_j)``, a zero logit with a zero value;
  since ``m >= 0`` throughout nothing overflows. Plain softmax starts at ``m = -inf, l = 0``.
* Products accumulate in float32. bf16/fp16 dots run on tensor cores; fp32 inputs use 3xTF32 (about fp32
  accuracy, :func:`precision`). Under ``TRITON_INTERPRET=1`` the interpreter's ``tl.dot`` mishandles bf16, so bf16
  operands are upcast to float32 first (``UPCAST``).
* Addresses: rows past Sq and keys past Skv keep their mask but address the last valid row/key
  (:func:`in_range`), so no lane of any load or store points outside its buffer, masked-off lanes included
  (checked by ``triton_utils.interpreter_bounds_check`` in the tests).
* ``Skv`` is a compile-time constant through ``NUM_KV = cdiv(Skv, BLOCK_N)`` and ``EVEN_KV``: it is DRT's chunk
  length, fixed per model. The per-chunk key blocks are unrolled (``tl.static_range``), so the only run-time loop
  of both kernels is the one over the K retrieved chunks, which the GPU compiler software-pipelines (the next
  chunk's K/V tiles load while this one is processed).

The config tables live here and only here, and nothing writes to them: :func:`fwd_config` and :func:`bwd_config`
read them, and a caller with other settings (tuning, tests) passes a :class:`BlockConfig` to
:func:`~evalsuite.kernels.grouped_cross.forward.gca_triton`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from evalsuite.kernels.grouped_cross.reference import MAX_TRITON_SQ, check_shapes
from evalsuite.kernels.jit_helpers import in_range
from evalsuite.kernels.triton_utils import interpreting, pick_config

LOG2E = 1.4426950408889634
HEAD_DIMS = (16, 32, 64, 128)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
# The backward holds a whole query chunk in one tile (one program per (b, c, h)): Sq <= MAX_SQ rows.
MAX_SQ = MAX_TRITON_SQ


@dataclass(frozen=True)
class BlockConfig:
    """Block settings at one head dim. ``fwd``: (max BLOCK_M, BLOCK_N, num_stages); BLOCK_M = next power of two
    >= Sq, at most the max, so one program usually covers a whole query chunk and reads each retrieved chunk once.
    ``bwd``: (BLOCK_N, num_stages); BLOCK_M = next power of two >= Sq. num_warps: 4 for tiles up to 64 x 64, else 8
    (:func:`_warps`)."""

    fwd: tuple[int, int, int]
    bwd: tuple[int, int]


# GPU, per head dim: chosen by the FlashAttention-2 rules of thumb for DRT's 64 x 64 chunks; at D = 64 the fastest
# forward and backward of the block sweep (``evalsuite bench tune gca``) on an H100
# (results/kernels/gca/gca_tune.json).
GPU_CONFIGS = {
    16: BlockConfig((128, 64, 3), (64, 2)),
    32: BlockConfig((128, 64, 3), (64, 2)),
    64: BlockConfig((128, 64, 3), (64, 2)),
    128: BlockConfig((128, 64, 2), (64, 1)),
}
# Interpreter: 16-row query blocks and 16-key blocks, so test shapes (Sq, Skv up to 65) cover several query and
# key blocks and ragged tails; tests pass the GPU's blocks to reach its one-key-block path.
INTERPRET_CONFIG = BlockConfig((16, 16, 1), (16, 1))


def block_config(head_dim: int) -> BlockConfig:
    """The shipped settings: :data:`INTERPRET_CONFIG` under the interpreter, else the GPU's for ``head_dim``."""
    return pick_config(GPU_CONFIGS, head_dim, INTERPRET_CONFIG)


def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def _warps(block_m: int, head_dim: int) -> int:
    return 4 if block_m * head_dim <= 64 * 64 else 8


def _stages(stages: int, itemsize: int) -> int:
    """One pipeline stage for fp32 tiles (twice the shared memory of bf16): two stages of a ragged 64-key block
    need 262 KB in the backward on an H100 (227 KB there)."""
    return stages if itemsize < 4 else 1


def fwd_config(Sq: int, D: int, itemsize: int = 2, config: BlockConfig | None = None) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the forward for query chunks of ``Sq`` rows, from ``config``
    (default :func:`block_config`)."""
    max_m, block_n, stages = (config or block_config(D)).fwd
    block_m = min(max_m, _pow2(Sq))
    return block_m, block_n, _warps(block_m, D), _stages(stages, itemsize)


def bwd_config(Sq: int, D: int, itemsize: int = 2, config: BlockConfig | None = None) -> tuple[int, int, int, int]:
    """``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of the backward: BLOCK_M covers the whole query chunk."""
    block_n, stages = (config or block_config(D)).bwd
    block_m = _pow2(Sq)
    return block_m, block_n, _warps(block_m, D), _stages(stages, itemsize)


# ----------------------------------------------------------------------------------------------------------------
# Jit helpers
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _load_tile(base, idx, n, stride_s, stride_d, HEAD_DIM: tl.constexpr, EVEN: tl.constexpr):
    """Rows ``idx`` (< n valid, others zero) of a ``[n, HEAD_DIM]`` slice: a ``[len(idx), HEAD_DIM]`` tile."""
    offs_d = tl.arange(0, HEAD_DIM)
    ptrs = base + in_range(idx, n)[:, None] * stride_s + offs_d[None, :] * stride_d
    if EVEN:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(idx < n)[:, None], other=0.0)


# ----------------------------------------------------------------------------------------------------------------
# Host helpers
# ----------------------------------------------------------------------------------------------------------------


def check_inputs(q, k, v, w) -> None:
    """Shapes (as the reference), one dtype of bf16/fp16/fp32 for q, k, v, D in :data:`HEAD_DIMS`, one device."""
    check_shapes(q, k, v, w)
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share one dtype of bf16/fp16/fp32; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} not supported; use one of {HEAD_DIMS}")
    if not (q.device == k.device == v.device == w.device):
        raise ValueError("q, k, v and w must be on one device")


def upcast(dtype) -> bool:
    """The ``UPCAST`` flag: bf16 dot operands go through float32 under the interpreter only."""
    return interpreting() and dtype == torch.bfloat16


def precision(dtype) -> str:
    """``input_precision`` of the dots: 3xTF32 for fp32 inputs, the default otherwise (unused by bf16/fp16)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def kv_blocks(Skv: int, block_n: int) -> tuple[int, bool]:
    """``(NUM_KV, EVEN_KV)``: key blocks per retrieved chunk, and whether Skv fills them exactly (no key mask)."""
    return triton.cdiv(Skv, block_n), Skv % block_n == 0


def scale_of(scale, D: int) -> float:
    return D**-0.5 if scale is None else float(scale)
