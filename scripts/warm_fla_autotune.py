"""Run fla's peers once at the benchmark's shapes so that their Triton autotuning is done before any timing.

fla's kernels autotune on first use (``cache_results``: the winners are stored under ``$TRITON_CACHE_DIR``), and for
``chunk_gsa``'s forward+backward that takes minutes on an H100 -- longer than one timed run could wait. This script
calls every fla provider of :mod:`evalsuite.bench.linear` (ops in fwd and fwdbwd at each T, the decode step at each
batch) once, so a benchmark started afterwards with the same ``TRITON_CACHE_DIR`` times tuned kernels only.

Usage (GPU machine): PYTHONPATH=. python3 scripts/warm_fla_autotune.py [--seq-lens 1024 ...] [--batches 1 8 32]
"""

from __future__ import annotations

import argparse
import time

import torch

from evalsuite.bench.decode import decode_call
from evalsuite.bench.linear import DECODE_PROVIDERS, PEERS, make_inputs, op_call

ap = argparse.ArgumentParser()
ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096, 16384, 65536])
ap.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
ap.add_argument("--tokens-per-call", type=int, default=65536)
args = ap.parse_args()
t0 = time.time()
for T in args.seq_lens:
    for op, provider in PEERS.items():
        for grad in (True, False):
            x = make_inputs(op, max(1, args.tokens_per_call // T), T, 16, 64, device="cuda", grad=grad)
            call, _ = op_call(provider, x, grad)
            if grad:
                call().backward(x["do"])
            else:
                with torch.no_grad():
                    call()
            torch.cuda.synchronize()
            print(f"{provider} T={T} {'fwdbwd' if grad else 'fwd'} warm at {time.time() - t0:.0f}s", flush=True)
for provider in [p for names in DECODE_PROVIDERS.values() for p in names if p.startswith("fla")]:
    for batch in args.batches:
        call, _ = decode_call(provider, batch, device="cuda")
        with torch.no_grad():
            call()
        torch.cuda.synchronize()
        print(f"{provider} B={batch} warm at {time.time() - t0:.0f}s", flush=True)
