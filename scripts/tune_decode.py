"""Sweep the FoX decode kernel's block config and key splits at decoding shapes (issue #18).

The decode-attention kernel (``evalsuite/kernels/forgetting/decode.py``) took 17% of the compiled 760M FoX (Pro)
step at batch 1 after 4K tokens: 16.4 us per layer for 25 MB of keys and values, about 1.5 TB/s
(``results/bench/h100/profile-step/``). For each shape (batch, 24 heads of 64 at the 760M FoX (Pro)'s widths, a
cache of ``--lengths`` keys read through a device-side key length, as the static decoder calls it) this times every
``(BLOCK_N, num_warps, num_stages)`` of ``--configs`` with the default split count and with 0.5x / 2x / 4x it, the
split merge included, timed as device time over a CUDA graph of ``--reps`` calls (as a decode step's graph runs
it), and checks each output against the PyTorch reference. The fastest config is the one to put in
``common.DECODE_CONFIG``. Writes ``DIR/tune_decode.json`` and prints a table; ``GB/s`` is K and V bytes read / time.

    PYTHONPATH=. python3 scripts/tune_decode.py --out DIR [--lengths 4096 16384 --batches 1 8]

On a CPU with ``TRITON_INTERPRET=1`` it runs at tiny shapes as a smoke test (the interpreter keeps its own config).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from evalsuite.kernels.forgetting import common
from evalsuite.kernels.forgetting.decode import _num_splits, forgetting_attention_decode_triton
from evalsuite.kernels.forgetting.reference import attention_dense
from evalsuite.kernels.triton_utils import interpreting
from evalsuite.runs.provenance import git_commit, versions

CONFIGS = [(bn, w, s) for bn in (32, 64, 128) for w in (2, 4, 8) for s in (1, 2, 3)]


def _time_ms(fn, reps: int, cuda: bool) -> float:
    """Time of one call. On a GPU: ``reps`` calls captured in one CUDA graph, the median of 5 replays / ``reps``,
    i.e. the kernels' device time as a decode step's graph replays them (a call timed alone measures the Python
    wrapper: the first sweep, results/bench/h100/decode-4/tune_decode, read 250-570 us for a 16 us kernel).
    On a CPU (interpreter smoke test): the wall time of one call."""
    fn()
    if not cuda:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (the torch.cuda.graphs recipe)
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[len(times) // 2]


def sweep(batch: int, length: int, heads: int, head_dim: int, configs, reps: int, device) -> list[dict]:
    """Every config x split count at one shape: ms, GB/s, max error vs the reference."""
    gen = torch.Generator(device=device).manual_seed(0)
    capacity = length + 128  # the static cache: room for the new tokens, keys up to ``length`` valid
    q = torch.randn(batch, 1, heads, head_dim, device=device, generator=gen, dtype=torch.bfloat16)
    k, v = (torch.randn(batch, capacity, heads, head_dim, device=device, generator=gen, dtype=torch.bfloat16)
            for _ in range(2))  # fmt: skip
    cum_k = -torch.rand(batch, capacity, heads, device=device, generator=gen).mul(0.01).cumsum(1)
    key_length = torch.tensor([length], device=device)
    cum_q = cum_k[:, length - 1 : length]
    want = attention_dense(q.float(), k[:, :length].float(), v[:, :length].float(), cum_q,
                                          cum_k[:, :length])  # fmt: skip
    read = 2 * batch * length * heads * head_dim * k.element_size()
    saved, rows = common.DECODE_CONFIG, []
    try:
        for config in configs:
            common.DECODE_CONFIG = config
            base = _num_splits(batch * heads, capacity, config[0], q.device)
            for splits in sorted({max(1, base // 2), base, 2 * base, 4 * base}):

                def call(splits=splits):
                    return forgetting_attention_decode_triton(q, k, v, cum_q, cum_k, key_length=key_length,
                                                              num_splits=splits)  # fmt: skip

                err = (call().float() - want).abs().max().item()
                ms = _time_ms(call, reps, device.type == "cuda")
                rows.append({"batch": batch, "length": length, "block_n": config[0], "num_warps": config[1],
                             "num_stages": config[2], "splits": splits, "default_splits": splits == base, "ms": ms,
                             "gb_per_s": read / ms / 1e6, "max_error": err})  # fmt: skip
    finally:
        common.DECODE_CONFIG = saved
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    configs = CONFIGS
    if interpreting():  # the interpreter runs its own config: one pass at tiny shapes checks the plumbing
        configs, args.lengths, args.batches, args.heads, args.reps = [common.DECODE_CONFIG], [64], [1], 2, 1
    elif device.type != "cuda":
        raise SystemExit("this sweep needs a CUDA GPU (or TRITON_INTERPRET=1 for a smoke test)")
    rows = [r for b in args.batches for n in args.lengths
            for r in sweep(b, n, args.heads, args.head_dim, configs, args.reps, device)]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu (interpreter)",
           "shipped_config": list(common.DECODE_CONFIG), "heads": args.heads, "head_dim": args.head_dim,
           "versions": versions(), "git_commit": git_commit(), "rows": rows}  # fmt: skip
    (args.out / "tune_decode.json").write_text(json.dumps(doc, indent=1) + "\n")
    for b in args.batches:
        for n in args.lengths:
            cell = sorted((r for r in rows if r["batch"] == b and r["length"] == n), key=lambda r: r["ms"])
            shipped = next(r for r in cell if (r["block_n"], r["num_warps"], r["num_stages"]) == common.DECODE_CONFIG
                           and r["default_splits"])  # fmt: skip
            print(f"batch {b}, {n} keys: shipped {shipped['ms'] * 1e3:.1f} us ({shipped['gb_per_s']:.0f} GB/s)")
            for r in cell[:5]:
                print(
                    f"  BLOCK_N {r['block_n']:>3} warps {r['num_warps']} stages {r['num_stages']} splits "
                    f"{r['splits']:>3}: {r['ms'] * 1e3:8.1f} us {r['gb_per_s']:7.0f} GB/s  err {r['max_error']:.1e}"
                )


if __name__ == "__main__":
    main()
