"""Where one decode step of a model's time goes (``evalsuite bench profile-decode``).

Random-init weights of the card's shapes, bf16 autocast on CUDA (float32 on a CPU). Prefills ``batch`` random prompts
of ``length`` tokens, builds the decode path's step exactly as :func:`evalsuite.generation.engine.generate` does
(``graph``/``compiled``: the :class:`~evalsuite.generation.engine.CudaGraphStep` replay; ``static``/``eager``: the
step called per token), warms it up, then times ``steps`` steps (wall clock, synchronised) and profiles as many with
``torch.profiler``. Writes ``OUT/profile_<path>_<length>_b<batch>[_other_capacity].txt`` (the timing line, the
kernels sorted by device time; on a CPU the leaf ops, which is what the device runs there) and a ``.json`` summary:
ms per step, device kernel time per step and their ratio (near 1: the GPU's own work is the step; far below:
launches or the host).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from evalsuite.bench.common import format_kernel_rows, kernel_table, random_weights_adapter

PATHS = ("eager", "static", "graph", "compiled")


def _warm_step(model, path: str, ids: torch.Tensor, capacity: int):
    """(``tok [B] -> next tok [B]`` as ``generate`` steps on ``path``, the last token, the path taken) after a
    prefill of ``ids`` into a decoder of ``capacity`` and 4 steps (warm-up, compile, capture)."""
    from evalsuite.generation.engine import CudaGraphStep, _decoder

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


def _timed_and_profiled(step, tok, steps: int, cuda: bool):
    """(ms per step, the profiler) of ``steps`` timed steps, then ``steps`` profiled ones."""
    from torch.profiler import ProfilerActivity, profile

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    t0 = time.perf_counter()
    for _ in range(steps):
        tok = step(tok)
    sync()
    ms = (time.perf_counter() - t0) * 1e3 / steps
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            tok = step(tok)
        sync()
    return ms, prof


def profile_decode(out, card: str = "fox-pro", path: str = "compiled", length: int = 4096, batch: int = 1,
                   steps: int = 64, device: str = "cuda", other_capacity: bool = False) -> dict:  # fmt: skip
    """Profile one decode step (module doc); ``other_capacity``: first step a decoder of another cache size, as a
    generate call of other lengths does (the compiled step then recompiles dynamic in the cache size). Returns the
    summary written to the JSON."""
    from evalsuite.errors import UserError
    from evalsuite.kernels import triton_utils
    from evalsuite.runs.provenance import git_commit, versions

    if path not in PATHS:
        raise UserError(f"unknown path {path!r}; choose from {', '.join(PATHS)}")
    cuda = torch.device(device).type == "cuda"
    adapter = random_weights_adapter(card, device)
    spec = adapter.card
    model = adapter.model
    ids = torch.randint(0, adapter.tokenizer.vocab_size, (batch, length), generator=torch.Generator().manual_seed(0))
    ids = ids.to(adapter.device)
    capacity = length + 2 * steps + 8
    with torch.inference_mode(), adapter._autocast():
        if other_capacity:  # another cache size first: torch.compile's second shape makes the size dynamic
            _warm_step(model, path, ids, capacity + 64)
        step, tok, taken = _warm_step(model, path, ids, capacity)
        ms, prof = _timed_and_profiled(step, tok, steps, cuda)
    device_us, all_rows = kernel_table(prof, steps, cuda, top=None)
    top = all_rows[:40]
    packed = any(getattr(m, "step_pack", None) is not None for m in model.modules())
    name = f"profile_{path}_{length}_b{batch}" + ("_other_capacity" if other_capacity else "")
    device_name = torch.cuda.get_device_name() if cuda else "cpu"
    head = (f"{spec.name} ({device_name}), path {taken}{', packed GEMVs' if packed else ''}, batch {batch}, after "
            f"{length} tokens: {ms:.3f} ms per step wall, {device_us / 1e3:.3f} ms of device kernels per step "
            f"({device_us / 1e3 / ms:.0%} busy)")  # fmt: skip
    rows = format_kernel_rows(top, device_us, unit="step")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.txt").write_text(head + "\n\n" + "\n".join(rows) + "\n")
    summary = {"card": spec.name, "path": taken, "packed": packed, "length": length, "batch": batch, "steps": steps,
               "other_capacity": other_capacity, "ms_per_step": ms, "device_ms_per_step": device_us / 1e3,
               "kernels_per_step": sum(r["calls_per_call"] for r in all_rows),
               "top": [{"kernel": r["kernel"], "calls_per_step": r["calls_per_call"], "us_per_step": r["us_per_call"]}
                       for r in top],
               "device": device_name, "versions": versions(), "git_commit": git_commit(),
               "pdl": triton_utils.pdl(torch.device(device))}  # fmt: skip
    (out / f"{name}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(head)
    print("\n".join(rows[:25]))
    return summary
