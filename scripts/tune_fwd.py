"""Wider forward block-config sweep at one shape, then the benchmark there with the best config.

Usage (GPU machine): PYTHONPATH=. python3 scripts/tune_fwd.py --out DIR [--T 16384 --D 64]
Writes DIR/tune_fwd.json (every config's median ms) and DIR/attention_bench.json/.png for that shape.
"""

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton.testing

from evalsuite.bench.attention import DEFAULT_PROVIDERS, PROVIDERS, bench_attention
from evalsuite.kernels.forgetting import cumsum_over_time
from evalsuite.kernels.forgetting import triton as kernel

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--T", type=int, default=16384)
ap.add_argument("--D", type=int, default=64)
args = ap.parse_args()
T, D, H = args.T, args.D, 16
B = 65536 // T
gen = torch.Generator(device="cuda").manual_seed(0)
q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
logf = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen) + 3)
cum = cumsum_over_time(logf)

records = []
for bm, bn, w, st in itertools.product((64, 128, 256), (32, 64, 128), (4, 8), (2, 3, 4, 5)):
    if bm % bn or (bm == 256 and w == 4) or (bn == 128 and bm == 64):
        continue
    cfg = (bm, bn, w, st)
    try:
        kernel._fwd(q, k, v, cum, None, config=cfg)
        ms = triton.testing.do_bench(lambda cfg=cfg: kernel._fwd(q, k, v, cum, None, config=cfg), quantiles=[0.5])
        ms = ms[0] if isinstance(ms, list) else ms
    except Exception as exc:  # noqa: BLE001 - e.g. a config that needs too much shared memory
        records.append({"config": cfg, "error": str(exc)[:200]})
        continue
    records.append({"config": cfg, "ms": ms})
    print(cfg, f"{ms:.3f} ms", flush=True)
ok = sorted((r for r in records if "ms" in r), key=lambda r: r["ms"])
print("current", kernel.FWD_CONFIGS[D], "best", ok[0])
args.out.mkdir(parents=True, exist_ok=True)
(args.out / "tune_fwd.json").write_text(json.dumps({"T": T, "D": D, "records": records}, indent=1))
kernel.FWD_CONFIGS[D] = tuple(ok[0]["config"])
providers = [p for p in PROVIDERS if p in DEFAULT_PROVIDERS or p == "triton_causal"]
bench_attention(args.out, seq_lens=[T], head_dims=[D], providers=providers, parity_seq_lens=[T])
