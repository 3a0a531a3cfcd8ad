"""Where a training step's activation memory goes (``evalsuite bench saved-memory``): the tensors autograd keeps for
the backward pass, by module class and dtype, per token and layer.

A training step's peak device memory is its held memory (weights, AdamW state) plus what the forward leaves for the
backward. ``bench train`` (:mod:`evalsuite.bench.train_speed`) measures the peak; this counts the second part. Each
``--model`` card is built with ``layers`` layers (its own shapes otherwise, random weights), and one forward and
loss run as ``bench train`` runs them (bf16 autocast, :func:`~evalsuite.training.lm_train.chunked_cross_entropy`,
the card's attention backend) under :func:`torch.autograd.graph.saved_tensors_hooks`, at two token counts. Every
tensor saved for the backward is attributed to the innermost module running when it was saved; a storage saved
several times (a tensor and its views) counts once, and parameters (held memory) not at all. The difference
between the two token counts is the part that grows with the tokens (bytes per token, per layer when divided by
``layers``), the rest is per step (autocast's bf16 copies of the weights, say).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from torch import nn

from evalsuite.errors import UserError


def saved_storages(model: nn.Module, run) -> list[dict]:
    """The storages ``run()`` saves for the backward pass: one dict per storage with ``bytes``, ``dtype``, ``shape``
    (of the first tensor saved on it), ``module`` (qualified name) and ``module_class`` of the innermost module that
    was running. Parameters' storages are left out."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    running: list[tuple[str, str]] = []
    found: dict[int, dict] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key not in params and key not in found and storage.nbytes() > 0:
            name, cls = running[-1] if running else ("", "(outside modules)")
            found[key] = {"bytes": storage.nbytes(), "dtype": str(t.dtype).removeprefix("torch."),
                          "shape": list(t.shape), "module": name, "module_class": cls}  # fmt: skip
        return t

    def enter(entry):
        return lambda *_: running.append(entry)  # (a pre-hook returning None leaves the inputs as they are)

    def leave(*_):
        running.pop()  # (returns None: a forward hook's return value would replace the output)

    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(enter((name, type(module).__name__))))
        handles.append(module.register_forward_hook(leave))
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            run()
    finally:
        for handle in handles:
            handle.remove()
    return list(found.values())


def _grouped(storages: list[dict]) -> dict[tuple[str, bool], int]:
    """Bytes per (``"Class (dtype)"``, inside a numbered layer: a module name with an index, ``blocks.3.attn``)."""
    totals: dict[tuple[str, bool], int] = defaultdict(int)
    for s in storages:
        totals[(f"{s['module_class']} ({s['dtype']})", bool(re.search(r"(^|\.)\d+(\.|$)", s["module"])))] += s["bytes"]
    return dict(totals)


def measure_card(name: str, layers: int, lengths: tuple[int, int], batch: int, device: torch.device,
                 attention: str = "auto") -> dict:  # fmt: skip
    """``name``'s saved bytes at ``batch`` rows of each of the two ``lengths`` (module doc): per group, the bytes per
    token and per layer (the slope between the lengths over ``layers``) and per step (the intercept). ``attention``:
    the model's backend (``triton`` on a CPU under ``TRITON_INTERPRET=1`` counts what the GPU kernels save)."""
    from evalsuite.cards import load_card
    from evalsuite.training.lm_train import chunked_cross_entropy
    from evalsuite.training.train import build_model

    card = load_card(name)
    config = card.model_config()
    overrides = {"num_layers": layers}
    if hasattr(config, "lower_layers"):  # DRT: its lower (window-only) layers in the same proportion
        overrides["lower_layers"] = round(config.lower_layers * layers / config.num_layers)
    model = build_model(card, overrides, seed=0).to(device).train()
    if attention != "auto":
        model.set_attention_backend(attention, device)
    amp = torch.autocast(device.type, torch.bfloat16) if device.type in ("cuda", "cpu") else contextlib.nullcontext()
    by_length = {}
    for length in lengths:
        ids = torch.randint(model.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(0))
        x, y = ids[:, :-1].to(device), ids[:, 1:].to(device)

        def run(x=x, y=y):
            with amp:
                chunked_cross_entropy(model, x, y)

        by_length[length] = saved_storages(model, run)
    (t1, s1), (t2, s2) = ((length * batch, _grouped(s)) for length, s in by_length.items())
    rows = []
    for g in sorted(set(s1) | set(s2), key=lambda g: (not g[1], -s2.get(g, 0))):
        slope = (s2.get(g, 0) - s1.get(g, 0)) / (t2 - t1)
        rows.append({"group": g[0], "per_layer": g[1], "bytes_per_token": slope / (layers if g[1] else 1),
                     "bytes_per_step": s1.get(g, 0) - slope * t1})  # fmt: skip
    top = sorted(by_length[lengths[1]], key=lambda s: -s["bytes"])[:12]
    return {"model": name, "layers": layers, "lengths": list(lengths), "batch": batch, "attention": attention,
            "rows": rows, "top_storages": top, "card_layers": config.num_layers}  # fmt: skip


def _row_bytes(row: dict, tokens: int, layers: int) -> float:
    """One group's bytes at ``tokens`` tokens a step and ``layers`` layers (once if it is outside the layers)."""
    return row["bytes_per_token"] * tokens * (layers if row["per_layer"] else 1)


def full_depth_bytes(result: dict, tokens: int) -> float:
    """Bytes the card's full depth keeps for the backward at ``tokens`` tokens a step (the per-token part)."""
    return sum(_row_bytes(r, tokens, result["card_layers"]) for r in result["rows"])


def format_table(result: dict, tokens: int) -> str:
    """Markdown: per group, bytes per token (per layer inside the layers), and the GiB the card's full depth keeps
    at ``tokens`` tokens a step."""
    full = result["card_layers"]
    lines = [f"### {result['model']} ({result['layers']} of {full} layers measured, T = {result['lengths']}, "
             f"batch {result['batch']}, attention {result['attention']})", "",
             f"| module (dtype) | where | bytes / token | GiB at {tokens} tokens, {full} layers |",
             "|---|---|---:|---:|"]  # fmt: skip
    for r in result["rows"]:
        if abs(r["bytes_per_token"]) >= 1:
            where = "each layer" if r["per_layer"] else "once"
            gib = _row_bytes(r, tokens, full) / 2**30
            lines.append(f"| {r['group']} | {where} | {r['bytes_per_token']:,.0f} | {gib:.2f} |")
    lines.append(f"| **total** | | | **{full_depth_bytes(result, tokens) / 2**30:.2f}** |")
    return "\n".join(lines)


def saved_memory(out, models: list[str], layers: int = 1, lengths: tuple[int, int] = (256, 512), batch: int = 1,
                 tokens: int = 16384, device: str = "auto", attention: str = "auto") -> list[dict]:  # fmt: skip
    """Measure every card of ``models`` (:func:`measure_card`) and write ``saved_memory.json`` and ``.md`` under
    ``out``; ``tokens``: the step size the table scales the per-token bytes to (16,384: the papers' steps)."""
    from evalsuite.runs.provenance import device_name, provenance
    from evalsuite.runtime import resolve_device

    if layers < 1 or batch < 1 or len(lengths) != 2 or not 0 < lengths[0] < lengths[1]:
        raise UserError("give --layers >= 1, --batch >= 1 and two --lengths, the first the shorter")
    dev = resolve_device(device)
    results = [measure_card(name, layers, tuple(lengths), batch, dev, attention) for name in models]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    doc = {"results": results, "tokens": tokens, "provenance": provenance(device=device_name(dev))}
    (out / "saved_memory.json").write_text(json.dumps(doc, indent=1) + "\n")
    text = "\n\n".join(format_table(r, tokens) for r in results)
    (out / "saved_memory.md").write_text(text + "\n")
    print(text)
    return results
