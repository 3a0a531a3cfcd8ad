"""Cumulative sum of log forget gates over time, in Triton; its PyTorch twin is ``torch.cumsum(log_f, dim=1)``.

FoX needs ``c = cumsum(log f)`` over time for every (batch, head) before attention. ``torch.cumsum`` along
dim 1 of a ``[B, T, H]`` CUDA tensor is slow; along a time-contiguous copy it is fine but takes two kernels. Here
one program per (batch, head) walks time in blocks of BLOCK_T: an in-register scan per block plus a running carry,
written straight to time-major storage (``[B, H, T]``, returned as a ``[B, T, H]`` view, which the attention
kernels read efficiently). Timings: results/bench/h100/README.md at commit 164742b. The backward is the same scan
run from the end of the sequence (``d log f_t = sum_{s >= t} d c_s``). Both run as one ``torch.library`` operator,
``evalsuite::time_scan``, opaque to torch.compile and batched under torch.vmap.

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


def _output(x: torch.Tensor, reverse: bool, alloc) -> torch.Tensor:
    """The scan's float32 ``[B, T, H]`` output from ``alloc(shape)``: the forward scan in time-major storage (a view
    of ``[B, H, T]``: the attention kernels read it, and the kernel's stores run along time); the reverse scan (the
    backward, feeding the gate's log-sigmoid and projection backward) in plain ``[B, T, H]`` storage."""
    B, T, H = x.shape
    return alloc((B, T, H)) if reverse else alloc((B, H, T)).transpose(1, 2)


# The scan as an operator (torch.library), so that torch.compile keeps it opaque in its graph: inductor's own
# lowering of a time cumsum under torch.vmap (a SplitScan over the stacked cells' gates) crashes in its Triton codegen
# (torch 2.11 / triton 3.6). Its gradient is the same operator scanning the other way; its vmap rule folds the cells
# into the batch (kernels/cells.py).
@torch.library.custom_op("evalsuite::time_scan", mutates_args=())
def _time_scan(x: torch.Tensor, reverse: bool) -> torch.Tensor:
    y = _output(x, reverse, lambda shape: triton_utils.empty(shape, torch.float32, x.device))
    _scan(x, y, reverse)
    return y


@_time_scan.register_fake
def _(x, reverse):
    return _output(x, reverse, lambda shape: x.new_empty(shape, dtype=torch.float32))


def _save_for_backward(ctx, inputs, output):
    ctx.dtype, ctx.reverse = inputs[0].dtype, inputs[1]


def _backward(ctx, grad):  # d x_t = sum of d y_s over s >= t (reverse: s <= t)
    return _time_scan(grad, not ctx.reverse).to(ctx.dtype), None


_time_scan.register_autograd(_backward, setup_context=_save_for_backward)


@_time_scan.register_vmap
def _(info, in_dims, x, reverse):  # the cells of a stack as more rows (kernels/cells.py)
    return fold_rule(_time_scan, info, in_dims, (x, reverse), batched=(0,))


def cumsum_over_time_triton(log_f: torch.Tensor) -> torch.Tensor:
    """``cumsum(log_f, dim=1)`` for ``[B, T, H]`` gates (any float dtype and strides), differentiable.

    Returns float32 ``[B, T, H]``, a view of time-major ``[B, H, T]`` storage.
    """
    if log_f.dim() != 3:
        raise ValueError(f"expected log forget gates [B, T, H]; got shape {tuple(log_f.shape)}")
    return _time_scan(log_f, False)
