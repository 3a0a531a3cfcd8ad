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
- ``sdpa_causal``: softmax attention, for scale.

Decode providers (:data:`DECODE_PROVIDERS`): ours through the dispatchers and fla's fused recurrent ops.
"""

from __future__ import annotations

import torch

from evalsuite.bench.common import Unavailable, fla_op

OPS = ("gsa", "lightning")
OP_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_chunk_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_simple_gla"),
}
DECODE_PROVIDERS = {
    "gsa": ("gsa_triton", "gsa_chunked", "fla_recurrent_gsa"),
    "lightning": ("lightning_triton", "lightning_chunked", "fla_recurrent_simple_gla"),
}
SDPA = "sdpa_causal"
PEERS = {"gsa": "fla_chunk_gsa", "lightning": "fla_simple_gla"}
PROVIDERS = tuple(dict.fromkeys([*OP_PROVIDERS["gsa"], *OP_PROVIDERS["lightning"], SDPA,
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
    if provider == SDPA:
        qh, kh, vh = (t.detach().transpose(1, 2).contiguous().requires_grad_(grad) for t in (q, k, v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return (lambda: sdpa(qh, kh, vh, is_causal=True).transpose(1, 2)), [qh, kh, vh] if grad else []
    raise ValueError(f"unknown provider {provider!r}; choose from {', '.join(PROVIDERS)}")
