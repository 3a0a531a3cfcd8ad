"""Decode-step linear maps, our few-row GEMV kernel against ``F.linear`` (cuBLAS): ``evalsuite bench gemv``.

Each point is a map ``[N, K]`` at ``M`` rows of x (a decode step's batch): x ``[M, K]`` through ``calls`` (20)
calls back to back, each on its own copy of W, so no call finds its weight in the L2 (which
:func:`~evalsuite.bench.common.interleaved_ms` flushes before each timed block). On CUDA the calls are one CUDA
graph, replayed, as a decode step replays them (no launch gaps from the host); elsewhere they run eagerly. Providers:
``torch`` (``F.linear``), ``triton`` (the kernel, :func:`~evalsuite.kernels.gemv.few_row_linear` with
``backend="triton"``), ``auto`` (the dispatcher's choice, what the models get) and, per ``configs``, the kernel at
other launch settings (``triton[BN,BK,WARPS,STAGES]``), timed in interleaved rounds. Each record: µs per call, GB/s
of W's bytes, its time over ``torch``'s (median and spread of the per-round ratios: below 1, faster than cuBLAS),
and its error against ``F.linear`` and float64.

Default maps (:data:`DECODE_MAPS`): the linear maps a decode step of FoX (Pro) 760M, GSA 1.3B and TNL 385M makes
(their stacked maps as stacked). On a CPU the kernel runs only under the interpreter (``TRITON_INTERPRET=1``), else it
is recorded unavailable. Writes ``gemv_bench.json`` (records with the run's provenance) and ``.md`` under ``--out``.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from evalsuite.bench.common import Call, Unavailable, env_info, errors, ratio_fields, ratio_text, time_providers
from evalsuite.errors import UserError
from evalsuite.kernels.gemv import MAX_ROWS, few_row_linear, kernel_applies
from evalsuite.runs.store import atomic_write_bytes, atomic_write_json

PROVIDERS = ("torch", "triton", "auto")
# (name, N, K): every linear map of one decode step of the three models, maps of one input stacked as the models
# stack them (evalsuite/models/packed.py)
DECODE_MAPS = (
    ("fox-pro q,k,v,shifts,gates", 6216, 1536), ("fox-pro gate,up", 7168, 1536), ("fox-pro down", 1536, 3584),
    ("fox-pro o", 1536, 1536), ("fox-pro head", 50257, 1536),
    ("gsa q,k,v,slot gates", 6400, 2048), ("gsa gate,up", 11264, 2048), ("gsa down", 2048, 5632),
    ("gsa o", 2048, 2048), ("gsa head", 50257, 2048),
    ("tnl q,k,v,u", 4096, 1024), ("tnl out", 1024, 1024), ("tnl l1,l2", 5632, 1024), ("tnl l3", 1024, 2816),
    ("tnl head", 64000, 1024),
)  # fmt: skip
DTYPES = ("bfloat16", "float16", "float32")
JSON_NAME, MD_NAME = "gemv_bench.json", "gemv_bench.md"


def _provider_fn(provider: str, x: torch.Tensor, weight: torch.Tensor):
    """``(x, w) -> y`` of ``provider`` (``torch``, ``triton``, ``auto`` or ``triton[BN,BK,WARPS,STAGES]``);
    Unavailable for the kernel where it cannot take ``x`` and ``weight``."""
    if provider == "torch":
        return F.linear
    if provider == "auto":
        return few_row_linear
    if not kernel_applies(x, weight):
        raise Unavailable("the Triton kernel needs triton and a CUDA GPU (or TRITON_INTERPRET=1)")
    if provider == "triton":
        return lambda x, w: few_row_linear(x, w, backend="triton")
    from evalsuite.kernels.gemv.kernel import GemvConfig, few_row_linear_launch

    config = GemvConfig(*parse_config(provider.removeprefix("triton[").removesuffix("]")))
    return lambda x, w: few_row_linear_launch(x, w, None, config=config)


def parse_config(text: str) -> tuple[int, int, int, int]:
    """``"32,256,4,4"`` -> (block_n, block_k, num_warps, num_stages); a UserError for anything else."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4 or min(values) < 1:
        raise UserError(f"a kernel config is BLOCK_N,BLOCK_K,WARPS,STAGES (positive integers), got {text!r}")
    return values


def _calls(fn, x, weights, device: torch.device):
    """``fn`` over every weight copy, back to back: a CUDA graph's replay on CUDA (captured after a warm call on a
    side stream: compiled kernels, cuBLAS workspaces), eager calls elsewhere."""
    if device.type != "cuda":
        return lambda: [fn(x, w) for w in weights]
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        fn(x, weights[0])
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [fn(x, w) for w in weights]
    del outs  # the graph's pool keeps their memory
    return graph.replay


def _point(name, n, k, m, s) -> list[dict]:
    """One record per provider for the map ``[n, k]`` at ``m`` rows."""
    device, dtype = s["device"], s["dtype"]
    g = torch.Generator(device=device).manual_seed(n * 31 + k * 7 + m)
    x = torch.randn(m, k, device=device, generator=g).to(dtype)
    weights = [(torch.randn(n, k, device=device, generator=g) / k**0.5).to(dtype) for _ in range(s["calls"])]
    ref64 = F.linear(x.double(), weights[0].double())
    ref = F.linear(x, weights[0])
    checks = {}

    def builder(provider):
        def build() -> Call:
            fn = _provider_fn(provider, x, weights[0])
            y = fn(x, weights[0])
            checks[provider] = {"vs_f64": errors(y, ref64), "vs_torch": errors(y, ref)}
            return Call(_calls(fn, x, weights, device))

        return build

    fields, samples = time_providers({p: builder(p) for p in s["providers"]}, device=device, rounds=s["rounds"])
    weight_bytes = n * k * weights[0].element_size()
    records = []
    for provider in s["providers"]:
        rec = {"kind": "op", "op": "gemv", "map": name, "provider": provider, "M": m, "N": n, "K": k,
               "dtype": str(dtype).removeprefix("torch."), "calls_per_sample": s["calls"],
               "weight_bytes": weight_bytes, **fields[provider], **checks.get(provider, {}),
               "env": s["env"]}  # fmt: skip
        rec.pop("samples_ms", None)
        if "ms" in rec:
            rec["us_per_call"] = rec["ms"] * 1e3 / s["calls"]
            rec["gb_per_s"] = weight_bytes / rec["us_per_call"] / 1e3
        if provider != "torch" and provider in samples and "torch" in samples:
            rec.update(ratio_fields("time_over_torch", samples[provider], samples["torch"]))
        records.append(rec)
    return records


def bench_gemv(out, *, shapes=None, rows=(1, 8), providers=PROVIDERS, configs=(), rounds: int = 10, calls: int = 20,
               dtype: str = "bfloat16", device: str = "auto", verbose: bool = True) -> list[dict]:  # fmt: skip
    """Time the maps (``shapes``: ``(N, K)`` pairs; default :data:`DECODE_MAPS`) at each row count of ``rows``
    (module docstring); ``configs``: ``"BN,BK,WARPS,STAGES"`` strings, the kernel at those settings as more
    providers. Writes ``gemv_bench.json`` / ``.md`` under ``out`` and returns the records."""
    from evalsuite.runtime import resolve_device

    unknown = sorted(set(providers) - set(PROVIDERS))
    if unknown or not providers:
        raise UserError(
            f"unknown provider(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(PROVIDERS)}"
        )
    if not rows or not 1 <= min(rows) <= max(rows) <= MAX_ROWS:
        raise UserError(f"--rows must lie between 1 and {MAX_ROWS} (the kernel's most rows), got {list(rows)}")
    if rounds < 1 or calls < 1:
        raise UserError("--rounds and --calls must be at least 1")
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    maps = DECODE_MAPS if shapes is None else [(f"{n}x{k}", n, k) for n, k in shapes]
    if any(n < 1 or k < 16 for _, n, k in maps):
        raise UserError("every map needs N >= 1 and K >= 16 (the kernel's smallest K)")
    dev = resolve_device(device)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    extra = [f"triton[{','.join(map(str, parse_config(c)))}]" for c in configs]
    s = {"device": dev, "dtype": getattr(torch, dtype), "providers": [*providers, *extra], "rounds": rounds,
         "calls": calls, "env": env}  # fmt: skip
    records = []
    for m in rows:
        for name, n, k in maps:
            point = _point(name, n, k, m, s)
            records += point
            if verbose:
                print(f"M={m:<2d} {name:28s} " + ", ".join(
                    f"{r['provider']} {r['us_per_call']:.2f} us" if "us_per_call" in r else f"{r['provider']} "
                    f"{r['status']}" for r in point), flush=True)  # fmt: skip
    out = Path(out)
    atomic_write_json(out / JSON_NAME, {"env": env, "records": records})
    atomic_write_bytes(out / MD_NAME, format_markdown(records, env))
    return records


def format_markdown(records: list[dict], env: dict) -> str:
    """One row per (rows, map): µs per call and GB/s per provider, each one's time over ``torch``'s."""
    providers = list(dict.fromkeys(r["provider"] for r in records))
    others = [p for p in providers if p != "torch"]
    lines = [f"# Decode-step GEMVs: our kernel against F.linear\n\n{env.get('device')}, torch {env.get('torch')}, "
             f"triton {env.get('triton')}, commit {env.get('git_commit')}. us per call (GB/s of W): median over "
             "interleaved rounds; time over torch: median [p20-p80] of the per-round ratios (below 1: faster than "
             "F.linear).", "",
             "| M | map | N | K | " + " | ".join(f"{p} us (GB/s)" for p in providers) + " | "
             + " | ".join(f"{p} / torch" for p in others) + " |",
             "|---:|---|---:|---:|" + "---:|" * (len(providers) + len(others))]  # fmt: skip
    for key in dict.fromkeys((r["M"], r["map"], r["N"], r["K"]) for r in records):
        row = {r["provider"]: r for r in records if (r["M"], r["map"], r["N"], r["K"]) == key}
        cells = [f"{row[p]['us_per_call']:.2f} ({row[p]['gb_per_s']:.0f})" if "us_per_call" in row.get(p, {})
                 else row.get(p, {}).get("status", "-")[:30] for p in providers]  # fmt: skip
        cells += [ratio_text(row.get(p, {}), "time_over_torch") for p in others]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
