"""Profile one decode step of a paper-sized model on the GPU: where does each new token's time go? (issue #18)

    PYTHONPATH=. python3 scripts/profile_decode.py --card fox-pro --path compiled --length 4096 --batch 1 --out DIR

Random-init weights of the card's shapes, bf16 autocast. Prefills ``--batch`` random prompts of ``--length`` tokens,
builds the decode path's step exactly as ``evalsuite.generation.engine.generate`` does (``graph``/``compiled``: the
``CudaGraphStep`` replay; ``static``/``eager``: the step called per token), warms it up,
then times ``--steps`` steps (wall clock, synchronised) and profiles the same number with ``torch.profiler``.
Writes ``DIR/profile_<path>_<length>_b<batch>.txt`` (timing line, the kernels sorted by total device time) and a
``.json`` summary: ms per step, device kernel time per step, and their ratio (near 1: the GPU's own work is the
step; far below: launches or the host). The 2026-11-23 eager profile is ``results/bench/h100/profile_decode.txt``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.engine import CudaGraphStep, _decoder
from evalsuite.models.fox import decoder as fox_decoder
from evalsuite.models.fox import model as fox_model
from evalsuite.runs.provenance import git_commit, versions


def _args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--card", default="fox-pro")
    p.add_argument("--path", default="compiled", choices=["eager", "static", "graph", "compiled"])
    p.add_argument("--length", type=int, default=4096, help="Prompt tokens before the profiled steps.")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=64, help="Steps timed, then steps profiled.")
    p.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test (eager/static; CPU op times).")
    p.add_argument(
        "--other-capacity",
        action="store_true",
        help="First step a decoder of another cache size, as a generate call of other lengths does: the "
        "compiled step then recompiles dynamic in the cache size (what bench generate times).",
    )
    p.add_argument("--no-pack", action="store_true", help="FoX: keep the step's GEMVs apart (before/after).")
    p.add_argument("--separate-append", action="store_true", help="FoX: cache rows written apart (before/after).")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args()


def _warm_step(model, path: str, ids: torch.Tensor, capacity: int):
    """(``tok [B] -> next tok [B]`` as ``generate`` steps on ``path``, the last token, the path taken) after a
    prefill of ``ids`` into a decoder of ``capacity`` and 4 steps (warm-up, compile, capture)."""
    decoder, taken = _decoder(model, path, ids.device, ids.shape[0], capacity, None)
    if taken in ("graph", "compiled"):
        step = CudaGraphStep(model, decoder)
    else:

        def step(tok):
            return model.logits(decoder.step(tok[:, None])).argmax(-1)

    tok = model.logits(decoder.prefill(ids)).argmax(-1)
    for _ in range(4):
        tok = step(tok)
    return step, tok, taken


def main() -> None:
    a = _args()
    fox_decoder.PACK_STEP = not a.no_pack
    fox_model.APPEND_IN_KERNEL = not a.separate_append
    card = replace(load_card(a.card), weights={"source": "random", "seed": 0})
    cuda = a.device == "cuda"
    adapter = NativeAdapter(card, device=a.device, dtype="bfloat16" if cuda else "float32")
    model, device = adapter.model, adapter.device
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    self_us = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, adapter.tokenizer.vocab_size, (a.batch, a.length), generator=gen).to(device)
    capacity = a.length + 2 * a.steps + 8
    with torch.inference_mode(), adapter._autocast():
        if a.other_capacity:  # another cache size first: torch.compile's second shape makes the size dynamic
            _warm_step(model, a.path, ids, capacity + 64)
        step, tok, taken = _warm_step(model, a.path, ids, capacity)
        sync()
        t0 = time.perf_counter()
        for _ in range(a.steps):
            tok = step(tok)
        sync()
        ms = (time.perf_counter() - t0) * 1e3 / a.steps
        with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
            for _ in range(a.steps):
                tok = step(tok)
            sync()
    # on a CPU the "kernels" are the leaf ops (self time), which is what the device runs there
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = [e for e in prof.key_averages() if e.device_type == kind and self_us(e) > 0]
    device_us = sum(self_us(e) for e in kernels) / a.steps
    top = sorted(kernels, key=lambda e: -self_us(e))
    packed = any(getattr(m, "step_pack", None) is not None for m in model.modules())
    name = f"profile_{a.path}_{a.length}_b{a.batch}" + ("" if packed else "_unpacked")
    name += "_other_capacity" if a.other_capacity else ""
    name += "_separate_append" if a.separate_append else ""
    a.out.mkdir(parents=True, exist_ok=True)
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    head = (f"{card.name} ({device_name}), path {taken}{', packed GEMVs' if packed else ''}, batch {a.batch}, "
            f"after {a.length} tokens: "
            f"{ms:.3f} ms per step wall, {device_us / 1e3:.3f} ms of device kernels per step "
            f"({device_us / 1e3 / ms:.0%} busy)")  # fmt: skip
    rows = [f"{'kernel':<100} {'calls/step':>10} {'us/step':>9} {'share':>6}"]
    for e in top[:40]:
        us = self_us(e) / a.steps
        rows.append(f"{e.key[:100]:<100} {e.count / a.steps:>10.2f} {us:>9.1f} {us / device_us:>6.1%}")
    (a.out / f"{name}.txt").write_text(head + "\n\n" + "\n".join(rows) + "\n")
    top_rows = [{"kernel": e.key, "calls_per_step": e.count / a.steps, "us_per_step": self_us(e) / a.steps}
                for e in top[:40]]  # fmt: skip
    summary = {"card": card.name, "path": taken, "packed": packed, "length": a.length, "batch": a.batch,
               "steps": a.steps, "other_capacity": a.other_capacity, "append_in_kernel": not a.separate_append,
               "ms_per_step": ms,
               "device_ms_per_step": device_us / 1e3,
               "kernels_per_step": sum(e.count for e in kernels) / a.steps, "top": top_rows,
               "device": device_name, "versions": versions(), "git_commit": git_commit()}  # fmt: skip
    (a.out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(head)
    print("\n".join(rows[:25]))


if __name__ == "__main__":
    main()
