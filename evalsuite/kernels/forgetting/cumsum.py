"""Cumulative sum of log forget gates over time, in Triton; its PyTorch twin is ``torch.cumsum(log_f, dim=1)``.

FoX needs ``c = cumsum(log f)`` over time for every (batch, head) before attention. ``torch.cumsum`` along
dim 1 of a ``[B, T, H]`` CUDA tensor is slow; along a time-contiguous copy it is fine but takes two kernels. Here
one program per (batch, head) walks time in blocks of BLOCK_T: an in-register scan per block plus a running carry,
written straight to time-major storage (``[B, H, T]``, returned as a ``[B, T, H]`` view, which the attention
kernels read efficiently). Timings: results/bench/h100/README.md at commit 164742b. The backward is the same scan
run from the end of the sequence (``d log f_t = sum_{s >= t} d c_s``).

The same source runs under ``TRITON_INTERPRET=1`` on CPU tensors (tests), with small blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import fold_rule
from evalsuite.kernels.triton_utils import interpreting

BLOCK_T = 2048
INTERPRET_BLOCK_T = 16


@triton.jit
def _time_scan_kernel(X, Y, T, H, sxb, sxt, sxh, syb, syt, syh, REVERSE: tl.constexpr, BLOCK_T: tl.constexpr):
    """Y[b, t, h] = sum of X[b, s, h] over s <= t (REVERSE: over s >= t), in float32. Grid: (B * H,)."""
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    h = (pid % H).to(tl.int64)
    x_base = X + b * sxb + h * sxh
    y_base = Y + b * syb + h * syh
    offs = tl.arange(0, BLOCK_T)
    carry = tl.zeros([1], dtype=tl.float32)
    for start in range(0, T, BLOCK_T):
        step = start + offs  # position in scan order
        ok = step < T
        t = (T - 1 - step) if REVERSE else step
        t = t.to(tl.int64)
        x = tl.load(x_base + t * sxt, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_base + t * syt, tl.cumsum(x, 0) + carry, mask=ok)
        carry += tl.sum(x, 0)


def _scan(x: torch.Tensor, y: torch.Tensor, reverse: bool) -> None:
    B, T, H = x.shape
    _time_scan_kernel[(B * H,)](
        x, y, T, H, *x.stride(), *y.stride(), REVERSE=reverse, BLOCK_T=INTERPRET_BLOCK_T if interpreting() else BLOCK_T
    )


class _CumsumOverTime(torch.autograd.Function):
    @staticmethod
    def forward(log_f):
        B, T, H = log_f.shape
        cum = triton_utils.empty((B, H, T), torch.float32, log_f.device).transpose(1, 2)
        _scan(log_f, cum, reverse=False)
        return cum

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, grad_cum):
        grad = triton_utils.empty(grad_cum.shape, torch.float32, grad_cum.device)
        _scan(grad_cum, grad, reverse=True)
        return grad.to(ctx.dtype)

    @staticmethod
    def vmap(info, in_dims, log_f):  # the cells of a stack as more rows (kernels/cells.py)
        return fold_rule(_CumsumOverTime.apply, info, in_dims, (log_f,), batched=(0,))


def cumsum_over_time_triton(log_f: torch.Tensor) -> torch.Tensor:
    """``cumsum(log_f, dim=1)`` for ``[B, T, H]`` gates (any float dtype and strides), differentiable.

    Returns float32 ``[B, T, H]``, a view of time-major ``[B, H, T]`` storage.
    """
    if log_f.dim() != 3:
        raise ValueError(f"expected log forget gates [B, T, H]; got shape {tuple(log_f.shape)}")
    return _CumsumOverTime.apply(log_f)
