"""The forget-gate bias as one more tensor-core product, for the forward kernel (``GATE_MMA``).

The forward's scores are ``s_ij = scale * q_i.k_j + c_i - c_j`` (:mod:`evalsuite.kernels.forgetting.common`). Added
on the ALU, the bias costs two float operations a score (the subtraction and the add), about a fifth of the key
loop's instructions at D = 64 (results/kernels/README.md, "Where the time goes"). Here it rides on the MMA that
computes ``q_i.k_j``: with ``x = c / scale`` (float32) split into three bf16 parts ``x = hi + lo + lo2`` (8
significant bits each, float32's 24 together),

    qa_i = [hi_i, lo_i, lo2_i, 1, 1, 1, 0, ...],   ka_j = [1, 1, 1, -hi_j, -lo_j, -lo2_j, 0, ...]

give ``qa_i . ka_j = (c_i - c_j) / scale`` in one extra K step of the MMA (:data:`GATE_LANES` lanes), accumulated in
float32 with ``q_i . k_j``; the softmax then takes one fused multiply-add a score, as without a gate. The tensor
cores multiply exactly and round the float32 sum at the magnitude of ``c / scale``, so the bias carries an error of
the order of float32's rounding of ``c`` itself (measured against float64 with ``|c|`` to 1.2e5:
results/kernels/README.md). bf16 only: its range holds ``c / scale`` (fp16's does not).

:func:`gate_operands` fills both ``[B, H, T, GATE_LANES]`` operands in one Triton pass over ``c``;
:func:`gate_operands_reference` is its PyTorch twin (the same float operations, the same bits).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.triton_utils import interpreting

GATE_LANES = tl.constexpr(16)  # one K step of a bf16 MMA; lanes 0-5 carry the bias
BLOCK_T = 256
INTERPRET_BLOCK_T = 16


def _inverse_scale(sm_scale: float) -> float:
    """``1 / scale`` as the float32 both versions multiply by."""
    return float(torch.tensor(1.0 / sm_scale, dtype=torch.float32))


def gate_operands_reference(cum: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """PyTorch twin of :func:`gate_operands`: cum ``[B, T, H]`` float32 -> qa, ka ``[B, H, T, GATE_LANES]`` bf16."""
    x = cum.float().transpose(1, 2) * _inverse_scale(sm_scale)
    hi = x.to(torch.bfloat16)
    rest = x - hi.float()
    lo = rest.to(torch.bfloat16)
    lo2 = (rest - lo.float()).to(torch.bfloat16)
    parts = torch.stack([hi, lo, lo2], dim=-1)
    qa = torch.zeros(*x.shape, GATE_LANES.value, dtype=torch.bfloat16, device=cum.device)
    ka = torch.zeros_like(qa)
    qa[..., 0:3], qa[..., 3:6] = parts, 1.0
    ka[..., 0:3], ka[..., 3:6] = 1.0, -parts
    return qa, ka


@triton.jit
def _round_to_bf16(x):
    """float32 ``x`` rounded to the nearest bf16 value (ties to even), kept in float32. Bit arithmetic rather than a
    cast: the interpreter's float32-to-bf16 cast truncates whatever rounding is asked for, the GPU's rounds."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _gate_operands_kernel(C, QA, KA, T, H, inv_scale, scb, sct, sch, BLOCK_T: tl.constexpr, LANES: tl.constexpr):
    """One program per (batch * head, BLOCK_T steps): ``QA/KA[b, h, t, :]`` from ``C[b, t, h]``. Grid:
    (B * H, cdiv(T, BLOCK_T))."""
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    h = (pid % H).to(tl.int64)
    t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    ok = t < T
    x = tl.load(C + b * scb + h * sch + t.to(tl.int64) * sct, mask=ok, other=0.0) * inv_scale
    hi = _round_to_bf16(x)
    rest = x - hi
    lo = _round_to_bf16(rest)
    lo2 = _round_to_bf16(rest - lo)
    lane = tl.arange(0, LANES)[None, :]
    part = tl.where(lane % 3 == 0, hi[:, None], tl.where(lane % 3 == 1, lo[:, None], lo2[:, None]))
    one = tl.full([BLOCK_T, LANES], 1.0, tl.float32)
    qa = tl.where(lane < 3, part, tl.where(lane < 6, one, 0.0))
    ka = tl.where(lane < 3, one, tl.where(lane < 6, -part, 0.0))
    offs = pid.to(tl.int64) * T * LANES + t[:, None].to(tl.int64) * LANES + lane
    tl.store(QA + offs, qa.to(tl.bfloat16), mask=ok[:, None])
    tl.store(KA + offs, ka.to(tl.bfloat16), mask=ok[:, None])


def gate_operands(cum: torch.Tensor, sm_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """qa, ka ``[B, H, T, GATE_LANES]`` bf16 (contiguous) with ``qa_i . ka_j = (c_i - c_j) / sm_scale`` (module doc).

    cum: ``[B, T, H]`` float32, any strides (a CUDA tensor, or a CPU one under the interpreter)."""
    B, T, H = cum.shape
    qa = triton_utils.empty((B, H, T, GATE_LANES.value), torch.bfloat16, cum.device)
    ka = triton_utils.empty((B, H, T, GATE_LANES.value), torch.bfloat16, cum.device)
    block = INTERPRET_BLOCK_T if interpreting() else BLOCK_T
    _gate_operands_kernel[(B * H, triton.cdiv(T, block))](
        cum, qa, ka, T, H, _inverse_scale(sm_scale), *cum.stride(), BLOCK_T=block, LANES=GATE_LANES
    )
    return qa, ka
