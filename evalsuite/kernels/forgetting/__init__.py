"""Forgetting Attention: one entry point that picks the Triton kernel or its PyTorch reference twin.

``attention(q, k, v, cum_q, cum_k)``: q ``[B, Tq, H, D]`` are the last Tq positions of k/v ``[B, Tk, H, D]``;
``cum_*`` are cumulative log forget gates (float32, ``[B, T, H]``) or None for plain causal attention.

Modules (this package imports ``reference`` and ``triton_utils``, which need no triton, and ``decode`` and ``cumsum``
where triton is installed; the rest need it and are imported on first use):
* ``reference.py`` -- the PyTorch twin (blocked and dense), used on CPU and as the tests' ground truth.
* ``common.py`` -- block-config tables, shared jit helpers and input checks of the Triton kernels.
* ``forward.py`` -- full causal forward + autograd: :func:`forgetting_attention_triton`.
* ``backward.py`` (with ``backward_dkdv.py``, ``backward_dq.py``) -- the backward kernels and their launcher.
* ``decode.py`` -- split-K decoding over a cache: :func:`forgetting_attention_decode_triton` (imported with the
  package where triton is installed).
* ``cumsum.py`` -- the time scan of log f on CUDA, a ``torch.library`` operator.
"""

from __future__ import annotations

import torch

from evalsuite.kernels.forgetting.reference import attention_blocked, attention_dense
from evalsuite.kernels.triton_utils import triton_installed

# "sdpa": PyTorch's scaled_dot_product_attention (FlashAttention-2 on CUDA: the papers' "Transformer w/ FA2"
# baselines, e.g. LLaMA-FA2 in arXiv:2405.17381 Figure 1) for ungated full-sequence calls; see :func:`attention`.
BACKENDS = ("auto", "triton", "reference", "dense", "sdpa")

if triton_installed():
    # Bound once here, not imported in cached_attention: that runs inside torch.compile'd decoding steps, where an
    # import statement breaks the graph, and the resumed frames recompiled inside the CUDA-graph capture. The same
    # for the gate scan in compiled training steps.
    from evalsuite.kernels.forgetting.cumsum import cumsum_over_time_triton
    from evalsuite.kernels.forgetting.decode import forgetting_append_decode, forgetting_attention_decode_triton


def cumsum_over_time(log_f):
    """``cumsum(log_f, dim=1)`` for ``[B, T, H]`` gates; differentiable. Returns float32 ``[B, T, H]``.

    On CUDA (with triton) the Triton scan, eagerly and inside ``torch.compile`` alike
    (:mod:`evalsuite.kernels.forgetting.cumsum`: ``torch.cumsum`` along dim 1 of a ``[B, T, H]`` CUDA tensor is
    slow: results/bench/h100/README.md at commit 164742b). It is a ``torch.library`` operator, so a compiled MQAR
    training step keeps one graph with the scan in it, and stacked cells under ``torch.vmap`` fold into its batch
    (inductor's own lowering of that cumsum fails there; the one-graph step of results/mqar/step-time/one-graph/ was
    measured before, with torch's cumsum fused into the gate's log-sigmoid). Elsewhere torch's cumsum of a
    time-contiguous copy. Either way the result is a ``[B, T, H]`` view of ``[B, H, T]`` storage, which the kernels
    read as efficiently as the plain layout.
    """
    if log_f.is_cuda and triton_installed():
        return cumsum_over_time_triton(log_f)
    return log_f.float().transpose(1, 2).contiguous().cumsum(-1).transpose(1, 2)


def triton_available(t: torch.Tensor) -> bool:
    """The kernel runs on CUDA tensors in bf16/fp16 with head dim 16-128; anything else uses the reference."""
    if not t.is_cuda or t.dtype not in (torch.bfloat16, torch.float16) or t.shape[-1] not in (16, 32, 64, 128):
        return False
    return triton_installed()


def _autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The inputs in the autocast dtype while autocast is on, as autocast casts a matmul's: the kernels are opaque to
    autocast, so float32 activations reaching them under autocast would fail the Triton kernel's dtype check (with
    ``backend="triton"``) or send ``"auto"`` to the float32 reference."""
    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)


def _sdpa_causal(q, k, v, scale):
    """Plain causal attention through ``torch.nn.functional.scaled_dot_product_attention``; ``[B, T, H, D]`` in and
    out (SDPA takes ``[B, H, T, D]``)."""
    o = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, scale=scale
    )
    return o.transpose(1, 2)


def attention(q, k, v, cum_q=None, cum_k=None, *, key_start=None, scale=None, backend: str = "auto"):
    """Causal (Forgetting) attention with the chosen backend; see the module docstring for shapes.

    ``"sdpa"`` runs an ungated (``cum_q`` None), unpadded full-sequence call (Tq = Tk: training, loss windows)
    through PyTorch's SDPA; any other call (a forget gate, left padding, cached keys) goes to ``"auto"``. Models
    with a forget gate refuse it (:meth:`ForgettingTransformer.set_attention_backend`)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
    q, k, v = _autocast_inputs(q, k, v)
    if backend == "sdpa":
        if cum_q is None and cum_k is None and key_start is None and q.shape[1] == k.shape[1]:
            return _sdpa_causal(q, k, v, scale)
        backend = "auto"  # padded batches (their bias rides on cum) and cached calls: no SDPA form of those
    if backend == "auto":
        backend = "triton" if triton_available(q) else "reference"
    if backend == "dense":
        return attention_dense(q, k, v, cum_q, cum_k, scale=scale, key_start=key_start)
    if backend == "reference":
        return attention_blocked(q, k, v, cum_q, cum_k, scale=scale, key_start=key_start)
    if q.shape[1] == k.shape[1] and key_start is None:
        from evalsuite.kernels.forgetting.forward import forgetting_attention_triton

        return forgetting_attention_triton(q, k, v, cum_q, scale=scale)
    from evalsuite.kernels.forgetting.decode import forgetting_attention_decode_triton

    return forgetting_attention_decode_triton(q, k, v, cum_q, cum_k, scale=scale, key_start=key_start)


def cached_attention(q, k_cache, v_cache, cum_q, cum_cache, key_length, *, key_start=None, backend: str = "auto"):
    """Attention of the newest ``Tq`` positions over a preallocated cache whose filled length lives on the device.

    q ``[B, Tq, H, D]``; k_cache/v_cache ``[B, capacity, H, D]`` and cum_cache ``[B, capacity, H]`` (or None), of
    which the first ``key_length`` rows (a one-element integer tensor, on q's device) are keys. The Triton decode
    kernel reads the length on the device, so this call is CUDA-graph safe; every other backend slices the cache
    at ``int(key_length)``, a host sync (the eager CPU path).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; choose from {', '.join(BACKENDS)}")
    q, k_cache, v_cache = _autocast_inputs(q, k_cache, v_cache)
    if cached_attention_graph_safe(q, backend):
        return forgetting_attention_decode_triton(
            q, k_cache, v_cache, cum_q, cum_cache, key_start=key_start, key_length=key_length
        )
    n = int(key_length)
    cum_k = None if cum_cache is None else cum_cache[:, :n]
    return attention(q, k_cache[:, :n], v_cache[:, :n], cum_q, cum_k, key_start=key_start, backend=backend)


def append_and_attend(q, k, v, log_f, k_cache, v_cache, cum_cache, length, *, key_start=None, copy_rows=(),
                      backend: str = "auto"):  # fmt: skip
    """One decoding step: write this step's key row at ``length`` (a one-element integer tensor on q's device, the
    rows cached before it) and attend the query over the ``length + 1`` cached keys.

    q, k, v ``[B, 1, H, D]``; log_f ``[B, 1, H]`` or None (0: an ungated model whose cache carries left-padding
    biases); k_cache/v_cache ``[B, capacity, H, D]``; cum_cache ``[B, capacity, H]`` float32 or None (no gate).
    The new row's cumulative log forget is the previous row's plus log_f. ``copy_rows``: up to two ``(src, dst)``
    pairs of ``[B, H, D]`` rows the step also writes (``dst.copy_(src)``: FoX (Pro)'s KV-shift rows). The Triton
    decode kernel does all the writes itself (one launch, CUDA-graph safe); every other backend writes with
    ``index_copy_``/``copy_`` and calls :func:`cached_attention` (the twin the tests compare it with). The kernel is
    the operator ``evalsuite::forgetting_append_decode``, opaque to ``torch.compile``.
    """
    q, k, v = _autocast_inputs(q, k, v)  # the caches are written in place: never cast
    if cached_attention_graph_safe(q, backend) and q.dtype == k_cache.dtype == v_cache.dtype:
        src, dst = [row for row, _ in copy_rows], [row for _, row in copy_rows]
        return forgetting_append_decode(q, k, v, log_f, k_cache, v_cache, cum_cache, length, key_start, src, dst)
    cum = None
    if cum_cache is not None:
        cum = cum_cache.index_select(1, length - 1) + (0.0 if log_f is None else log_f)
        cum_cache.index_copy_(1, length, cum)
    k_cache.index_copy_(1, length, k.to(k_cache.dtype))
    v_cache.index_copy_(1, length, v.to(v_cache.dtype))
    for src, dst in copy_rows:
        dst.copy_(src)
    return cached_attention(q, k_cache, v_cache, cum, cum_cache, length + 1, key_start=key_start, backend=backend)


def cached_attention_graph_safe(q: torch.Tensor, backend: str) -> bool:
    """Whether :func:`cached_attention` runs without a host sync for queries like ``q`` (the Triton kernel; cached
    calls of ``"sdpa"`` are ``"auto"``'s)."""
    return backend in ("auto", "triton", "sdpa") and triton_available(q)
