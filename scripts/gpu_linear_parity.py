"""GPU parity of the GSA and Lightning Triton kernels at real shapes (run on the lent GPU machine).

For each shape: bf16 inputs; the kernel (forward and every gradient) against the chunked PyTorch reference run in
float32 on the same rounded inputs; the one-token decode kernel against the token loop over a few steps after a
prefill; and the gsa/tnl models with Triton vs chunked attention (logits, bf16 autocast). Relative errors are
``|x - ref| / |ref|`` (Frobenius). Writes ``linear_parity.json`` to --out and prints one line per check.

Usage: PYTHONPATH=. python3 scripts/gpu_linear_parity.py --out $OUT [--ops gsa lightning]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from evalsuite.bench.attention import rel_error
from evalsuite.kernels.gated_slot import gated_slot_attention
from evalsuite.kernels.lightning import lightning_attention
from evalsuite.models.registry import resolve_architecture
from evalsuite.models.tnl.model import alibi_slopes

LIMIT = 2e-2  # bf16 inputs; fp32 accumulation on both sides


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


def check_op(op, B, T, H, dk, dv, m=64, seed=0) -> dict:
    q, k, v, extra = _inputs(op, B, T, H, dk, dv, m, seed)
    leaves = [q, k, v] + ([extra] if op == "gsa" else [])
    grads, outs, do = {}, {}, None
    for backend, cast in (("triton", lambda t: t), ("chunked", lambda t: t.float())):
        xs = [cast(t).detach().requires_grad_() for t in leaves]
        args = xs + ([] if op == "gsa" else [extra])
        o, state = _call(op, *args, backend=backend, final=True)
        if do is None:  # one output gradient for both backends
            do = torch.randn(o.shape, device=o.device, generator=torch.Generator(o.device).manual_seed(seed + 1))
        grads[backend] = torch.autograd.grad(o, xs, do.to(o.dtype))
        outs[backend] = (o, state)
    rec = {"op": op, "B": B, "T": T, "H": H, "dk": dk, "dv": dv, "m": m if op == "gsa" else None}
    rec["rel_out"] = rel_error(outs["triton"][0], outs["chunked"][0])
    s_tri, s_ref = outs["triton"][1], outs["chunked"][1]
    rec["rel_state"] = (
        max(rel_error(a, b) for a, b in zip(s_tri, s_ref, strict=True)) if op == "gsa" else rel_error(s_tri, s_ref)
    )
    for name, a, b in zip(("dq", "dk", "dv", "dlog_alpha"), grads["triton"], grads["chunked"], strict=False):
        rec[f"rel_{name}"] = rel_error(a, b)
    # decode: prefill with the kernel, then single tokens (decode kernel) vs the token loop from the same state
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
        rec["rel_decode"] = rel_error(torch.cat(outs_dec, 1), torch.cat(outs_ref, 1))
    rec["max_rel"] = max(v for key, v in rec.items() if key.startswith("rel_"))
    rec["ok"] = rec["max_rel"] < LIMIT
    return rec


@torch.no_grad()
def check_model(architecture, overrides, T=2048) -> dict:
    family, arch = resolve_architecture(architecture)
    model = family.build(family.make_config(arch, overrides)).cuda().eval()
    model.init_weights(0)
    ids = torch.randint(0, model.vocab_size, (2, T), device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    logits = {}
    for backend in ("triton", "chunked"):
        model.set_attention_backend(backend)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits[backend] = model.logits(model(ids)).float()
    return {"model": architecture, "T": T, "rel_logits": rel_error(logits["triton"], logits["chunked"]),
            "ok": rel_error(logits["triton"], logits["chunked"]) < LIMIT}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--ops", nargs="+", default=["gsa", "lightning"], choices=["gsa", "lightning"])
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = [
        ("gsa", 2, 4097, 16, 64, 64, 64),  # the benchmark's head shape, ragged T
        ("gsa", 1, 16384, 4, 64, 64, 64),
        ("gsa", 1, 2048, 4, 512, 512, 64),  # the paper's 1.3B: d = 2048 over 4 heads
        ("gsa", 2, 1000, 4, 32, 32, 32),
        ("lightning", 2, 4097, 16, 64, 64, 0),
        ("lightning", 1, 65536, 2, 64, 64, 0),
        ("lightning", 1, 4096, 8, 256, 128, 0),  # TNL-385M's LRPE layer: dk = 2 x 128
        ("lightning", 2, 1000, 4, 128, 128, 0),
    ]
    records = []
    for op, B, T, H, dk, dv, m in [s for s in shapes if s[0] in args.ops]:
        try:
            rec = check_op(op, B, T, H, dk, dv, m)
        except Exception as e:  # noqa: BLE001 -- report and go on to the next shape
            rec = {"op": op, "B": B, "T": T, "H": H, "dk": dk, "dv": dv, "error": f"{type(e).__name__}: {e}"[:500]}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    models = {
        "gsa": ("gsa", dict(vocab_size=50257, hidden_size=1024, num_layers=2, num_heads=4, num_slots=64)),
        "lightning": ("tnl", dict(vocab_size=50257, hidden_size=1024, num_layers=2, num_heads=8, glu_dim=2816)),
    }
    for arch, overrides in (models[op] for op in args.ops):
        try:
            rec = check_model(arch, overrides)
        except Exception as e:  # noqa: BLE001
            rec = {"model": arch, "error": f"{type(e).__name__}: {e}"[:500]}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    (args.out / "linear_parity.json").write_text(json.dumps(records, indent=1) + "\n")
    bad = [r for r in records if not r.get("ok")]
    print("PARITY", "FAIL" if bad else "OK", len(records), "checks;", len(bad), "failing")


if __name__ == "__main__":
    main()
