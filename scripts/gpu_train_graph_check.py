"""GPU check of the CUDA-graph training step (issue #13, part 5; run on the lent GPU machine).

For each model at the ``gsa-paper`` preset's cell (d = ``--d-model``) and each precision: train ``--steps`` steps
eagerly and again with every step replayed as a CUDA graph (``GraphedStep``), from the
same initial weights on the same batches, and a third time with the forward and loss also through torch.compile
(``train(compile=True)``: fused kernels, so close rather than equal), and compare the per-step losses and the
final weights (relative error,
Frobenius over all parameters). Also every model's fp32 logits and gradients with its Triton backend against its
PyTorch reference backend (GSA's fp32 dots are 3xTF32). Writes ``train_graph_check.json`` to ``--out``.

Usage: PYTHONPATH=. python3 scripts/gpu_train_graph_check.py --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import numpy as np
import torch

from evalsuite.bench.attention import rel_error
from evalsuite.data.mqar import mqar_data
from evalsuite.runs.provenance import provenance
from evalsuite.tasks.mqar.sweep import data_config, load_preset, resolve_model
from evalsuite.training.train import IGNORE_INDEX, build_model, gathered_cross_entropy, shuffled_batches, train

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--models", default="fox-pro,fox-llama,transformer-llama,transformer-pro,gsa,tnl")
ap.add_argument("--d-model", type=int, default=128)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--amp", default="none,auto")
ap.add_argument("--no-parity", action="store_true", help="skip the fp32 Triton-vs-reference check")
args = ap.parse_args()

device = torch.device("cuda")
sweep = load_preset("gsa-paper")
seq_len, kv = sweep.settings()[0]
batch = sweep.batch_for(seq_len)
data = mqar_data({**data_config(sweep, seq_len, kv), "num_train": 4 * batch, "num_test": 1})
x, y = (torch.from_numpy(a).to(device) for a in data["train"])
loss_fn = functools.partial(gathered_cross_entropy, labels_per_row=int((y != IGNORE_INDEX).sum(1).max()))


def trained(name: str, amp: str, graph: bool, compile: bool = False):
    model = build_model(resolve_model(name), sweep.overrides(name, args.d_model), seed=0).to(device)
    tcfg = sweep.train_config(1e-3, seq_len)
    tcfg.amp, tcfg.max_steps, tcfg.log_every = amp, args.steps, 1
    result = train(model, shuffled_batches(x, y, batch, np.random.default_rng(0)), tcfg, loss_fn=loss_fn,
                   cuda_graph=graph, compile=compile)  # fmt: skip
    return [h["loss"] for h in result.history], torch.cat([p.detach().flatten().float() for p in model.parameters()])


def backend_parity(name: str) -> float:
    """Worst relative error of fp32 loss-gradient and logits, Triton vs reference backend, same weights."""
    out = {}
    base = build_model(resolve_model(name), sweep.overrides(name, args.d_model), seed=0).to(device)
    available = base.available_backends(device)
    reference = "reference" if "reference" in available else "chunked"
    for backend in ("triton", reference):
        base.set_attention_backend(backend)
        base.zero_grad(set_to_none=True)
        hidden = base(x[:8])
        hidden.float().square().mean().backward()
        out[backend] = [hidden.detach()] + [p.grad.clone() for p in base.parameters() if p.grad is not None]
    return max(rel_error(a, b) for a, b in zip(out["triton"], out[reference], strict=True))


records = []
for name in args.models.split(","):
    try:
        rec = {"model": name, "fp32_triton_vs_reference": None if args.no_parity else backend_parity(name)}
    except TypeError as e:  # FoX's kernel takes bf16/fp16 only; fp32 runs its reference
        rec = {"model": name, "fp32_triton_vs_reference": str(e)[:120]}
    for amp in args.amp.split(","):
        try:
            eager_losses, eager_w = trained(name, amp, graph=False)
            graph_losses, graph_w = trained(name, amp, graph=True)
            rec[f"{amp}_max_loss_diff"] = max(abs(a - b) for a, b in zip(eager_losses, graph_losses, strict=True))
            rec[f"{amp}_weights_rel"] = rel_error(graph_w, eager_w)
            compiled_losses, compiled_w = trained(name, amp, graph=True, compile=True)
            rec[f"{amp}_compiled_max_loss_diff"] = max(
                abs(a - b) for a, b in zip(eager_losses, compiled_losses, strict=True)
            )
            rec[f"{amp}_compiled_weights_rel"] = rel_error(compiled_w, eager_w)
            rec[f"{amp}_loss_first_last"] = [eager_losses[0], eager_losses[-1], graph_losses[-1], compiled_losses[-1]]
        except Exception as e:  # noqa: BLE001 -- recorded
            rec[f"{amp}_error"] = f"{type(e).__name__}: {e}"[:400]
    records.append(rec)
    print(json.dumps(rec), flush=True)
(args.out / "train_graph_check.json").write_text(
    json.dumps({"provenance": provenance(device=torch.cuda.get_device_name()), "records": records}, indent=1)
)
