"""Forward-kernel variant sweep at one shape per head dim, then the benchmark there with the fastest variant.

Variants: K/V loads through pointers or TMA descriptors (``tma``), with and without the gate, each over a set of
block configs. SDPA causal at the same shape is timed too. (The earlier sweeps in results/bench/h100/fwd-variants
also tried variants that lost and are no longer in the kernel.)

Usage (GPU machine): PYTHONPATH=. python3 scripts/tune_fwd.py --out DIR [--T 16384 --head-dims 64 128]
Writes DIR/tune_fwd.json (every variant's median ms) and DIR/attention_bench.json/.png (T = 4096, T).
"""

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton.testing

from evalsuite.bench.attention import PROVIDERS, bench_attention, check_parity_gpu
from evalsuite.kernels.forgetting import common, cumsum_over_time
from evalsuite.kernels.forgetting.forward import _fwd

CONFIGS = {
    64: [(128, 64, 4, s) for s in (3, 4, 5)] + [(256, 64, 8, 3), (128, 128, 8, 3)],
    128: [(128, 32, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4)],
}  # fmt: skip


def median_ms(fn) -> float:
    fn()
    ms = triton.testing.do_bench(fn, warmup=10, rep=100, quantiles=[0.5])
    return ms[0] if isinstance(ms, list) else ms


ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--T", type=int, default=16384)
ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
ap.add_argument("--no-bench", action="store_true", help="only the sweep (and parity of the fastest variant)")
args = ap.parse_args()
T, H = args.T, 16
B = 65536 // T
records, best = [], {}


def sweep_head_dim(D: int) -> None:
    """Time SDPA and every (variant, config) of the forward at [B, T, H, D]; note the fastest gated one."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
    logf = torch.nn.functional.logsigmoid(torch.randn(B, T, H, device="cuda", generator=gen) + 3)
    cum = cumsum_over_time(logf)
    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    sdpa = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=True))
    records.append({"D": D, "variant": "sdpa_causal", "ms": sdpa})
    print(f"D={D} sdpa {sdpa:.3f} ms", flush=True)
    variants = [(0, 1), (1, 1), (1, 0)]  # (tma, gate)
    for (tma, gate), cfg in itertools.product(variants, CONFIGS[D]):
        c = cum if gate else None
        rec = {"D": D, "variant": f"tma={tma} gate={gate}", "config": list(cfg)}
        try:
            rec["ms"] = median_ms(lambda: _fwd(q, k, v, c, None, config=cfg, tma=bool(tma)))  # noqa: B023
            rec["ratio_to_sdpa"] = rec["ms"] / sdpa
        except Exception as exc:  # noqa: BLE001 - e.g. a config that needs too much shared memory
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        records.append(rec)
        print(rec["variant"], cfg, f"{rec['ms']:.3f} ms {rec['ratio_to_sdpa']:.3f}x" if "ms" in rec else rec["error"],
              flush=True)  # fmt: skip
        if gate and "ms" in rec and rec["ms"] < best.get(D, {"ms": 1e9})["ms"]:
            best[D] = {**rec, "tma": bool(tma), "config": cfg}


for D in args.head_dims:
    sweep_head_dim(D)
    torch.cuda.empty_cache()
args.out.mkdir(parents=True, exist_ok=True)
(args.out / "tune_fwd.json").write_text(json.dumps({"T": T, "B": B, "H": H, "records": records}, indent=1))
for D, b in best.items():
    print(f"best D={D}: {b['variant']} {b['config']} {b['ms']:.3f} ms ({b['ratio_to_sdpa']:.3f}x sdpa)", flush=True)
    common.FWD_CONFIGS[D], common.FWD_TMA[D] = tuple(b["config"]), b["tma"]  # what the parity run launches
    for r in check_parity_gpu((17, 1000, 4097), head_dim=D):
        print("parity", {k: v for k, v in r.items() if k.startswith(("T", "rel_err"))}, flush=True)
if not args.no_bench:
    bench_attention(args.out, seq_lens=[4096, T], head_dims=args.head_dims, providers=list(PROVIDERS),
                    parity_seq_lens=[1024, T])  # fmt: skip
