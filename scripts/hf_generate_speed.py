"""Generation speed of an ``hf:`` model through the adapter: prompt tokens/s and new tokens/s, and where the time goes.

For a batch of ``--batch`` prompts of ``--prompt-tokens`` tokens each (text from the built-in synthetic corpus):
prefill time = a generate call making one token; decode rate = the extra tokens of a call making ``--new-tokens``
over its extra time. Then one profiled call prints the top operators by self time (CPU, or CUDA on a GPU).

Usage: python scripts/hf_generate_speed.py --model hf:PATH [--device cuda --dtype bfloat16] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from evalsuite.adapters.registry import AdapterOptions, load_adapter
from evalsuite.data.synthetic import synthetic_text
from evalsuite.generation.types import GenerationConfig
from evalsuite.runs.provenance import device_name, versions


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_generate(adapter, prompts, new_tokens: int) -> float:
    config = GenerationConfig(max_new_tokens=new_tokens, stop_at_eos=False)
    _sync(adapter.device)
    start = time.perf_counter()
    out = adapter.generate(prompts, config)
    _sync(adapter.device)
    assert all(len(g.token_ids) == new_tokens for g in out)
    return time.perf_counter() - start


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    adapter = load_adapter(args.model, AdapterOptions(device=args.device, dtype=args.dtype))
    ids = adapter.tokenizer.encode(synthetic_text(4 * args.prompt_tokens, seed=0))
    prompts = [ids[i * 7 : i * 7 + args.prompt_tokens] for i in range(args.batch)]
    timed_generate(adapter, [p[:64] for p in prompts], 2)  # warm-up
    prefill = timed_generate(adapter, prompts, 1)
    full = timed_generate(adapter, prompts, args.new_tokens)
    decode = max(full - prefill, 1e-9)
    record = {
        "model": adapter.name,
        "device": device_name(adapter.device),
        "dtype": args.dtype,
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "prefill_s": prefill,
        "prompt_tokens_per_s": args.batch * args.prompt_tokens / prefill,
        "decode_s": decode,
        "new_tokens_per_s": args.batch * (args.new_tokens - 1) / decode,
        "ms_per_decode_step": 1000 * decode / (args.new_tokens - 1),
        **versions(),
    }
    print(json.dumps(record, indent=1), flush=True)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if adapter.device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        timed_generate(adapter, prompts, min(args.new_tokens, 8))
    key = "self_cuda_time_total" if adapter.device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=15)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        stem = f"hf_generate_{adapter.device.type}_b{args.batch}_t{args.prompt_tokens}"
        (args.out / f"{stem}.json").write_text(json.dumps(record, indent=1) + "\n")
        (args.out / f"{stem}_profile.txt").write_text(table + "\n")


if __name__ == "__main__":
    main()
