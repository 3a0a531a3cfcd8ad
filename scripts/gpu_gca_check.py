"""GPU check of the Grouped Cross Attention Triton kernels (arXiv:2410.01651 App. B), then their benchmark.

1. Parity: the kernel's forward and its gradients (q, k, v, w) against ``gca_reference`` run in float64 on the same
   (rounded) inputs, at DRT's shapes (T = 4096 tokens = 64 chunks of 64, K = 8 retrieved chunks, H = 12, D = 64) in
   bf16 and fp32, both softmax settings, plus edge cases: 65-row chunks (query chunk + landmark: a 128-row tile and
   two key blocks), empty retrieval slots (w = 0), strided k/v, D = 32 fp16 and D = 128. Errors: relative
   (Frobenius, ``|x - ref| / |ref|``) and max abs, per output. Also: the backward is bitwise deterministic, and
   ``grouped_cross_attention(backend="auto")`` takes the kernel on CUDA. Written to ``OUT/gca_parity.json``.
2. Block-config sweep (skip with --no-tune): forward and backward alone at T = 16384, bf16, D = 64, for a few
   (BLOCK_M, BLOCK_N, num_warps, num_stages); prints the timings and the best (the tables in
   ``evalsuite/kernels/grouped_cross/common.py`` are not changed). Written to ``OUT/gca_tune.json``.
3. The benchmark (:mod:`evalsuite.bench.gca`, skip with --no-bench): ``OUT/gca_bench.{json,md,png}``.

Exit status 1 when a parity check fails (after everything ran), else 0.

Usage (repository root): python scripts/gpu_gca_check.py --out results/bench/h100/gca [--no-tune] [--no-bench]
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from anywhere without installing

import torch  # noqa: E402

from evalsuite.bench import gca as bench  # noqa: E402
from evalsuite.kernels.grouped_cross import grouped_cross_attention  # noqa: E402
from evalsuite.kernels.grouped_cross.backward import gca_bwd  # noqa: E402
from evalsuite.kernels.grouped_cross.forward import gca_fwd, gca_triton  # noqa: E402
from evalsuite.kernels.grouped_cross.reference import gca_reference  # noqa: E402

LIMITS = {torch.bfloat16: 2e-2, torch.float16: 1e-2, torch.float32: 1e-4}  # relative error, every output
NAMES = ("o", "dq", "dk", "dv", "dw")
# (name, B, C, Sq, K, Skv, H, D, dtype, softmax_one, variant)
CASES = [
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.bfloat16, True, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.bfloat16, False, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.float32, True, ""),
    ("drt-4k", 1, 64, 64, 8, 64, 12, 64, torch.float32, False, ""),
    ("lmk-65", 2, 8, 65, 8, 65, 12, 64, torch.bfloat16, True, "zero_slots"),
    ("rag-63", 2, 8, 63, 8, 65, 12, 64, torch.float32, False, "zero_slots"),  # fp32 grads: <= 64 rows (common.py)
    ("strided", 2, 16, 64, 4, 64, 4, 64, torch.bfloat16, True, "strided"),
    ("d32", 1, 16, 33, 3, 20, 4, 32, torch.float16, True, ""),
    ("d128", 1, 16, 64, 8, 64, 4, 128, torch.bfloat16, False, ""),
    ("decode", 4, 1, 1, 8, 64, 12, 64, torch.bfloat16, True, ""),
]


def make(B, C, Sq, K, Skv, H, D, dtype, variant, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g).to(dtype)

    q = randn(B, C, Sq, H, D)
    if variant == "strided":  # [B, C, K, H, Skv, D] storage seen as [B, C, K, Skv, H, D]
        k, v = (randn(B, C, K, H, Skv, D).transpose(3, 4) for _ in range(2))
    else:
        k, v = (randn(B, C, K, Skv, H, D) for _ in range(2))
    w = torch.randn(B, C, K, device="cuda", generator=g).softmax(-1)
    if variant == "zero_slots":  # early chunks see fewer than K past chunks: the tail slots are empty
        w[:, : C // 2, K // 2 :] = 0.0
    return q, k, v, w, randn(B, C, Sq, H, D)


def _err(out, ref) -> tuple[float, float]:
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return float("inf"), float("inf")
    den = ref.norm().item()
    rel = (out - ref).norm().item() / den if den > 0 else (out - ref).norm().item()
    return rel, (out - ref).abs().max().item()


def check_case(name, B, C, Sq, K, Skv, H, D, dtype, softmax_one, variant) -> dict:
    rec = {"case": name, "shape": [B, C, Sq, K, Skv, H, D], "dtype": str(dtype)[6:], "softmax_one": softmax_one,
           "variant": variant}  # fmt: skip
    q, k, v, w, do = make(B, C, Sq, K, Skv, H, D, dtype, variant)
    leaves = [x.clone().requires_grad_() for x in (q, k, v, w)]
    o = gca_triton(*leaves, softmax_one=softmax_one)
    grads = torch.autograd.grad(o, leaves, do)
    ref = [x.detach().double().requires_grad_() for x in (q, k, v, w)]
    o_ref = gca_reference(*ref, softmax_one=softmax_one)
    ref_grads = torch.autograd.grad(o_ref, ref, do.double())
    for n, a, b in zip(NAMES, (o, *grads), (o_ref, *ref_grads), strict=True):
        rec[f"rel_{n}"], rec[f"abs_{n}"] = _err(a, b)
    again = torch.autograd.grad(gca_triton(*leaves, softmax_one=softmax_one), leaves, do)
    rec["deterministic"] = all(torch.equal(a, b) for a, b in zip(grads, again, strict=True))
    with torch.no_grad():
        auto = grouped_cross_attention(q, k, v, w, softmax_one=softmax_one)
    rec["auto_is_triton"] = torch.equal(auto, o.detach())
    rec["ok"] = (max(rec[f"rel_{n}"] for n in NAMES) < LIMITS[dtype] and rec["deterministic"]
                 and rec["auto_is_triton"] and o.dtype == dtype and grads[3].dtype == w.dtype)  # fmt: skip
    return rec


def run_parity() -> list[dict]:
    records = []
    head = f"{'case':8s} {'dtype':9s} {'one':3s} " + " ".join(f"{n:>17s}" for n in NAMES) + "  det auto  ok"
    print("parity: relative error (max abs error) vs gca_reference in float64\n" + head, flush=True)
    for case in CASES:
        try:
            rec = check_case(*case)
        except Exception as exc:  # noqa: BLE001 -- report every case
            traceback.print_exc()
            rec = {"case": case[0], "dtype": str(case[8])[6:], "softmax_one": case[9], "ok": False,
                   "error": f"{type(exc).__name__}: {exc}"}  # fmt: skip
        records.append(rec)
        if "error" in rec:
            print(f"{rec['case']:8s} {rec['dtype']:9s} {int(rec['softmax_one']):3d} ERROR {rec['error']}", flush=True)
            continue
        cells = " ".join(f"{rec[f'rel_{n}']:.1e} ({rec[f'abs_{n}']:.0e})".rjust(17) for n in NAMES)
        print(f"{rec['case']:8s} {rec['dtype']:9s} {int(rec['softmax_one']):3d} {cells}  {int(rec['deterministic']):3d}"
              f" {int(rec['auto_is_triton']):4d}  {'ok' if rec['ok'] else 'FAIL'}", flush=True)  # fmt: skip
    return records


FWD_SWEEP = [(64, 64, 4, 1), (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2), (64, 64, 8, 2), (64, 32, 8, 3)]
BWD_SWEEP = [(64, 64, 4, 1), (64, 64, 4, 2), (64, 64, 8, 1), (64, 64, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2)]


def run_tune(T=16384, B=1) -> list[dict]:
    """Forward / backward kernels alone per block config (bf16, DRT shape); prints the best of each."""
    import triton.testing

    x = bench.make_inputs(B, T, dtype=torch.bfloat16, device="cuda")
    q, k, v, w = x["q"], x["k"], x["v"], x["w"]
    s = q.shape[-1] ** -0.5
    do = torch.randn_like(q)
    _, lse = gca_fwd(q, k, v, w, True, s)
    records = []
    for kernel, sweep in (("fwd", FWD_SWEEP), ("bwd", BWD_SWEEP)):
        for cfg in sweep:
            if kernel == "fwd":
                fn = lambda cfg=cfg: gca_fwd(q, k, v, w, True, s, config=cfg)  # noqa: E731
            else:
                fn = lambda cfg=cfg: gca_bwd(do, q, k, v, w, lse, s, config=cfg)  # noqa: E731
            rec = {"kernel": kernel, "config": list(cfg), "T": T, "B": B}
            try:
                fn()
                rec["ms"] = triton.testing.do_bench(fn, warmup=25, rep=100)
            except Exception as exc:  # noqa: BLE001 -- a config may not compile (shared memory)
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            records.append(rec)
            print(f"tune {kernel} {cfg}: " + (f"{rec['ms']:.3f} ms" if "ms" in rec else rec["error"]), flush=True)
        timed = [r for r in records if r["kernel"] == kernel and "ms" in r]
        if timed:
            best = min(timed, key=lambda r: r["ms"])
            print(f"tune {kernel}: best (BLOCK_M, BLOCK_N, num_warps, num_stages) = {tuple(best['config'])}")
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--no-tune", action="store_true", help="skip the block-config sweep")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark")
    parser.add_argument("--seq-lens", type=int, nargs="+", default=list(bench.DEFAULT_SEQ_LENS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(bench.DEFAULT_BATCHES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: this script needs a CUDA GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = bench.env_info()
    print(f"{info['device']}  torch {info.get('torch')}  triton {info.get('triton')}  commit {info.get('git_commit')}")
    torch.backends.cuda.matmul.allow_tf32 = False  # references in full precision
    parity = run_parity()
    (out / "gca_parity.json").write_text(json.dumps({"env": info, "records": parity}, indent=1, default=str))
    failed = [r for r in parity if not r["ok"]]
    print(f"parity: {len(parity) - len(failed)}/{len(parity)} ok", flush=True)
    if not args.no_tune:
        tuned = run_tune()
        (out / "gca_tune.json").write_text(json.dumps({"env": info, "records": tuned}, indent=1))
    if not args.no_bench:
        bench.bench_gca(out, seq_lens=args.seq_lens, batches=args.batches)
    if failed:
        print(f"FAILED parity: {', '.join(sorted({r['case'] for r in failed}))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
