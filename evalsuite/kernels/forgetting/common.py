"""What the Forgetting Attention kernels share: block-config tables, jit helpers, input checks.

Every kernel computes (part of) the function of :mod:`evalsuite.kernels.forgetting.reference`:

    o_i = sum_{j<=i} exp(s_ij) v_j / sum_{j<=i} exp(s_ij),   s_ij = scale * q_i.k_j + c_i - c_j

with ``c = cumsum(log f)`` (float32, computed by the caller) or no bias at all (``cum=None``, plain causal
attention for the Transformer baselines; the same kernel source with a constexpr flag ``HAS_C``).

Layouts: q, k, v, o ``[B, T, H, D]`` (any strides; the head dim should be contiguous for fast loads);
cum ``[B, T, H]`` float32. Internal buffers (LSE, Dvec, dc_k) are ``[B, H, T]`` float32.

Design notes shared by all kernels (FoX paper, Algorithms 1-2):
* Softmax runs in base 2: ``exp(x) = exp2(x * log2 e)``, with ``log2 e`` folded into one multiply (:func:`_scales`).
* The bias ``c_i - c_j`` is formed by subtracting the two float32 values *first* (exact when they are close,
  which they are near the diagonal where attention mass sits), and only then added to the scaled scores:
  at long T, ``|c|`` reaches 1e4..1e5, and adding ``c_i`` to a score before subtracting ``c_j`` would lose
  the score's low bits.
* The same source runs under ``TRITON_INTERPRET=1`` on CPU tensors (tests). There, fixed small block sizes
  are used (``INTERPRET_*``) and no device is queried. The interpreter's ``tl.dot`` mishandles bfloat16 (it
  multiplies the raw uint16 storage), so under the interpreter bf16 dot operands are upcast to float32 first
  (``UPCAST``, :func:`_mm`); the products of bf16 values are exact in float32, so the result is the same function.

The config tables live here and only here, and nothing writes to them: :func:`block_config` and
:func:`decode_config` read the shipped settings, and a caller with other settings (``evalsuite bench tune``, tests)
passes them to the launchers as arguments.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from evalsuite.kernels.triton_utils import has_tma, interpreting

LOG2E = 1.4426950408889634

# Block configurations, per head dim: (BLOCK_M, BLOCK_N, num_warps, num_stages).
# Forward and dQ: one program per BLOCK_M query rows, stepping over keys BLOCK_N at a time.
# dK/dV: one program per BLOCK_N keys, stepping over queries BLOCK_M at a time.
# Tuned at T=16384, B*T=65536, H=16 (``evalsuite bench tune forgetting``; the top forward configs swap places run to
# run); D=16/32 use configs checked for correctness but not tuned. Measurements: results/kernels/ (the block sweep
# itself: results/bench/h100/fwd-sweep/ at commit 164742b).
# The constraints (BLOCK_M % BLOCK_N == 0 forward/dQ, BLOCK_N % BLOCK_M == 0 dK/dV) are asserted at launch.
FWD_CONFIGS = {16: (256, 64, 8, 3), 32: (256, 64, 8, 3), 64: (128, 64, 4, 4), 128: (128, 64, 8, 4)}
BWD_DKDV_CONFIGS = {16: (32, 64, 4, 4), 32: (32, 64, 4, 4), 64: (32, 64, 4, 3), 128: (32, 128, 8, 3)}
BWD_DQ_CONFIGS = {16: (128, 32, 4, 4), 32: (128, 32, 4, 4), 64: (128, 32, 4, 4), 128: (128, 64, 8, 4)}
# Forward: fetch K/V tiles through TMA tensor descriptors (compute capability >= 9 and aligned strides; pointer loads
# otherwise), per head dim; D=16/32 not measured, so off. The variants measured against it and not kept (the query's
# cumsum folded into the LSE, q.k issued a block early, lazy rescaling) are in results/bench/h100/fwd-variants/README.md
# and fwd-sweep/ at commit 164742b; results/kernels/fox-tuning/ keeps the variant sweeps' records.
# Where K/V go through TMA, the key cumsums do too (1-D descriptor, time-contiguous storage: :func:`_time_contiguous`)
# from T = C_TMA_MIN_T: on an H200 3.6% (D = 64) and 6.0% (D = 128) off the forward at 16K, 3.9% at 64K, D = 64 (none
# at D = 128), but 5.6% slower at T = 1K, D = 64 (results/kernels/fox-tuning/c_tma_h200.json).
FWD_TMA = {16: False, 32: False, 64: True, 128: True}
C_TMA_MIN_T = 4096
# Forward: the gate's bias through the tensor cores (gate_operands.py, its operands' pass included) for bf16 inputs,
# from these T on. Against the bias on the ALU in the same process on an H200, forward time ratio at T = 4K, 16K, 64K
# (B * T = 65536, H = 16; the key cumsums through TMA, as the launcher reads them there): D = 64 0.927, 0.889, 0.856;
# D = 128 0.971, 0.961, 0.877. At 1K, against pointer loads of the cumsums (the launcher's choice below
# C_TMA_MIN_T): 1.04 (D = 64) and 1.03 (D = 128), ratios of the medians
# (results/kernels/fox-tuning/tune_forgetting_tma_h200.json). D = 16/32 not measured, so off.
GATE_MMA_MIN_T = {64: 4096, 128: 4096}
# Backward: the dK/dV kernel's q, dO, LSE and Delta tiles and the dQ kernel's K and V through TMA descriptors, without
# the gate only, from these T on. Against pointer loads in the same process on an H200
# (results/kernels/fox-tuning/bwd_tma_h200.json): without the gate 0.84-0.88x the backward's time at D = 64 from 4K
# and 0.91-0.96x at D = 128 from 16K, slower below (up to 1.14x at 1K, D = 128); with the gate 0.98-1.21x at D = 64
# and 0.98-1.11x at D = 128 from 1K to 64K (no gain above 2.4%), so off.
BWD_TMA_MIN_T = {64: 4096, 128: 16384}
# Backward: the gate's bias through the tensor cores (as the forward's, the operands computed again), for bf16 inputs
# from these T on. Against the bias on the ALU (pointer loads) in the same process on an H200, backward time ratio at
# T = 1K, 4K, 16K, 64K: D = 64 1.017, 0.986, 0.955, 0.984; D = 128 0.922, 0.954, 0.964, 0.955. With it, the tiles
# and the operands through TMA against pointers: D = 64 1.098, 0.998, 0.991, 0.960; D = 128 1.201, 1.041, 0.996,
# 0.987, so only where it gained more than 1% (results/kernels/fox-tuning/tune_forgetting_tma_bwd_h200.json).
BWD_GATE_MMA_MIN_T = {64: 4096, 128: 1024}
BWD_GATE_MMA_TMA_MIN_T = {64: 65536}
# Decode: (BLOCK_N, num_warps, num_stages); BLOCK_M follows Tq. From the decode sweep (``evalsuite bench tune
# forgetting-decode``) on an H200 (24 heads of 64, bf16, caches past the L2; results/kernels/fox-tuning/
# decode_sweep_h200.json): (64, 2, 3) within 1% of the best at batch 1 after 4K and 16K keys, the best at batch 8.
DECODE_CONFIG = (64, 2, 3)
# Under the interpreter: small blocks, so tests at T <= 256 still cover several diagonal / off-diagonal blocks.
INTERPRET_FWD = (32, 16, 4, 1)
INTERPRET_DKDV = (16, 32, 4, 1)
INTERPRET_DQ = (32, 16, 4, 1)
INTERPRET_DECODE = (16, 4, 1)

HEAD_DIMS = (16, 32, 64, 128)


@dataclass(frozen=True)
class BlockConfig:
    """The full-sequence kernels' launch settings at one head dim: ``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` of
    the forward, the dK/dV and the dQ kernels, and whether the forward reads K/V through TMA descriptors (where
    :func:`_tma_usable` allows it)."""

    fwd: tuple[int, int, int, int]
    dkdv: tuple[int, int, int, int]
    dq: tuple[int, int, int, int]
    tma: bool

    def flat(self) -> list[int]:
        """The 13 integers the custom operators carry (a torch.library schema takes no dataclass)."""
        return [*self.fwd, *self.dkdv, *self.dq, int(self.tma)]

    @classmethod
    def unflat(cls, values) -> BlockConfig:
        """The inverse of :meth:`flat`."""
        v = [int(x) for x in values]
        return cls(tuple(v[0:4]), tuple(v[4:8]), tuple(v[8:12]), bool(v[12]))


def block_config(head_dim: int) -> BlockConfig:
    """The shipped settings for ``head_dim``: the GPU tables, or the interpreter's small blocks (TMA as on a GPU,
    emulated)."""
    tma = FWD_TMA.get(head_dim, False)
    if interpreting():
        return BlockConfig(INTERPRET_FWD, INTERPRET_DKDV, INTERPRET_DQ, tma)
    return BlockConfig(FWD_CONFIGS[head_dim], BWD_DKDV_CONFIGS[head_dim], BWD_DQ_CONFIGS[head_dim], tma)


def decode_config() -> tuple[int, int, int]:
    """The decode kernel's shipped ``(BLOCK_N, num_warps, num_stages)``: the GPU's, or the interpreter's."""
    return INTERPRET_DECODE if interpreting() else DECODE_CONFIG


# The strides of c are left unspecialised, so one compiled kernel serves c in [B, T, H] storage (the natural
# result of a cumsum) and in time-major storage (see cumsum_over_time); measured as fast as specialised strides.
VECTOR_STRIDES = ("stride_cb", "stride_ct", "stride_ch")


# ----------------------------------------------------------------------------------------------------------------
# Jit helpers
# ----------------------------------------------------------------------------------------------------------------


@triton.jit
def _mm(a, b, acc, UPCAST: tl.constexpr):
    """``acc + a @ b`` with float32 accumulation (operands upcast first under the interpreter, see module doc)."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def _softmax_update(acc, l_i, m_i, s, v, mult, UPCAST: tl.constexpr):
    """One online-softmax step: fold scores s [BLOCK_M, BLOCK_N] and values v [BLOCK_N, D] into (acc, l_i, m_i)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2((m_i - m_new) * mult)
    p = tl.exp2(s * mult - (m_new * mult)[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = _mm(p.to(v.dtype), v, acc * alpha[:, None], UPCAST)
    return acc, l_i, m_new


# ----------------------------------------------------------------------------------------------------------------
# Host helpers
# ----------------------------------------------------------------------------------------------------------------


def _check_inputs(q, k, v):
    """q, k, v: 4-d ``[B, T, H, D]``, one dtype (bf16/fp16), one device, D in :data:`HEAD_DIMS`."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"expected q, k, v as [B, T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"q, k, v must share dtype bfloat16 or float16; got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dim {q.shape[-1]} not supported; use one of {HEAD_DIMS}")
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")


def _strides4(t):
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


def _upcast(dtype) -> bool:
    """The ``UPCAST`` flag: bf16 dot operands go through float32 under the interpreter only (module doc)."""
    return interpreting() and dtype == torch.bfloat16


def _scales(scale, D, has_c):
    """(sm_scale, mult): scores are ``qk * sm_scale + bias`` when there is a bias (then exp2 needs ``log2 e``),
    and raw ``qk`` without one (then ``mult`` carries the scale too, saving one multiply per score)."""
    sm_scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    return (sm_scale, LOG2E) if has_c else (sm_scale, sm_scale * LOG2E)


def _tma_usable(*tensors) -> bool:
    """TMA needs compute capability >= 9 (any device under the interpreter, which emulates descriptors without
    driver queries), a unit-stride head dim and 16-byte aligned bases and strides."""
    t0 = tensors[0]
    if not interpreting() and not (t0.is_cuda and has_tma(t0.device.index or 0)):
        return False
    for t in tensors:
        size = t.element_size()
        if t.stride(3) != 1 or t.data_ptr() % 16 or any(t.stride(i) * size % 16 for i in range(3)):
            return False
    return True


def key_cumsums_through_tma(T: int) -> bool:
    """The forward's default for reading the key cumsums through a 1-D descriptor (where K/V go through TMA and the
    storage allows it, :func:`_time_contiguous`): from :data:`C_TMA_MIN_T` keys on a GPU, at any T under the
    interpreter (so small tests cover it)."""
    return interpreting() or T >= C_TMA_MIN_T


def _gate_mma_from(table: dict, head_dim: int, T: int, dtype: torch.dtype) -> bool:
    """Whether ``table``'s band (``{head_dim: first T}``) takes the gate's bias through the tensor cores: bf16 only,
    and always for bf16 under the interpreter, so small tests cover the path."""
    if dtype != torch.bfloat16:
        return False
    return interpreting() or T >= table.get(head_dim, float("inf"))


def gate_through_mma(head_dim: int, T: int, dtype: torch.dtype) -> bool:
    """The forward's default for adding the gate's bias through the tensor cores (:data:`GATE_MMA_MIN_T`)."""
    return _gate_mma_from(GATE_MMA_MIN_T, head_dim, T, dtype)


def backward_gate_through_mma(head_dim: int, T: int, dtype: torch.dtype) -> bool:
    """The backward's default for adding the gate's bias through the tensor cores (:data:`BWD_GATE_MMA_MIN_T`)."""
    return _gate_mma_from(BWD_GATE_MMA_MIN_T, head_dim, T, dtype)


def backward_tiles_through_tma(head_dim: int, T: int, gated: bool, gate_mma: bool = False) -> bool:
    """The backward's default for reading its tiles through TMA (:data:`BWD_TMA_MIN_T` without the gate,
    :data:`BWD_GATE_MMA_TMA_MIN_T` with its bias through the tensor cores, off with the bias on the ALU; always
    under the interpreter, so small tests cover the path)."""
    if interpreting():
        return True
    table = BWD_GATE_MMA_TMA_MIN_T if gate_mma else {} if gated else BWD_TMA_MIN_T
    return T >= table.get(head_dim, float("inf"))


def _time_contiguous(cum) -> bool:
    """Whether a 1-D TMA descriptor can read ``cum`` ``[B, T, H]`` float32 per (batch, head): unit time stride and
    16-byte aligned (batch, head) starts (time-major storage, :func:`cumsum_over_time`'s, with T a multiple of 4).
    Called where :func:`_tma_usable` already holds for K and V (the device side)."""
    size = cum.element_size()
    aligned = cum.data_ptr() % 16 == 0 and all(cum.stride(i) * size % 16 == 0 for i in (0, 2))
    return cum.stride(1) == 1 and aligned
