"""Triton jit helpers shared by the kernel families (imports triton: only the Triton modules import this).

* :func:`in_range` -- an index clamped into ``[0, n)``, as int64: masked-off lanes keep their mask but address an
  element inside the buffer, so no lane of any load or store -- nor the loads a software-pipelined loop issues ahead
  for an iteration that never runs -- points outside it (the interpreter tests check every lane).
* :func:`mm` -- ``acc + a @ b`` with float32 accumulation at ``PREC`` (``"tf32x3"`` for fp32 operands, ``"tf32"``
  otherwise); under ``TRITON_INTERPRET=1`` the interpreter's ``tl.dot`` mishandles bf16, so ``UPCAST`` upcasts the
  operands to float32 first.
* :func:`wait_for_previous_kernel` -- the wait a kernel launched with programmatic dependent launch
  (:func:`~evalsuite.kernels.triton_utils.pdl`) makes before it touches memory the kernels before it write.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def in_range(idx, n):
    return tl.minimum(tl.maximum(idx, 0), n - 1).to(tl.int64)


@triton.jit
def mm(a, b, acc, UPCAST: tl.constexpr, PREC: tl.constexpr):
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PREC)


@triton.jit
def wait_for_previous_kernel(PDL: tl.constexpr):
    """With ``PDL`` (the launch took ``launch_pdl``): wait until the previous kernel in the stream has finished and
    its writes are visible, then let the next kernel launch. Every kernel so launched calls this before it reads
    or writes anything another kernel writes, and lets the next one launch only after it (so whatever follows
    also runs after everything before this kernel). Without ``PDL``: nothing (the interpreter lacks both)."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
