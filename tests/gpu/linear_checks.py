"""The GSA and Lightning Triton kernels against their chunked PyTorch twins at real shapes: what
tests/gpu/test_linear.py checks."""

import torch
import torch.nn.functional as F

from evalsuite.bench.common import rel_error
from evalsuite.kernels.gated_slot import gated_slot_attention
from evalsuite.kernels.lightning import lightning_attention
from evalsuite.models.tnl.model import alibi_slopes


def _inputs(op, B, T, H, dk, dv, m, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(B, T, H, dk, device="cuda", generator=g) * dk**-0.25 for _ in range(2))
    v = torch.randn(B, T, H, dv, device="cuda", generator=g)
    q, k, v = (t.bfloat16() for t in (q, k, v))
    if op == "gsa":
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
        extra = F.logsigmoid(torch.randn(B, T, H, m, device="cuda", generator=g) * 2) / 8
    else:
        extra = torch.tensor(alibi_slopes(H), device="cuda")
    return q, k, v, extra


def _call(op, q, k, v, extra, backend, state=None, final=False):
    if op == "gsa":
        return gated_slot_attention(q, k, v, extra, scale=1.0, initial_state=state, output_final_state=final,
                                    backend=backend)  # fmt: skip
    return lightning_attention(q, k, v, extra, initial_state=state, output_final_state=final, backend=backend)


def _decode_error(op, leaves, extra, T) -> float:
    """Prefill 256 tokens with the kernel, then up to 8 single tokens: the decode kernel against the token loop
    from the same state."""
    with torch.no_grad():
        n = min(T, 256)
        _, state = _call(op, *[t[:, :n] for t in leaves[:3]], *([extra[:, :n]] if op == "gsa" else [extra]),
                         backend="triton", final=True)  # fmt: skip
        ref_state = tuple(s.clone() for s in state) if op == "gsa" else state.clone()
        outs_dec, outs_ref = [], []
        for t in range(n, min(n + 8, T)):
            step = [x[:, t : t + 1] for x in leaves[:3]] + ([extra[:, t : t + 1]] if op == "gsa" else [extra])
            o_dec, state = _call(op, *step, backend="triton", state=state, final=True)
            o_ref, ref_state = _call(op, *step, backend="recurrent", state=ref_state, final=True)
            outs_dec.append(o_dec)
            outs_ref.append(o_ref)
        return rel_error(torch.cat(outs_dec, 1), torch.cat(outs_ref, 1))


def op_errors(op, B, T, H, dk, dv, m=64, seed=0) -> dict:
    """Relative errors of the Triton kernels (bf16 inputs) against the chunked twin in float32 on the same rounded
    inputs: output, final state, every gradient and the decode kernel."""
    q, k, v, extra = _inputs(op, B, T, H, dk, dv, m, seed)
    leaves = [q, k, v] + ([extra] if op == "gsa" else [])
    grads, outs, do = {}, {}, None
    for backend, cast in (("triton", lambda t: t), ("chunked", lambda t: t.float())):
        xs = [cast(t).detach().requires_grad_() for t in leaves]
        o, state = _call(op, *xs, *([] if op == "gsa" else [extra]), backend=backend, final=True)
        if do is None:  # one output gradient for both backends
            do = torch.randn(o.shape, device=o.device, generator=torch.Generator(o.device).manual_seed(seed + 1))
        grads[backend] = torch.autograd.grad(o, xs, do.to(o.dtype))
        outs[backend] = (o, state)
    errors = {"out": rel_error(outs["triton"][0], outs["chunked"][0])}
    s_tri, s_ref = outs["triton"][1], outs["chunked"][1]
    errors["state"] = (max(rel_error(a, b) for a, b in zip(s_tri, s_ref, strict=True)) if op == "gsa"
                       else rel_error(s_tri, s_ref))  # fmt: skip
    for name, a, b in zip(("dq", "dk", "dv", "dlog_alpha"), grads["triton"], grads["chunked"], strict=False):
        errors[name] = rel_error(a, b)
    errors["decode"] = _decode_error(op, leaves, extra, T)
    return errors


@torch.no_grad()
def model_logits_error(architecture, overrides, T=2048) -> float:
    """A model's logits (bf16 autocast) with its Triton attention against its chunked twin."""
    from evalsuite.models.registry import resolve_architecture

    family, arch = resolve_architecture(architecture)
    model = family.build(family.make_config(arch, overrides)).cuda().eval()
    model.init_weights(0)
    ids = torch.randint(0, model.vocab_size, (2, T), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    logits = {}
    for backend in ("triton", "chunked"):
        model.set_attention_backend(backend)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[backend] = model.logits(model(ids)).float()
    return rel_error(logits["triton"], logits["chunked"])
