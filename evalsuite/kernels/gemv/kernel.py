"""The few-row linear map ``y = x @ W.T + b`` as one Triton kernel that streams W once; the math is
:func:`.reference.few_row_linear_reference`'s.

Shapes: x ``[M, K]`` contiguous with ``1 <= M <= ROWS`` (16), W ``[N, K]`` contiguous, b ``[N]`` or none, y ``[M, N]``
in x's dtype. Grid ``(cdiv(N, BLOCK_N),)``: each program owns ``BLOCK_N`` rows of W (outputs ``n0 : n0 + BLOCK_N``)
and walks K in ``BLOCK_K`` steps, loading the x rows padded to ``ROWS`` (rows ``>= M`` masked) and a
``[BLOCK_N, BLOCK_K]`` tile of W (contiguous along K: each row a coalesced run of ``2 * BLOCK_K`` bytes in bf16), and
accumulating ``x @ W_tile.T`` in float32 through the tensor cores (:func:`~evalsuite.kernels.jit_helpers.mm`). Bias
is added in float32 and y stored once. At decode M is 1-16, so the work is a GEMV bound by W's bytes: narrow
``BLOCK_N`` tiles give N / BLOCK_N programs, each keeping ``num_stages - 1`` tiles of W in flight (Triton's software
pipeline of the K loop).

Addresses: the full K blocks take no column mask (so the loads stay 16-byte vectors where K % 16 == 0, which the JIT
sees); the ragged tail re-reads the row's last ``BLOCK_K`` columns with the already-summed ones masked off, so no
lane of it leaves the row; rows of W and x past N and M are clamped (:func:`~evalsuite.kernels.jit_helpers.in_range`)
and masked. K must be at least 16 (``tl.dot``'s smallest K); the launcher shrinks ``BLOCK_K`` to fit a shorter K.

Launch settings (``GPU_CONFIGS`` per dtype, ``INTERPRET_CONFIG`` under ``TRITON_INTERPRET=1``: small blocks, so test
shapes cover several blocks and ragged tails) are read-only; a caller with others passes ``config`` to
:func:`few_row_linear_launch`. The operator ``evalsuite::few_row_linear`` (``torch.library``) keeps the kernel
opaque to ``torch.compile``; it has no autograd (the dispatcher takes it only where no gradient is needed), and
under ``torch.vmap`` over a stack's cells it is a batched matmul.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType

import torch
import triton
import triton.language as tl

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import cells_first
from evalsuite.kernels.gemv import MAX_ROWS as ROWS  # x rows each program holds: the most rows the kernel takes
from evalsuite.kernels.gemv import MIN_K
from evalsuite.kernels.jit_helpers import in_range, mm, wait_for_previous_kernel


@dataclass(frozen=True)
class GemvConfig:
    """Launch settings: ``block_n`` rows of W a program, ``block_k`` columns a step, warps and pipeline stages."""

    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# 16 KB of W a stage (32 rows of 256 bf16 or 128 fp32 values), 4 stages (3 tiles in flight). On an H200 (bf16,
# 1 row) 32 rows a program beat 16 on LM heads (50257 x 2048: 49.8 against 63.7 us) and matched it on small maps;
# 512-wide steps with 3 stages and 128-wide with 6 were slower (results/decode/gemv/).
GPU_CONFIGS = MappingProxyType(
    {
        torch.bfloat16: GemvConfig(32, 256, 4, 4),
        torch.float16: GemvConfig(32, 256, 4, 4),
        torch.float32: GemvConfig(32, 128, 4, 4),
    }
)
INTERPRET_CONFIG = GemvConfig(16, 32, 4, 1)


def default_config(dtype: torch.dtype) -> GemvConfig:
    """The shipped settings: the interpreter's, or the GPU's for ``dtype``."""
    return INTERPRET_CONFIG if triton_utils.interpreting() else GPU_CONFIGS[dtype]


@triton.jit
def _few_row_linear_kernel(
    X, W, Bias, Y, M, N, K,
    HAS_BIAS: tl.constexpr, ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PREC: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Y[:M, n0 : n0 + BLOCK_N] = X @ W[n0 : n0 + BLOCK_N].T (+ Bias), float32 accumulation. Grid: (cdiv(N, BLOCK_N),).
    Needs K >= BLOCK_K. ``PDL``: launched with programmatic dependent launch (the first W tile loads before the
    wait)."""
    rows = tl.arange(0, ROWS)
    row_ok = rows < M
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    offs_k = tl.arange(0, BLOCK_K)
    # row offsets: int64 multiples of K (the JIT sees K % 16 == 0 where it holds, so full blocks load as vectors)
    x_ptrs = X + in_range(rows, M)[:, None] * K + offs_k[None, :]
    w_ptrs = W + in_range(cols, N)[:, None] * K + offs_k[None, :]
    # W's first tile before the wait: no kernel writes weights, so its load overlaps the previous kernel's tail
    w = tl.load(w_ptrs, mask=col_ok[:, None], other=0.0)
    wait_for_previous_kernel(PDL)
    x = tl.load(x_ptrs, mask=row_ok[:, None], other=0.0)
    acc = mm(x, tl.trans(w), tl.zeros((ROWS, BLOCK_N), dtype=tl.float32), UPCAST, PREC)
    k_full = (K // BLOCK_K) * BLOCK_K
    for k0 in range(BLOCK_K, k_full, BLOCK_K):  # full blocks: row masks only, uniform along K
        x = tl.load(x_ptrs + k0, mask=row_ok[:, None], other=0.0)
        w = tl.load(w_ptrs + k0, mask=col_ok[:, None], other=0.0)
        acc = mm(x, tl.trans(w), acc, UPCAST, PREC)
    if k_full < K:
        # the ragged tail: the row's last BLOCK_K columns, those summed above masked off (every lane in the row)
        k_tail = K - BLOCK_K
        new = (k_tail + offs_k) >= k_full
        x = tl.load(x_ptrs + k_tail, mask=row_ok[:, None] & new[None, :], other=0.0)
        w = tl.load(w_ptrs + k_tail, mask=col_ok[:, None] & new[None, :], other=0.0)
        acc = mm(x, tl.trans(w), acc, UPCAST, PREC)
    if HAS_BIAS:
        acc += tl.load(Bias + in_range(cols, N), mask=col_ok, other=0.0).to(tl.float32)[None, :]
    y_ptrs = Y + in_range(rows, M)[:, None] * N + in_range(cols, N)[None, :]
    tl.store(y_ptrs, acc.to(Y.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


def few_row_linear_launch(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, config: GemvConfig | None = None
) -> torch.Tensor:
    """``x [M, K]`` (1 <= M <= 16, K >= 16), ``weight [N, K]``, ``bias [N]`` or None, all contiguous and of one dtype
    (bf16, fp16, fp32) -> ``y [M, N]`` in that dtype, through the kernel at ``config`` (default: the shipped one)."""
    (m, k), n = x.shape, weight.shape[0]
    if not (1 <= m <= ROWS and k >= MIN_K and weight.shape[1] == k and x.is_contiguous() and weight.is_contiguous()):
        raise ValueError(f"few_row_linear: x {tuple(x.shape)} and weight {tuple(weight.shape)} do not fit the kernel")
    cfg = config or default_config(x.dtype)
    block_k = min(cfg.block_k, 1 << (k.bit_length() - 1))  # a power of two <= K, so the tail's block stays in the row
    y = triton_utils.empty((m, n), dtype=x.dtype, device=x.device)
    pdl = triton_utils.pdl(x.device)
    _few_row_linear_kernel[(triton.cdiv(n, cfg.block_n),)](
        x, weight, weight if bias is None else bias, y, m, n, k,
        HAS_BIAS=bias is not None, ROWS=ROWS, BLOCK_N=cfg.block_n, BLOCK_K=block_k,
        UPCAST=triton_utils.interpreting(),  # the interpreter's bf16 dot is broken
        PREC="tf32x3" if x.dtype == torch.float32 else "tf32",  # float32 accuracy for float32 inputs
        PDL=pdl, launch_pdl=pdl, num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    return y


# An operator (torch.library), so that torch.compile keeps the kernel opaque in its graph instead of tracing into it.
@torch.library.custom_op("evalsuite::few_row_linear", mutates_args=())
def few_row_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """:func:`few_row_linear_launch` at the shipped config: ``x [M, K]`` -> ``[M, N]``."""
    return few_row_linear_launch(x, weight, bias)


@few_row_linear_triton.register_fake
def _(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


@few_row_linear_triton.register_vmap
def _(info, in_dims, x, weight, bias):
    """Under ``torch.vmap`` over cells (:mod:`evalsuite.kernels.cells`), where each cell has its own weight, the map is
    a batched matmul: ``[C, M, K] @ [C, K, N] (+ [C, 1, N])``, each cell exactly ``x @ W.T + b`` of its own."""
    cells = info.batch_size
    x, weight = cells_first(x, in_dims[0], cells), cells_first(weight, in_dims[1], cells)
    y = torch.matmul(x, weight.transpose(1, 2))
    if bias is not None:
        y = y + cells_first(bias, in_dims[2], cells)[:, None, :]
    return y, 0
