"""Gated Slot Attention: one entry point that picks a Triton kernel or a PyTorch reference twin.

``gated_slot_attention(q, k, v, log_alpha, scale=..., initial_state=..., output_final_state=...)`` with q, k
``[B, T, H, dk]``, v ``[B, T, H, dv]``, log_alpha ``[B, T, H, m]`` (float32, <= 0); returns ``(o [B, T, H, dv],
state)`` with state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` float32 (or None). Math: :mod:`.reference`.

Backends: ``"auto"`` (Triton on CUDA, the chunked reference elsewhere), ``"triton"``, ``"chunked"`` (PyTorch,
chunk by chunk), ``"recurrent"`` (the naive token loop: the ground truth the others must match).
With ``"auto"``/``"triton"`` a single-token call with a state (decoding) runs the recurrent Triton step.

Modules: ``reference.py`` (no triton needed); ``chunk.py`` (the chunked autograd function and its launchers);
``state_kernels.py`` and ``chunk_kernels.py`` (its Triton kernels: the state scans, in segments joined by a
scan across them for long sequences over few heads; the per-chunk passes);
``common.py`` (block configs, shared jit helpers, checks); ``decode.py`` (the one-token recurrent step). The
one-token step comes with the package where triton is installed (decoding steps run inside torch.compile, where an
import statement breaks the graph); the other Triton modules are imported on first use.
"""

from __future__ import annotations

import torch

from evalsuite.kernels.cells import per_cell
from evalsuite.kernels.gated_slot.reference import gsa_chunked, gsa_parallel, gsa_recurrent
from evalsuite.kernels.triton_utils import triton_installed

if triton_installed():
    from evalsuite.kernels.gated_slot.decode import gsa_decode_triton

BACKENDS = ("auto", "triton", "chunked", "recurrent")
__all__ = ["BACKENDS", "gated_slot_attention", "gsa_chunked", "gsa_parallel", "gsa_recurrent", "triton_available"]


def triton_available(t: torch.Tensor) -> bool:
    """The kernels run on CUDA tensors (bf16/fp16/fp32); elsewhere the chunked reference runs."""
    return t.is_cuda and t.dtype in (torch.bfloat16, torch.float16, torch.float32) and triton_installed()


def gated_slot_attention(
    q,
    k,
    v,
    log_alpha,
    *,
    scale: float = 1.0,
    initial_state=None,
    output_final_state: bool = False,
    backend: str = "auto",
):
    """GSA with the chosen backend; see the module docstring for shapes. Differentiable in q, k, v, log_alpha."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown GSA backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "triton" if triton_available(q) else "chunked"
    if backend == "recurrent":
        return gsa_recurrent(q, k, v, log_alpha, scale, initial_state, output_final_state)
    if backend == "chunked":
        return _chunked_per_cell(q, k, v, log_alpha, scale, initial_state, output_final_state)
    if q.shape[1] == 1 and initial_state is not None and not torch.is_grad_enabled():
        return gsa_decode_triton(q, k, v, log_alpha, scale, initial_state)
    from evalsuite.kernels.gated_slot.chunk import gsa_chunk_triton

    return gsa_chunk_triton(q, k, v, log_alpha, scale, initial_state, output_final_state)


def _chunked_per_cell(q, k, v, log_alpha, scale, initial_state, output_final_state):
    """:func:`gsa_chunked` through :func:`evalsuite.kernels.cells.per_cell`: the reference picks its chunk form from
    the gates' decay (a branch on a value, which ``torch.vmap`` over a stacked model's cells cannot batch), so under
    vmap it runs once per cell."""

    def run(q, k, v, g, hk, hv):
        o, state = gsa_chunked(q, k, v, g, scale, None if hk is None else (hk, hv), output_final_state)
        return (o, *(state or (None, None)))

    hk, hv = initial_state or (None, None)
    o, hk, hv = per_cell(run, q, k, v, log_alpha, hk, hv)
    return o, ((hk, hv) if output_final_state else None)
