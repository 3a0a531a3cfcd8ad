"""Few-row linear maps (decode-step GEMVs): one entry point that picks the Triton kernel or ``F.linear``.

``few_row_linear(x, weight, bias=None, backend="auto")``: x ``[..., K]``, weight ``[N, K]``, bias ``[N]`` or None
-> ``[..., N]``, ``x @ weight.T + bias`` in x's dtype. At a decode step x holds 1-16 rows and W (bf16, 2 MB to
200 MB) is read once, so the map is bound by W's bytes. The kernel (``kernel.py``) gives each 32 rows of W a program
and streams them; on an H200 it beat cuBLAS on small maps at one row and on LM heads (:data:`SMALL_MAP`), and inside
a compiled decode step on Hopper, where it launches with programmatic dependent launch after kernels that do too (it
loads its first tile of W while the kernel before it finishes), it takes every map: the compiled FoX (Pro) 760M step
5-10% faster at batch 1 and 8, TNL's 5%, GSA's 0.5% (results/decode/pdl-h200/).

Backends: ``"auto"`` (the kernel on CUDA tensors where it applies and is faster than cuBLAS,
:func:`kernel_is_faster`; else ``F.linear``), ``"triton"`` (the kernel where it applies, CPU tensors under
``TRITON_INTERPRET=1`` included: the tests), ``"reference"`` (``F.linear``). The kernel applies
(:func:`kernel_applies`) with triton installed, a CUDA tensor (any tensor under the interpreter), 1 to
:data:`MAX_ROWS` rows, K >= 16, one dtype of bf16/fp16/fp32 for x, weight and bias, a contiguous weight (and bias)
and no gradient wanted; under autocast x and bias are cast to the autocast dtype first, as ``F.linear`` would, where
the weight has that dtype already (the adapters cast linear layers once). It is the ``torch.library`` operator
``evalsuite::few_row_linear``, opaque to ``torch.compile``.

Modules: ``reference.py`` (the twin, no triton needed), ``kernel.py`` (the kernel, its launch settings and the
operator; imported with this package where triton is installed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from evalsuite.kernels import triton_utils
from evalsuite.kernels.gemv.reference import few_row_linear_reference
from evalsuite.kernels.triton_utils import interpreting, triton_installed

# Read by kernel.py too, which this package imports below, after these
MAX_ROWS = 16  # the kernel's x tile (tl.dot's smallest M): a program holds this many rows
MIN_K = 16  # tl.dot's smallest K
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BACKENDS = ("auto", "triton", "reference")
# Where the kernel beat cuBLAS at decode (H200, bf16, both in CUDA graphs, interleaved: results/decode/gemv/):
# LM heads (N >= 32K) at 1 row (0.73-0.97x cuBLAS' time) and at 8 (0.25x at N = 50257, where cuBLAS fell to
# 0.9 TB/s; 1.01x at 64000 x 1024), small maps at 1 row only (1024 x 1024: 0.56x, 1536 x 1536: 0.83x; at 8 rows
# 1.00x and 1.11x). Between them (the stacked q/k/v and MLP maps, N 2K-11K) cuBLAS was as fast or faster.
SMALL_MAP = 2_500_000  # N * K weights
WIDE_MAP = 32_768  # N

if triton_installed():
    # Bound here, not imported per call: the dispatcher runs inside torch.compile'd decode steps, where an import
    # statement breaks the graph.
    from evalsuite.kernels.gemv.kernel import few_row_linear_triton


def _wants_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def kernel_applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> bool:
    """Whether :func:`few_row_linear` takes the Triton kernel for these arguments (see the module docstring)."""
    if not (triton_installed() and (x.is_cuda or interpreting())):
        return False
    if x.dim() == 0 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        return False
    k = x.shape[-1]
    if k < MIN_K or not 1 <= x.numel() // k <= MAX_ROWS:
        return False
    if x.dtype not in DTYPES or weight.dtype != x.dtype or weight.device != x.device or not weight.is_contiguous():
        return False
    if bias is not None and not (
        bias.dtype == x.dtype and bias.device == x.device and bias.shape == weight.shape[:1] and bias.is_contiguous()
    ):
        return False
    return not _wants_grad(x, weight, bias)


def kernel_is_faster(rows: int, n: int, k: int, launched_early: bool = False) -> bool:
    """Whether the kernel measured faster than cuBLAS for ``rows`` rows of x and a ``[N, K]`` weight (see
    :data:`SMALL_MAP`); ``launched_early``: with programmatic dependent launch (:func:`triton_utils.pdl`) after a
    kernel that lets it, so it loads its first tile of W while that kernel finishes, which cuBLAS' GEMVs do not:
    every map."""
    return launched_early or n >= WIDE_MAP or (rows == 1 and n * k <= SMALL_MAP)


def _autocast(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
    """The arguments as ``F.linear`` sees them under autocast: x and bias in the autocast dtype, where the weight is
    in it already (the adapters cast linear layers once); None where the kernel must leave the call to F.linear (a
    weight autocast would cast on every call)."""
    if not torch.is_autocast_enabled(x.device.type):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(x.device.type)
    if weight.dtype != dtype or not x.is_floating_point():
        return None
    return x.to(dtype), weight, None if bias is None else bias.to(dtype)


def few_row_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str = "auto"
) -> torch.Tensor:
    """``x [..., K] @ weight[N, K].T + bias [N]`` -> ``[..., N]`` with ``backend`` (see the module docstring)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown GEMV backend {backend!r}; choose from {', '.join(BACKENDS)}")
    args = _autocast(x, weight, bias) if backend == "triton" or (backend == "auto" and x.is_cuda) else None
    if args is None or not kernel_applies(*args):
        return F.linear(x, weight, bias)
    x, weight, bias = args
    (n, k), rows = weight.shape, x.numel() // x.shape[-1]
    # Launched early only where the kernel before it lets it: inside a compiled decode step, whose inductor kernels
    # launch with PDL too (models/base.py); after eager kernels the first tile's load overlaps nothing.
    early = torch.compiler.is_compiling() and triton_utils.pdl(x.device)
    if backend == "auto" and not kernel_is_faster(rows, n, k, early):
        return F.linear(x, weight, bias)
    y = few_row_linear_triton(x.reshape(rows, k).contiguous(), weight, bias)
    return y.view(*x.shape[:-1], n)


__all__ = ["BACKENDS", "MAX_ROWS", "few_row_linear", "few_row_linear_reference", "kernel_applies", "kernel_is_faster"]
