"""Lightning Attention: one entry point that picks a Triton kernel or a PyTorch reference twin.

``lightning_attention(q, k, v, slope, initial_state=..., output_final_state=...)`` with q, k ``[B, T, H, dk]``,
v ``[B, T, H, dv]``, slope ``[H]`` float32 (decay ``lambda = exp(-slope)``); returns ``(o [B, T, H, dv], kv)`` with
``kv [B, H, dk, dv]`` float32 (or None). Math: :mod:`.reference`.

Backends: ``"auto"`` (Triton on CUDA, the chunked reference elsewhere), ``"triton"``, ``"chunked"`` (PyTorch,
Algorithm 5), ``"recurrent"`` (the token loop: the ground truth). With ``"auto"``/``"triton"`` a single-token call
with a state (decoding) runs the recurrent Triton step.

Modules: ``reference.py`` (no triton needed); ``chunk.py`` (the forward and backward passes, Algorithms 5-6, and
the autograd function), ``walk.py`` (the one kernel every pass runs: a walk over a segment's chunks with the state
in registers), ``scan.py`` (the scan over segment totals), ``common.py`` (chunking, configs, jit helpers, the design
notes); ``decode.py`` (the one-token step). The one-token step comes with the package where triton is
installed (decoding steps run inside torch.compile, where an import statement breaks the graph); the other Triton
modules are imported on first use.
"""

from __future__ import annotations

import torch

from evalsuite.kernels.lightning.reference import lightning_chunked, lightning_parallel, lightning_recurrent
from evalsuite.kernels.triton_utils import triton_installed

if triton_installed():
    from evalsuite.kernels.lightning.decode import lightning_decode_triton

BACKENDS = ("auto", "triton", "chunked", "recurrent")
__all__ = [
    "BACKENDS",
    "lightning_attention",
    "lightning_chunked",
    "lightning_parallel",
    "lightning_recurrent",
    "triton_available",
]


def triton_available(t: torch.Tensor) -> bool:
    """The kernels run on CUDA tensors (bf16/fp16/fp32); elsewhere the chunked reference runs."""
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32) and triton_installed()


def lightning_attention(q, k, v, slope, *, initial_state=None, output_final_state: bool = False, backend: str = "auto"):
    """Decayed causal linear attention with the chosen backend; differentiable in q, k, v (slope is fixed)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown Lightning backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "triton" if triton_available(q) else "chunked"
    if backend == "recurrent":
        return lightning_recurrent(q, k, v, slope, initial_state, output_final_state)
    if backend == "chunked":
        return lightning_chunked(q, k, v, slope, initial_state, output_final_state)
    if q.shape[1] == 1 and initial_state is not None and not torch.is_grad_enabled():
        return lightning_decode_triton(q, k, v, slope, initial_state)
    from evalsuite.kernels.lightning.chunk import lightning_chunk_triton

    return lightning_chunk_triton(q, k, v, slope, initial_state, output_final_state)
