"""fla's own autotuning, done ahead of the linear benchmark (``evalsuite bench tune fla``).

fla's kernels autotune on first use (``cache_results``: the winners are stored under ``$TRITON_CACHE_DIR``), and for
``chunk_gsa``'s forward+backward that takes minutes on an H100 -- longer than one timed run could wait. This calls
every fla peer of :mod:`evalsuite.bench.linear_ops` once (ops in fwd and fwdbwd at each T, the decode step at each
batch), so a benchmark started afterwards with the same ``TRITON_CACHE_DIR`` times tuned kernels only. Records: the
seconds each first call took; ``best`` is empty (the winners live in fla's cache).
"""

from __future__ import annotations

import time

import torch

from evalsuite.bench.common import Unavailable


def tune(seq_lens=(1024, 4096, 16384, 65536), batches=(1, 8, 32), tokens_per_call: int = 65536,
         verbose: bool = True) -> dict:  # fmt: skip
    """Every fla peer once at each shape (module doc); a missing fla is one record saying so."""
    from evalsuite.bench.decode import decode_call
    from evalsuite.bench.linear_ops import DECODE_PROVIDERS, PEERS, make_inputs, op_call

    records = []

    def first_call(rec, fn):
        t0 = time.time()
        try:
            fn()
            torch.cuda.synchronize()
            rec["seconds"] = time.time() - t0
        except Unavailable as exc:
            rec["status"] = f"unavailable: {exc}"
        records.append(rec)
        if verbose:
            print(rec, flush=True)

    for T in seq_lens:
        for op, provider in PEERS.items():
            for grad in (True, False):
                x = make_inputs(op, max(1, tokens_per_call // T), T, 16, 64, device="cuda", grad=grad)

                def run(x=x, provider=provider, grad=grad):
                    call, _ = op_call(provider, x, grad)
                    with torch.set_grad_enabled(grad):
                        out = call()
                    if grad:
                        out.backward(x["do"])

                first_call({"provider": provider, "T": T, "mode": "fwdbwd" if grad else "fwd"}, run)
    for provider in [p for names in DECODE_PROVIDERS.values() for p in names if p.startswith("fla")]:
        for batch in batches:

            def step(provider=provider, batch=batch):
                call, _ = decode_call(provider, batch, device="cuda")
                with torch.no_grad():
                    call()

            first_call({"provider": provider, "batch": batch}, step)
    return {"records": records, "best": {}}
