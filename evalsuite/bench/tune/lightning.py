"""Launch-config sweep of the Lightning Attention kernels (``evalsuite bench tune lightning``): chunks per segment
G and the walk's ``(num_warps, num_stages)``, passed to the launcher as a
:class:`~evalsuite.kernels.lightning.common.LaunchConfig`; forward and forward+backward at the benchmark's shape
(bf16, H = 16, D = 64, B = 65536 // T). ``best``: the setting with the fastest forward+backward."""

from __future__ import annotations

import dataclasses
import itertools

import torch

from evalsuite.bench.common import time_ms

SEG_CHUNKS = (4, 8, 16)
WALK_LAUNCHES = ((4, 2), (4, 3), (8, 2))


def tune(seq_len: int = 16384, tokens: int = 65536, heads: int = 16, head_dim: int = 64, seg_chunks=SEG_CHUNKS,
         launches=WALK_LAUNCHES, verbose: bool = True) -> dict:  # fmt: skip
    """The sweep at ``[tokens // seq_len, seq_len, heads, head_dim]`` on the GPU (under the Triton interpreter on a
    CPU, from the interpreter's config, in float32)."""
    from evalsuite.bench.linear_ops import alibi_slopes
    from evalsuite.kernels.lightning import common
    from evalsuite.kernels.lightning.chunk import lightning_chunk_triton
    from evalsuite.kernels.triton_utils import interpreting

    device = "cpu" if interpreting() else "cuda"
    base, dtype = (common.INTERPRET_CONFIG, torch.float32) if device == "cpu" else (common.GPU_CONFIG, torch.bfloat16)
    B = max(1, tokens // seq_len)
    gen = torch.Generator(device).manual_seed(0)
    shape = (B, seq_len, heads, head_dim)
    q, k = (torch.randn(shape, device=device, generator=gen).mul(head_dim**-0.25).to(dtype) for _ in "qk")
    v = torch.randn(shape, device=device, generator=gen).to(dtype)
    leaves = [t.requires_grad_() for t in (q, k, v)]
    do, slope = torch.randn_like(v), alibi_slopes(heads).to(device)
    records = []
    for g, launch in itertools.product(seg_chunks, launches):
        config = dataclasses.replace(base, seg_chunks=g, walk_launch=tuple(launch))
        rec = {"seg_chunks": g, "walk_launch": list(launch), "T": seq_len, "B": B}

        def fwd(config=config):
            return lightning_chunk_triton(q, k, v, slope, config=config)[0]

        def fwdbwd(config=config):
            fwd(config).backward(do)

        try:
            fwdbwd()
            rec["fwd_ms"] = time_ms(fwd, (), device)[0]
            rec["fwdbwd_ms"] = time_ms(fwdbwd, leaves, device)[0]
        except Exception as exc:  # noqa: BLE001 -- a setting may not compile (registers, shared memory)
            rec["error"] = f"{type(exc).__name__}: {exc}"[:300]
        records.append(rec)
        if verbose:
            timed = f"fwd {rec['fwd_ms']:.3f} ms, fwd+bwd {rec['fwdbwd_ms']:.3f} ms" if "error" not in rec else ""
            print(f"G={g} walk={launch}: {timed or rec['error']}", flush=True)
    timed = [r for r in records if "error" not in r]
    best = min(timed, key=lambda r: r["fwdbwd_ms"]) if timed else None
    return {"records": records, "best": best and {"seg_chunks": best["seg_chunks"], "walk_launch": best["walk_launch"]}}
