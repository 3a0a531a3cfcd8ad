"""SRMSNorm's Triton kernels against PyTorch: ``evalsuite bench srmsnorm`` (the Lightning Attention paper's Figure 7,
arXiv:2405.17381 App. F).

The paper times the forward and the backward of its Triton SRMSNorm and of PyTorch's against the sequence length at
feature dim 3072 (``seq_lens`` at :data:`SEQ_SWEEP_DIM`) and against the feature dim at sequence length 4096
(``dims`` at :data:`DIM_SWEEP_SEQ`); the batch is not given (``batch``, default 1). Each point is an
``x [batch, n, d]`` in ``dtype`` (bf16) through every provider, each mode (``fwd``: the norm; ``bwd``: the backward
alone on one retained forward, :func:`~evalsuite.bench.common.backward_call`), timed in interleaved rounds
(:func:`~evalsuite.bench.common.time_providers`): ``triton`` (ours, :mod:`evalsuite.kernels.srmsnorm.fused`),
``torch`` (the eager twin, :func:`~evalsuite.kernels.srmsnorm.srmsnorm_reference`: what the paper's "PyTorch" is) and
``torch_compile`` (the twin through ``torch.compile``, a stronger peer that fuses it too). Each peer's record carries
the median and spread of its per-round time over ours (``ratio_to_triton``: above 1, ours is faster).

On a CPU the Triton provider runs only under the interpreter (``TRITON_INTERPRET=1``), else it is recorded
unavailable, as is ``torch_compile`` where compiling fails. Writes ``srmsnorm_bench.json`` (records with the run's
provenance) and ``.md`` under ``--out``.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from evalsuite.bench.common import Call, Unavailable, backward_call, env_info, ratio_fields, ratio_text, time_providers
from evalsuite.errors import UserError
from evalsuite.kernels.srmsnorm import srmsnorm_reference, triton_available
from evalsuite.runs.store import atomic_write_bytes, atomic_write_json

PROVIDERS = ("triton", "torch", "torch_compile")
MODES = ("fwd", "bwd")
SEQ_LENS = (1024, 2048, 4096, 8192, 16384, 32768)
DIMS = (1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384)
SEQ_SWEEP_DIM, DIM_SWEEP_SEQ = 3072, 4096  # the figure's fixed feature dim and fixed sequence length
EPS = 1e-6
JSON_NAME, MD_NAME = "srmsnorm_bench.json", "srmsnorm_bench.md"


def _norm(provider: str, device: torch.device, compiled: dict):
    """The function ``x -> SRMSNorm(x)`` of ``provider``; Unavailable where it cannot run here."""
    if provider == "torch":
        return lambda x: srmsnorm_reference(x, EPS)
    if provider == "torch_compile":
        if "fn" not in compiled:
            compiled["fn"] = torch.compile(lambda x: srmsnorm_reference(x, EPS))
        return compiled["fn"]
    if not triton_available(torch.empty(1, 1, device=device)):
        raise Unavailable("the Triton kernels need a CUDA GPU (or TRITON_INTERPRET=1)")
    from evalsuite.kernels.srmsnorm.fused import srmsnorm_triton

    return lambda x: srmsnorm_triton(x, EPS)


def _builder(provider, mode, x, dy, device, compiled):
    def build() -> Call:
        norm = _norm(provider, device, compiled)
        if mode == "fwd":
            return Call(lambda: norm(x), (), {})
        leaf = x.detach().requires_grad_()
        return backward_call(lambda: norm(leaf), (leaf,), dy, device)

    return build


def _point(sweep, n, d, mode, s) -> list[dict]:
    """The records of one (n, d, mode): one per provider, the peers' with their ratio to ours."""
    g = torch.Generator(device=s["device"]).manual_seed(n * 7 + d)
    x = torch.randn(s["batch"], n, d, device=s["device"], generator=g).to(s["dtype"])
    dy = torch.randn(x.shape, device=s["device"], generator=g).to(s["dtype"])
    builders = {p: _builder(p, mode, x, dy, s["device"], s["compiled"]) for p in s["providers"]}
    from torch._functorch import config as functorch_config

    # The timed backward re-runs on one retained graph; a compiled graph's backward (compiled lazily, at its first
    # call) donates its buffers unless told not to, and then refuses a second run.
    with functorch_config.patch(donated_buffer=False):
        fields, samples = time_providers(builders, device=s["device"], rounds=s["rounds"])
    records = []
    for provider in s["providers"]:
        rec = {"kind": "op", "op": "srmsnorm", "sweep": sweep, "provider": provider, "mode": mode, "B": s["batch"],
               "T": n, "D": d, "dtype": str(s["dtype"]).removeprefix("torch."), **fields[provider],
               "env": s["env"]}  # fmt: skip
        rec.pop("samples_ms", None)
        if provider != "triton" and "triton" in samples and provider in samples:  # a round's peer time over ours
            rec.update(ratio_fields("ratio_to_triton", samples[provider], samples["triton"]))
        records.append(rec)
    return records


def _warm_up(device: torch.device, seconds: float = 1.0) -> None:
    """Keep the GPU busy for ``seconds`` before the first point: from idle its clocks take a while to rise, which
    would slow whichever point runs first (a memory-bound op of microseconds)."""
    if device.type != "cuda":
        return
    x = torch.randn(64, 2**20, device=device)
    stop = time.perf_counter() + seconds
    while time.perf_counter() < stop:
        x.mul_(1.0)
        torch.cuda.synchronize(device)


def bench_srmsnorm(out, *, seq_lens=SEQ_LENS, dims=DIMS, batch: int = 1, providers=PROVIDERS, modes=MODES,
                   rounds: int = 10, dtype: str = "bfloat16", device: str = "auto",
                   verbose: bool = True) -> list[dict]:  # fmt: skip
    """Time the Figure 7 sweeps (module docstring); writes ``srmsnorm_bench.json`` / ``.md`` under ``out`` and
    returns the records."""
    from evalsuite.runtime import resolve_device

    unknown = sorted(set(providers) - set(PROVIDERS)) + sorted(set(modes) - set(MODES))
    if unknown:
        raise UserError(f"unknown provider or mode {', '.join(unknown)}: providers {', '.join(PROVIDERS)}, modes "
                        f"{', '.join(MODES)}")  # fmt: skip
    if batch < 1 or rounds < 1 or not seq_lens or not dims:
        raise UserError("give --batch and --rounds of at least 1 and at least one --seq-lens and --dims value")
    if dtype not in ("bfloat16", "float16", "float32"):
        raise UserError(f"--dtype must be bfloat16, float16 or float32, got {dtype!r}")
    dev = resolve_device(device)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    s = {"device": dev, "batch": batch, "providers": list(providers), "rounds": rounds,
         "dtype": getattr(torch, dtype), "compiled": {}, "env": env}  # fmt: skip
    points = [("seq", n, SEQ_SWEEP_DIM) for n in seq_lens] + [("dim", DIM_SWEEP_SEQ, d) for d in dims]
    _warm_up(dev)
    records = []
    for sweep, n, d in points:
        for mode in modes:
            records += _point(sweep, n, d, mode, s)
            if verbose:
                print(f"{sweep} n={n} d={d} {mode}: " + ", ".join(
                    f"{r['provider']} {r['ms']:.3f} ms" if "ms" in r else f"{r['provider']} {r['status']}"
                    for r in records[-len(providers):]), flush=True)  # fmt: skip
    out = Path(out)
    atomic_write_json(out / JSON_NAME, {"env": env, "records": records})
    atomic_write_bytes(out / MD_NAME, format_markdown(records, env))
    return records


def format_markdown(records: list[dict], env: dict) -> str:
    """One row per (sweep, n, d, mode): ms per provider, and each peer's time over ours."""
    providers = list(dict.fromkeys(r["provider"] for r in records))
    peers = [p for p in providers if p != "triton"]
    lines = [f"# SRMSNorm: Triton against PyTorch\n\n{env.get('device')}, torch {env.get('torch')}, triton "
             f"{env.get('triton')}, commit {env.get('git_commit')}. ms: median over interleaved rounds; peer / ours: "
             "median [p20-p80] of the per-round ratios (above 1: ours is faster).", "",
             "| sweep | n | d | mode | " + " | ".join(f"{p} ms" for p in providers) + " | "
             + " | ".join(f"{p} / triton" for p in peers) + " |",
             "|---|---:|---:|---|" + "---:|" * (len(providers) + len(peers))]  # fmt: skip
    keys = dict.fromkeys((r["sweep"], r["T"], r["D"], r["mode"]) for r in records)
    for key in keys:
        row = {r["provider"]: r for r in records if (r["sweep"], r["T"], r["D"], r["mode"]) == key}
        cells = [f"{row[p]['ms']:.3f}" if "ms" in row.get(p, {}) else row.get(p, {}).get("status", "-")[:30]
                 for p in providers]  # fmt: skip
        cells += [ratio_text(row[p], "ratio_to_triton") if "ratio_to_triton" in row.get(p, {}) else "-" for p in peers]
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
