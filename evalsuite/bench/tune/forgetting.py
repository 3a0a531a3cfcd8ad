"""Block-config sweeps of the Forgetting Attention kernels: the full-sequence forward, dK/dV and dQ kernels
(``evalsuite bench tune forgetting``) and the decode kernel (``evalsuite bench tune forgetting-decode``).

Every candidate is passed to the launchers as an argument; the shipped tables in
:mod:`evalsuite.kernels.forgetting.common` are read, never written. :func:`best_block_configs` turns a sweep's records
into the :class:`~evalsuite.kernels.forgetting.common.BlockConfig` per head dim that ``bench attention --tune`` times
with (and that the printout suggests for the tables).
"""

from __future__ import annotations

import torch

from evalsuite.bench.attention_parity import log_forget_gates
from evalsuite.bench.common import graph_ms, time_ms

# Candidates (BLOCK_M, BLOCK_N, num_warps, num_stages) per head dim, narrowed after two wider sweeps on an H100 (other
# head dims use the D=64 lists). The forward's are timed with TMA loads and with pointer loads.
TUNE_FWD = {
    64: [(128, 64, 4, 4), (128, 64, 4, 3), (256, 64, 8, 3), (256, 64, 8, 4), (256, 32, 8, 4), (128, 128, 8, 3)],
    128: [(128, 64, 8, 4), (128, 64, 8, 3), (128, 32, 4, 3)],
}
TUNE_DKDV = {64: [(32, 64, 4, 4), (32, 64, 4, 3), (32, 128, 8, 3)], 128: [(32, 128, 8, 3), (32, 64, 4, 4)]}
TUNE_DQ = {64: [(128, 32, 4, 4), (64, 64, 4, 4), (128, 64, 8, 3)], 128: [(128, 64, 8, 4), (128, 64, 8, 3)]}
# Decode: (BLOCK_N, num_warps, num_stages); each with the default split count and 0.5x / 2x / 4x it.
TUNE_DECODE = [(bn, w, s) for bn in (32, 64, 128) for w in (2, 4, 8) for s in (1, 2, 3)]


def tune_block_configs(seq_len=16384, head_dims=(64, 128), n_heads=16, tokens_per_call=65536, dtype=torch.bfloat16,
                       verbose=True) -> list[dict]:  # fmt: skip
    """Time each candidate of the forward (TMA and pointer loads), dK/dV and dQ kernels, one kernel at a time, at
    ``[tokens_per_call // seq_len, seq_len, n_heads, D]`` (CUDA). Also the variants of the best (``kind ==
    "tune_variant"``: time-major c, no gate) and SDPA causal's forward at the same shape (``kind == "sdpa"``)."""
    records = []
    for D in head_dims:
        records += _tune_head_dim(seq_len, D, n_heads, tokens_per_call, dtype, verbose)
        torch.cuda.empty_cache()
    return records


def best_block_configs(records) -> dict:
    """``{D: BlockConfig}`` of the fastest forward (config and TMA), dK/dV and dQ configs in the sweep's records."""
    from evalsuite.kernels.forgetting.common import BlockConfig

    best = {}
    for r in records:
        if r.get("kind") == "tune" and "ms" in r:
            key = (r["kernel"], r["D"])
            if key not in best or r["ms"] < best[key]["ms"]:
                best[key] = r
    configs = {}
    for D in sorted({d for _, d in best}):
        if all((k, D) in best for k in ("fwd", "bwd_dkdv", "bwd_dq")):
            fwd = best["fwd", D]
            configs[D] = BlockConfig(tuple(fwd["config"]), tuple(best["bwd_dkdv", D]["config"]),
                                     tuple(best["bwd_dq", D]["config"]), bool(fwd["tma"]))  # fmt: skip
    return configs


def _tune_head_dim(T, D, n_heads, tokens_per_call, dtype, verbose, device="cuda") -> list[dict]:
    from evalsuite.kernels.forgetting.backward import _bwd
    from evalsuite.kernels.forgetting.forward import _fwd

    dev = torch.device(device)
    B = max(1, tokens_per_call // T)
    gen = torch.Generator(device=dev).manual_seed(0)
    q, k, v, do = (torch.randn(B, T, n_heads, D, device=dev, dtype=dtype, generator=gen) for _ in range(4))
    cum = log_forget_gates(B, T, n_heads, dev, gen).cumsum(1)
    cum_tmajor = cum.transpose(1, 2).contiguous().transpose(1, 2)  # same values, time-contiguous storage
    o, lse = _fwd(q, k, v, cum, None)
    records = []

    def timed(rec, fn):
        try:
            fn()
            rec["ms"] = time_ms(fn, (), dev, warmup=10, rep=80)[0]
        except Exception as exc:  # noqa: BLE001 -- e.g. out of shared memory for a big config
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        records.append(rec)
        if verbose:
            label = " ".join(str(rec.get(k, "")) for k in ("kernel", "D", "config", "tma", "variant"))
            print("tune", label, f"{rec['ms']:.3f} ms" if "ms" in rec else rec["error"][:100], flush=True)

    qt, kt, vt = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    timed({"kind": "sdpa", "kernel": "sdpa_causal_fwd", "D": D, "T": T}, lambda: sdpa(qt, kt, vt, is_causal=True))
    for cfg in TUNE_FWD.get(D, TUNE_FWD[64]):
        for tma in (True, False):
            rec = {"kind": "tune", "kernel": "fwd", "D": D, "T": T, "config": list(cfg), "tma": tma}
            timed(rec, lambda cfg=cfg, tma=tma: _fwd(q, k, v, cum, None, config=cfg, tma=tma))
    for name, table, arg in (("bwd_dkdv", TUNE_DKDV, "dkdv_config"), ("bwd_dq", TUNE_DQ, "dq_config")):
        for cfg in table.get(D, table[64]):
            rec = {"kind": "tune", "kernel": name, "D": D, "T": T, "config": list(cfg)}
            timed(rec, lambda kw={arg: cfg}: _bwd(do, q, k, v, cum, o, lse, None, **kw))
    best = best_block_configs(records).get(D)
    if best is None:
        return records
    variants = [
        ("fwd", "c_time_major", lambda: _fwd(q, k, v, cum_tmajor, None, config=best.fwd, tma=best.tma)),
        ("fwd", "no_gate", lambda: _fwd(q, k, v, None, None, config=best.fwd, tma=best.tma)),
        ("bwd", "gate", lambda: _bwd(do, q, k, v, cum, o, lse, None, dkdv_config=best.dkdv, dq_config=best.dq)),
        ("bwd", "no_gate", lambda: _bwd(do, q, k, v, None, o, lse, None, dkdv_config=best.dkdv, dq_config=best.dq)),
    ]
    for name, variant, fn in variants:
        timed({"kind": "tune_variant", "kernel": name, "D": D, "T": T, "variant": variant}, fn)
    return records


def tune(seq_len: int = 16384, head_dims=(64, 128), verbose: bool = True) -> dict:
    """``evalsuite bench tune forgetting``: the sweep of :func:`tune_block_configs` at ``seq_len`` (B * T = 65536,
    16 heads, bf16). ``best``: ``{D: BlockConfig as a dict}``."""
    records = tune_block_configs(seq_len, head_dims, verbose=verbose)
    best = {str(D): {"fwd": list(c.fwd), "dkdv": list(c.dkdv), "dq": list(c.dq), "tma": c.tma}
            for D, c in best_block_configs(records).items()}  # fmt: skip
    return {"records": records, "best": best}


ROTATE_BYTES = 200_000_000  # K/V copies read in turn past this many bytes: no call finds its cache in the L2 (50-60 MB)


def decode_sweep(batch: int, length: int, heads: int, head_dim: int, configs, reps: int, device) -> list[dict]:
    """Every decode config x split count at one shape: the static decoder's call (a cache of ``length + 128`` rows,
    ``length`` of them keys, read through a device-side key length). On CUDA the device time inside a captured graph
    of ``reps`` calls (:func:`graph_ms`), each call on the next of enough K/V copies to pass :data:`ROTATE_BYTES`;
    elsewhere one wall-clock call. Records ms per call, GB/s of K and V read, and the max error against the
    PyTorch reference."""
    import itertools
    import time

    from evalsuite.kernels.forgetting.decode import _num_splits, forgetting_attention_decode_triton
    from evalsuite.kernels.forgetting.reference import attention_dense

    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(0)
    capacity = length + 128
    read = 2 * batch * length * heads * head_dim * 2  # bf16 K and V
    n_copies = -(-ROTATE_BYTES // read) if device.type == "cuda" else 1
    q = torch.randn(batch, 1, heads, head_dim, device=device, generator=gen, dtype=torch.bfloat16)
    caches = [[torch.randn(batch, capacity, heads, head_dim, device=device, generator=gen, dtype=torch.bfloat16)
               for _ in range(2)] for _ in range(n_copies)]  # fmt: skip
    cum_k = -torch.rand(batch, capacity, heads, device=device, generator=gen).mul(0.01).cumsum(1)
    key_length = torch.tensor([length], device=device)
    cum_q = cum_k[:, length - 1 : length]
    k, v = caches[0]
    want = attention_dense(q.float(), k[:, :length].float(), v[:, :length].float(), cum_q, cum_k[:, :length])
    rows = []
    for config in configs:
        base = _num_splits(batch * heads, capacity, config[0], device)
        for splits in sorted({max(1, base // 2), base, 2 * base, 4 * base}):
            turn = itertools.cycle(caches)

            def call(splits=splits, config=config, turn=turn):
                k, v = next(turn)
                return forgetting_attention_decode_triton(q, k, v, cum_q, cum_k, key_length=key_length,
                                                          num_splits=splits, config=config)  # fmt: skip

            err = (call().float() - want).abs().max().item()  # a fresh cycle's first call: copy 0, want's
            if device.type == "cuda":
                ms = graph_ms(call, reps)
            else:
                t0 = time.perf_counter()
                call()
                ms = (time.perf_counter() - t0) * 1e3
            rows.append({"batch": batch, "length": length, "block_n": config[0], "num_warps": config[1],
                         "num_stages": config[2], "splits": splits, "default_splits": splits == base,
                         "copies": n_copies, "ms": ms, "gb_per_s": read / ms / 1e6, "max_error": err})  # fmt: skip
    return rows


def tune_decode(lengths=(4096, 16384), batches=(1, 8), heads: int = 24, head_dim: int = 64, reps: int = 50,
                verbose: bool = True) -> dict:  # fmt: skip
    """``evalsuite bench tune forgetting-decode``: :func:`decode_sweep` over :data:`TUNE_DECODE` at each (batch,
    length) -- 24 heads of 64 are the 760M FoX (Pro)'s widths. ``best``: the fastest row per shape. Under
    ``TRITON_INTERPRET=1`` (no GPU) one pass of the shipped config at 64 keys, 2 heads, checks the plumbing."""
    from evalsuite.kernels.forgetting.common import decode_config
    from evalsuite.kernels.triton_utils import interpreting

    device = torch.device("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    configs = TUNE_DECODE
    if device.type != "cuda":
        configs, lengths, batches, heads, reps = [decode_config()], (64,), (1,), 2, 1
    rows = [r for b in batches for n in lengths for r in decode_sweep(b, n, heads, head_dim, configs, reps, device)]
    best = {}
    for r in rows:
        key = f"batch={r['batch']},length={r['length']}"
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
    if verbose:
        for key, r in best.items():
            print(f"{key}: BLOCK_N {r['block_n']} warps {r['num_warps']} stages {r['num_stages']} splits "
                  f"{r['splits']}: {r['ms'] * 1e3:.1f} us ({r['gb_per_s']:.0f} GB/s)")  # fmt: skip
    return {"shipped": list(decode_config()), "heads": heads, "head_dim": head_dim, "records": rows, "best": best}
