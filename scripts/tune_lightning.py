"""Lightning Attention Triton kernels on a GPU: a sweep of segment length and walk launch configs, with a profile.

Usage (GPU machine, about a minute): PYTHONPATH=. python3 scripts/tune_lightning.py --out DIR [--T 16384]
Writes DIR/tune_lightning.json. At bf16, H = 16, D = 64, B = 65536 // T (the benchmark's shape):

(a) for chunks per segment G in (4, 8, 16) and walk (num_warps, num_stages) in (4, 2), (4, 3), (8, 2): do_bench
    medians of the forward and the forward+backward of :func:`evalsuite.kernels.lightning.lightning_attention`
    (the settings are applied by patching ``common.SEG_CHUNKS`` and ``common.walk_config``, which the kernels read
    at every launch);
(b) one forward+backward step at the best setting under torch.profiler: CUDA ms per kernel (walk passes, scans).
The winner is printed as the values to set in ``evalsuite/kernels/lightning/common.py``.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch
import triton

from evalsuite.bench.attention import timed_median
from evalsuite.bench.linear import alibi_slopes
from evalsuite.kernels.lightning import common, lightning_attention

ap = argparse.ArgumentParser()
ap.add_argument("--out", type=Path, required=True)
ap.add_argument("--T", type=int, default=16384)
args = ap.parse_args()
args.out.mkdir(parents=True, exist_ok=True)
T, H, D = args.T, 16, 64
B = max(1, 65536 // T)
report: dict = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                "shape": dict(B=B, T=T, H=H, D=D, dtype="bfloat16"), "sweep": []}  # fmt: skip


def save() -> None:
    (args.out / "tune_lightning.json").write_text(json.dumps(report, indent=1))


g = torch.Generator("cuda").manual_seed(0)
q, k = (torch.randn(B, T, H, D, device="cuda", generator=g).mul(D**-0.25).bfloat16().requires_grad_() for _ in "qk")
v = torch.randn(B, T, H, D, device="cuda", generator=g).bfloat16().requires_grad_()
do = torch.randn_like(v)
slope = alibi_slopes(H).cuda()


def fwd():
    with torch.no_grad():
        lightning_attention(q, k, v, slope, backend="triton")


def fwdbwd():
    lightning_attention(q, k, v, slope, backend="triton")[0].backward(do)


def median_ms(fn) -> float:
    return timed_median(fn, [q, k, v], warmup=10, rep=60)[0]


default_walk_config = common.walk_config
for G, (warps, stages) in itertools.product((4, 8, 16), ((4, 2), (4, 3), (8, 2))):
    common.SEG_CHUNKS = G
    common.walk_config = lambda da, dc, dt, w=warps, s=stages: (default_walk_config(da, dc, dt)[0], w, s)
    rec = {"G": G, "num_warps": warps, "num_stages": stages}
    try:
        rec.update(fwd_ms=median_ms(fwd), fwdbwd_ms=median_ms(fwdbwd))
    except Exception as e:  # noqa: BLE001 -- one failing config must not stop the sweep
        rec["error"] = f"{type(e).__name__}: {e}"[:300]
    report["sweep"].append(rec)
    print(json.dumps(rec), flush=True)
    save()

ok = [r for r in report["sweep"] if "fwdbwd_ms" in r]
best = min(ok, key=lambda r: r["fwd_ms"] + r["fwdbwd_ms"])
report["best"] = best
common.SEG_CHUNKS = best["G"]
common.walk_config = lambda da, dc, dt: (default_walk_config(da, dc, dt)[0], best["num_warps"], best["num_stages"])
fwdbwd()
torch.cuda.synchronize()
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        fwdbwd()
    torch.cuda.synchronize()
report["profile_ms_per_step"] = {
    e.key: round(e.device_time_total / 1e3 / 3, 4) for e in prof.key_averages() if e.device_time_total > 0
}
save()
print("best:", json.dumps(best))
print("profile (ms per fwd+bwd step):", json.dumps(report["profile_ms_per_step"], indent=1))
