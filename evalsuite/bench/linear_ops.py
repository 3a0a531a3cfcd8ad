"""The linear-time ops the benchmarks run, and their providers: who computes GSA and Lightning Attention, on which
inputs. Shared by :mod:`.linear` (timings, parity), :mod:`.decode` (decoding costs), :mod:`.linear_report` and the
tuner (:mod:`evalsuite.bench.tune`).

Providers of a full sequence (:func:`op_call`, inputs from :func:`make_inputs`):

- ``gsa_triton`` / ``gsa_chunked``: :func:`~evalsuite.kernels.gated_slot.gated_slot_attention` (backend
  "triton" / "chunked"), m = 64 slots, scale 1.0, ``log_alpha = logsigmoid(randn) / 8``; gradients to q, k, v
  and log_alpha.
- ``fla_chunk_gsa``: fla's ``chunk_gsa(q, k, v, s, g)`` with ``g = log_alpha`` and ``s = 1 - exp(g)`` computed
  outside the timed call (a separate leaf in fwdbwd: fla is not charged for the chain rule through s).
- ``lightning_triton`` / ``lightning_chunked``: :func:`~evalsuite.kernels.lightning.lightning_attention`, the
  ALiBi slopes ``2^(-8 h / H)``, h = 1..H.
- ``fla_simple_gla``: fla's ``chunk_simple_gla(q, k, v, g_gamma=-slope, scale=1.0)`` (the Lightning schedule).
- ``lightning_vanilla``: :func:`vanilla_lightning`, the same op as the quadratic left product in plain PyTorch (the
  Lightning paper's "Vanilla", arXiv:2405.17381 §5.1 and Figure 4): O(T^2) time and memory.
- ``sdpa_causal``: softmax attention, for scale; ``sdpa_flash``: the same restricted to PyTorch's FlashAttention-2
  backend (``torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)``), our stand-in for the paper's "Flash2".

Decode providers (:data:`DECODE_PROVIDERS`): ours through the dispatchers and fla's fused recurrent ops.
"""

from __future__ import annotations

import torch

from evalsuite.bench.common import Unavailable, fla_op

OPS = ("gsa", "lightning")
OP_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_chunk_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_simple_gla", "lightning_vanilla"),
}
DECODE_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_recurrent_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_recurrent_simple_gla"),
}
SDPA = "sdpa_causal"
SDPA_FLASH = "sdpa_flash"
SDPA_PROVIDERS = (SDPA, SDPA_FLASH)
VANILLA = "lightning_vanilla"
PEERS = {"gsa": "fla_chunk_gsa", "lightning": "fla_simple_gla"}
PROVIDERS = tuple(dict.fromkeys([*OP_PROVIDERS["gsa"], *OP_PROVIDERS["lightning"], *SDPA_PROVIDERS,
                                 *DECODE_PROVIDERS["gsa"], *DECODE_PROVIDERS["lightning"]]))  # fmt: skip
CUDA_PROVIDERS = ("gsa_triton", "fla_chunk_gsa", "lightning_triton", "fla_simple_gla", SDPA,
                  "fla_recurrent_gsa", "fla_recurrent_simple_gla")  # fmt: skip
CPU_PROVIDERS = ("gsa_chunked", "lightning_chunked", SDPA)


def default_providers(device=None) -> tuple[str, ...]:
    """Ours on Triton plus the fla peers and SDPA on CUDA; the chunked PyTorch twins and SDPA elsewhere."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return CUDA_PROVIDERS if device.type == "cuda" else CPU_PROVIDERS


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Lightning's per-head decay rates (TNL's code schedule at layer 0, without the layer factor), float32 ``[H]``."""
    from evalsuite.models.tnl.model import alibi_slopes as slopes

    return torch.tensor(slopes(n_heads), dtype=torch.float32)


def make_inputs(op, B, T, H, D, n_slots=64, dtype=torch.bfloat16, device="cpu", seed=0, grad=False) -> dict:
    """Random inputs of ``op`` in the ``[B, T, H, .]`` layout: q, k ~ N(0, 1/sqrt(D)) (unit-variance q.k), v ~ N(0,
    1), an output gradient ``do``; GSA: ``log_alpha = logsigmoid(randn) / 8`` float32 ``[B, T, H, m]``; Lightning:
    ``slope`` (ALiBi, ``[H]``). Leaves (``requires_grad`` when ``grad``) are listed under ``"leaves"``."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape, scale=1.0, dt=dtype):
        return (torch.randn(*shape, device=device, generator=gen) * scale).to(dt).requires_grad_(grad)

    x = dict(q=randn(B, T, H, D, scale=D**-0.25), k=randn(B, T, H, D, scale=D**-0.25), v=randn(B, T, H, D))
    if op == "gsa":
        g = torch.randn(B, T, H, n_slots, device=device, generator=gen)
        x["log_alpha"] = (torch.nn.functional.logsigmoid(g) / 8).requires_grad_(grad)
    elif op == "lightning":
        x["slope"] = alibi_slopes(H).to(device)
    else:
        raise ValueError(f"unknown op {op!r}; choose from {', '.join(OPS)}")
    x["do"] = torch.randn(B, T, H, D, device=device, generator=gen).to(dtype)
    x["leaves"] = [x[n] for n in ("q", "k", "v", "log_alpha") if n in x and grad]
    return x


def op_call(provider: str, x: dict, grad: bool = False):
    """(call, leaves): ``call()`` runs ``provider`` forward on the inputs ``x`` of :func:`make_inputs` and returns
    the output ``[B, T, H, D]``; leaves are the tensors that get gradients. Raises :class:`Unavailable`."""
    q, k, v = x["q"], x["k"], x["v"]
    leaves = list(x["leaves"])
    if provider in ("gsa_triton", "gsa_chunked", "lightning_triton", "lightning_chunked"):
        backend = provider.split("_")[1]
        if backend == "triton" and not q.is_cuda:
            raise Unavailable("needs CUDA")
        if provider.startswith("gsa"):
            from evalsuite.kernels.gated_slot import gated_slot_attention

            g = x["log_alpha"]
            return (lambda: gated_slot_attention(q, k, v, g, scale=1.0, backend=backend)[0]), leaves
        from evalsuite.kernels.lightning import lightning_attention

        slope = x["slope"]
        return (lambda: lightning_attention(q, k, v, slope, backend=backend)[0]), leaves
    if provider == "fla_chunk_gsa":
        fn = fla_op("gsa.chunk_gsa")
        if fn is None:
            raise Unavailable("fla not installed")
        g = x["log_alpha"]
        s = (-torch.expm1(g.detach())).to(q.dtype).requires_grad_(grad)  # fla's GSA layer: s = 1 - exp(g)
        x["fla_s"] = s
        return (lambda: fn(q, k, v, s, g, scale=1.0, output_final_state=False)[0]), leaves + ([s] if grad else [])
    if provider == "fla_simple_gla":
        fn = fla_op("simple_gla.chunk_simple_gla")
        if fn is None:
            raise Unavailable("fla not installed")
        g_gamma = -x["slope"]
        return (lambda: fn(q, k, v, g_gamma=g_gamma, scale=1.0)[0]), leaves
    if provider == VANILLA:
        slope = x["slope"]
        return (lambda: vanilla_lightning(q, k, v, slope)), leaves
    if provider in SDPA_PROVIDERS:
        return _sdpa_call(provider, q, k, v, grad)
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")


def _sdpa_call(provider, q, k, v, grad):
    """SDPA causal on ``[B, H, T, D]`` copies made here (outside the timed call); ``sdpa_flash`` pins the backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qh, kh, vh = (t.detach().transpose(1, 2).contiguous().requires_grad_(grad) for t in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    leaves = [qh, kh, vh] if grad else []
    if provider == SDPA:
        return (lambda: sdpa(qh, kh, vh, is_causal=True).transpose(1, 2)), leaves

    def call():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):  # no fallback: a shape flash cannot run is an error
            return sdpa(qh, kh, vh, is_causal=True).transpose(1, 2)

    return call, leaves


def vanilla_lightning(q, k, v, slope):
    """Lightning Attention's op as the left product ``O = [(Q K^T) * M] V`` with the decay mask ``M[t, s] =
    exp(-slope (t - s))`` for ``t >= s``, else 0 (arXiv:2405.17381 eq. 15 with the decay; the paper's "Vanilla" of
    §5.1). q, k ``[B, T, H, dk]``, v ``[B, T, H, dv]``, slope ``[H]``; returns ``[B, T, H, dv]``.

    Plain PyTorch in the inputs' dtype: the ``[H, T, T]`` mask (built here, in float32 or float64, as part of the
    op) and the ``[B, H, T, T]`` scores are materialised, so time and memory grow as T^2 -- what the paper measures
    Lightning against.
    """
    T = q.shape[1]
    exact = torch.promote_types(q.dtype, torch.float32)
    t = torch.arange(T, device=q.device, dtype=exact)
    gap = t[:, None] - t[None, :]
    mask = torch.exp(-slope.to(q.device, exact)[:, None, None] * gap.clamp(min=0)).masked_fill(gap < 0, 0)
    qh, kh, vh = (x.transpose(1, 2) for x in (q, k, v))  # [B, H, T, .]
    return (((qh @ kh.transpose(-1, -2)) * mask.to(q.dtype)) @ vh).transpose(1, 2)
