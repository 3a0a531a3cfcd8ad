"""SRMSNorm as two Triton kernels (the Lightning Attention paper's App. F: a Triton SRMSNorm, Figure 7) and their
autograd function; the math is :func:`.reference.srmsnorm_reference`'s.

Forward, one program per tile of ``ROWS`` rows of ``x [N, d]`` (the leading dims flattened; ``ROWS`` and the warps
autotuned per row width on a GPU, fixed under the interpreter), the whole row in registers (``BLOCK_D`` = the next
power of two of d): ``r = rsqrt(sum(x^2) / d + eps)`` in float32, ``y = x r`` in
x's dtype; ``r [N]`` (4 bytes a row) is kept for the backward, which then reads x and dy once and writes dx once:

    dx = r dy - x r^3 (sum(dy x) / d)

(from ``dr/dx_j = -r^3 x_j / d``). PyTorch's eager norm runs the square, mean, rsqrt, product and cast as separate
kernels, each a pass over the tensor, and its backward more; the fused kernels make one read and one write each way.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils


def _tile(d: int) -> tuple[int, int, int]:
    """(BLOCK_D, ROWS, num_warps) for rows of d under the interpreter: about 4096 elements a program, one warp."""
    block_d = triton.next_power_of_2(d)
    return block_d, max(1, 4096 // block_d), 1


def _gpu_configs(block_d: int) -> list:
    """The launch settings tried on a GPU for rows of ``block_d`` columns: 1-16 rows a program (1,024-32,768
    elements) at 4, 8 or 16 warps."""
    rows = [r for r in (1, 2, 4, 8, 16) if 1024 <= r * block_d <= 32768] or [1]
    return [triton.Config({"ROWS": r}, num_warps=w) for r in rows for w in (4, 8, 16)]


@functools.cache
def _tuned(kernel, block_d: int):
    """``kernel`` autotuned over :func:`_gpu_configs` (per row width ``d``, on its first launch at that width)."""
    return triton.autotune(_gpu_configs(block_d), key=["d"])(kernel)


def _launch(kernel, n: int, d: int, *args) -> None:
    """``kernel(*args, n, d, ...)`` over ``n`` rows of ``d``: the interpreter's fixed tile, or autotuned on a GPU."""
    block_d, rows, warps = _tile(d)
    if triton_utils.interpreting():
        kernel[(triton.cdiv(n, rows),)](*args, BLOCK_D=block_d, ROWS=rows, num_warps=warps)
    else:
        _tuned(kernel, block_d)[lambda meta: (triton.cdiv(n, meta["ROWS"]),)](*args, BLOCK_D=block_d)


@triton.jit
def _lanes(n_rows, d, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    """This program's ``[ROWS, BLOCK_D]`` tile: element offsets and mask, and its row offsets and mask ``[ROWS]``.
    Masked lanes get offset 0, so every lane stays inside the tensor (the interpreter's bounds checks)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < d)
    offsets = tl.where(mask, rows[:, None].to(tl.int64) * d + cols[None, :], 0)
    row_mask = rows < n_rows
    return offsets, mask, tl.where(row_mask, rows, 0), row_mask


@triton.jit
def _forward(X, Y, R, n_rows, d, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    offsets, mask, rows, row_mask = _lanes(n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x, axis=1) / d + eps)
    tl.store(Y + offsets, (x * r[:, None]).to(Y.dtype.element_ty), mask=mask)
    tl.store(R + rows, r, mask=row_mask)


@triton.jit
def _backward(X, DY, R, DX, n_rows, d, BLOCK_D: tl.constexpr, ROWS: tl.constexpr):
    offsets, mask, rows, row_mask = _lanes(n_rows, d, BLOCK_D, ROWS)
    x = tl.load(X + offsets, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(DY + offsets, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + rows, mask=row_mask, other=0.0)
    dot = tl.sum(dy * x, axis=1) / d
    dx = r[:, None] * dy - x * (r * r * r * dot)[:, None]
    tl.store(DX + offsets, dx.to(DX.dtype.element_ty), mask=mask)


def srmsnorm_forward(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [N, d]`` contiguous -> ``(y [N, d]`` in x's dtype, ``r [N]`` float32)."""
    n, d = x.shape
    y = triton_utils.empty(x.shape, dtype=x.dtype, device=x.device)
    r = triton_utils.empty((n,), dtype=torch.float32, device=x.device)
    _launch(_forward, n, d, x, y, r, n, d, eps)
    return y, r


def srmsnorm_backward(x: torch.Tensor, dy: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """``dx [N, d]`` (x's dtype) from ``x``, ``dy [N, d]`` (contiguous) and the forward's ``r [N]``."""
    n, d = x.shape
    dx = triton_utils.empty(x.shape, dtype=x.dtype, device=x.device)
    _launch(_backward, n, d, x, dy, r, dx, n, d)
    return dx


class SRMSNormTriton(torch.autograd.Function):
    """``y = SRMSNorm(x)`` over the last dim of ``x [..., d]``; saves x and ``r`` (4 bytes a row)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, eps: float) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).contiguous()
        y, r = srmsnorm_forward(flat, eps)
        ctx.save_for_backward(flat, r)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        flat, r = ctx.saved_tensors
        dx = srmsnorm_backward(flat, dy.reshape(flat.shape).contiguous(), r)
        return dx.view(dy.shape), None


def srmsnorm_triton(x: torch.Tensor, eps: float) -> torch.Tensor:
    """SRMSNorm of ``x [..., d]`` through the Triton kernels (differentiable)."""
    return SRMSNormTriton.apply(x, eps)
