"""Block-config sweep of the Grouped Cross Attention kernels (``evalsuite bench tune gca``): the forward and the
backward alone at DRT's shape (T tokens in chunks of 64, K = 8 retrieved chunks, H = 12, D = 64, bf16), for a few
``(BLOCK_M, BLOCK_N, num_warps, num_stages)`` passed to the launchers. ``best``: the fastest of each kernel."""

from __future__ import annotations

import torch

from evalsuite.bench.common import time_ms

FWD_SWEEP = [(64, 64, 4, 1), (64, 64, 4, 2), (64, 64, 4, 3), (64, 32, 4, 2), (64, 64, 8, 2), (64, 32, 8, 3)]
BWD_SWEEP = [(64, 64, 4, 1), (64, 64, 4, 2), (64, 64, 8, 1), (64, 64, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2)]


def tune(seq_len: int = 16384, batch: int = 1, verbose: bool = True) -> dict:
    """The sweep at ``[batch, seq_len / 64 chunks]``."""
    from evalsuite.bench.gca import make_inputs
    from evalsuite.kernels.grouped_cross.backward import gca_bwd
    from evalsuite.kernels.grouped_cross.forward import gca_fwd

    x = make_inputs(batch, seq_len, dtype=torch.bfloat16, device="cuda")
    q, k, v, w = x["q"], x["k"], x["v"], x["w"]
    s = q.shape[-1] ** -0.5
    do = torch.randn_like(q)
    _, lse = gca_fwd(q, k, v, w, True, s)
    records, best = [], {}
    for kernel, sweep in (("fwd", FWD_SWEEP), ("bwd", BWD_SWEEP)):
        for cfg in sweep:
            if kernel == "fwd":
                fn = lambda cfg=cfg: gca_fwd(q, k, v, w, True, s, config=cfg)  # noqa: E731
            else:
                fn = lambda cfg=cfg: gca_bwd(do, q, k, v, w, lse, s, config=cfg)  # noqa: E731
            rec = {"kernel": kernel, "config": list(cfg), "T": seq_len, "B": batch}
            try:
                fn()
                rec["ms"] = time_ms(fn, (), "cuda", warmup=25, rep=100)[0]
            except Exception as exc:  # noqa: BLE001 -- a config may not compile (shared memory)
                rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
            records.append(rec)
            if verbose:
                print(f"{kernel} {cfg}: " + (f"{rec['ms']:.3f} ms" if "ms" in rec else rec["error"]), flush=True)
        timed = [r for r in records if r["kernel"] == kernel and "ms" in r]
        if timed:
            best[kernel] = min(timed, key=lambda r: r["ms"])["config"]
    return {"records": records, "best": best}
