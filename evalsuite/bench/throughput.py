"""Inference throughput at the largest batch that fits: ``evalsuite bench throughput``.

The Lightning Attention paper's Figure 5 (arXiv:2405.17381 §5.2): 7B models on one GPU, the batch "chosen to optimize
GPU utilization without exceeding memory limits", a 512-token prompt, up to 1024 new tokens, the throughput
"averaged from 20 attempts". For each model (a card at its shapes, random weights), one after another, each freed
before the next:

1. **The batch.** :func:`largest_batch` finds the largest B whose whole generate call (``length`` random prompt
   tokens, ``new_tokens`` new ones, EOS off) fits in device memory: it doubles from 1 until a call runs out of
   memory, then bisects between the last fit and the first failure until they are within ``tolerance`` (1: exact),
   never above ``limit`` (a state that does not grow with the context -- TNL's -- runs out only through the batch,
   far later than a KV cache). A probe that ends in ``torch.OutOfMemoryError`` (or a CUDA graph capture that an
   allocation failure broke) does not fit; its memory is freed before the next.
2. **The attempts.** ``attempts`` whole calls at B, each timed with the device synchronised at both ends: generated
   tokens/s ``B N / s`` and total tokens/s ``B (L + N) / s``, their mean, standard deviation and median over the
   attempts, the seconds of each call, the peak device memory, and ``ratio_generated`` / ``ratio_total``: the mean
   over the ``baseline`` model's mean. The search's probe at B ran every kernel at B's shapes first (Triton's
   autotuning included), so no untimed call precedes them.

**Short probes.** On the paths with the family's static decoder (``graph``, ``compiled``, ``static``) a probe is the
call cut short after :data:`PROBE_TOKENS` tokens (:class:`_StopAfter`, the engine's step hook), and its peak memory
is the whole call's: :func:`evalsuite.generation.engine.generate` allocates the decode state for L + N positions and
the ``[B, N]`` token buffer before the prefill, so the probe holds the same state, runs the same prefill, and its
steps are those of the whole call -- two eager warm-up steps, the capture of the step into the graph's memory pool,
a replay; every later step replays that graph (``graph``, ``compiled``: no allocation) or runs the same fixed-shape
step again (``static``: the same allocations, reused from the allocator's cache). What a call does after its last
step (the host's stop rules and detokenisation) happens on the host. On the ``eager`` path the step's attention
temporaries may grow with the cache's filled length, so a probe is the whole call. Each record keeps the peak of
its probe at B (``probe_peak_mib``) beside that of the timed calls (``peak_mem_mib``): the check of that claim.

Path: ``auto`` takes, per model, the engine's fastest path that needs no compilation -- ``graph`` on CUDA where the
family's static step is graph-safe (every family's is), ``static`` where it is not, ``eager`` on a CPU;
``compiled`` (the step through ``torch.compile`` first: fewer kernels at small batches) is a choice, at the cost of
its compile time and a recompile for the search's second batch shape.

The output folder is a run directory (:class:`~evalsuite.runs.rundir.RunDir`): one record per model, with the
run's provenance (:func:`~evalsuite.bench.common.env_info`), appended to ``records.jsonl`` as the model finishes, and
``throughput_bench.json`` and ``.md`` rewritten; a rerun with the same settings skips the models it holds (those that
ended in an error run again). Our own models only (native cards): the probes cut the engine's call short.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from evalsuite.bench.common import env_info, sync, wall_seconds
from evalsuite.errors import UserError
from evalsuite.generation.engine import GRAPH_WARMUP, NoTimer

PATHS = ("auto", "eager", "static", "graph", "compiled")
DEFAULT_MODELS = ("transformer-llama-7b", "tnl-7b")  # the Figure 5 pair at 7B shapes
LENGTH, NEW_TOKENS, ATTEMPTS, BATCH_LIMIT = 512, 1024, 20, 4096  # the paper's prompt, new tokens and attempts
PROBE_TOKENS = GRAPH_WARMUP + 3  # the prefill's token, the eager warm-up steps, the captured step, one replay
JSON_NAME, MD_NAME = "throughput_bench.json", "throughput_bench.md"


def largest_batch(fits: Callable[[int], bool], limit: int, tolerance: int = 1) -> int:
    """The largest batch ``b <= limit`` for which ``fits(b)``, assuming every smaller batch fits too; 0 when batch 1
    does not. Doubles from 1 until a batch fails (or ``limit`` fits), then bisects between the last fit and that
    failure until they are within ``tolerance`` (the answer is then at most ``tolerance - 1`` below the true one).
    Each batch is probed at most once."""
    if limit < 1 or tolerance < 1:
        raise ValueError(f"limit and tolerance must be at least 1, got {limit} and {tolerance}")
    fit, batch = 0, 1
    while fits(batch):
        fit = batch
        if batch == limit:
            return fit
        batch = min(2 * batch, limit)
    failed = batch
    while failed - fit > tolerance:
        mid = (fit + failed) // 2
        if fits(mid):
            fit = mid
        else:
            failed = mid
    return fit


@dataclass(frozen=True)
class _Settings:
    """What every model of a run is measured with (what a resumed run must agree on)."""

    length: int
    new_tokens: int
    attempts: int
    batch_limit: int
    batch_tolerance: int
    path: str
    dtype: str
    device: str
    seed: int
    baseline: str


class _Stopped(Exception):
    """A probe's call, cut short."""


class _StopAfter(NoTimer):
    """The engine's step hook (:class:`~evalsuite.generation.engine.StepTimer`) as a probe's early stop: raises
    :class:`_Stopped` once the call has made ``tokens`` tokens; times nothing (no synchronisation)."""

    def __init__(self, tokens: int):
        super().__init__()
        self.tokens = tokens

    def after_step(self, made: int) -> None:
        if made >= self.tokens:
            raise _Stopped


@dataclass(frozen=True)
class _Caller:
    """Generate calls of one model on one path: ``batch`` random prompts of ``length`` tokens (seeded by the batch),
    ``new_tokens`` new ones, EOS off, greedy -- the engine's call as the native adapter makes it."""

    adapter: object
    path: str
    length: int
    new_tokens: int
    seed: int

    def ids(self, batch: int) -> torch.Tensor:
        """``[batch, length]`` long prompt ids, below both the tokenizer's and the model's vocabulary."""
        vocab = min(self.adapter.tokenizer.vocab_size, self.adapter.model.vocab_size)
        gen = torch.Generator().manual_seed(self.seed + 7919 * batch)
        return torch.randint(0, vocab, (batch, self.length), generator=gen)

    def __call__(self, ids: torch.Tensor, stop_after: int | None = None) -> list | None:
        """The generations of a whole call, or None for a call stopped after ``stop_after`` tokens."""
        from evalsuite.generation import engine
        from evalsuite.generation.types import GenerationConfig

        config = GenerationConfig(max_new_tokens=self.new_tokens, stop_at_eos=False, seed=self.seed)
        timer = _StopAfter(stop_after) if stop_after else None
        with torch.inference_mode(), self.adapter._autocast():
            try:
                return engine.generate(self.adapter.model, ids, None, config, self.adapter.tokenizer,
                                       path=self.path, timer=timer)  # fmt: skip
            except _Stopped:
                return None


def _free(device: torch.device) -> None:
    """Drop what the last call left (a broken call's frames included) and give the allocator's cache back."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_mib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None


def _out_of_memory(exc: BaseException) -> bool:
    """An allocation failure: PyTorch's, or the CUDA error of a graph capture an allocation failure broke."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "capture" in text)


def _probe(call: _Caller, batch: int, short: bool, device: torch.device) -> dict:
    """One probe at ``batch`` (short: :data:`PROBE_TOKENS` tokens; else the whole call): ``{batch, fits, seconds,
    peak_mib (CUDA), error (when it did not fit)}``. Errors other than running out of memory propagate."""
    ids = call.ids(batch)
    _free(device)
    entry: dict = {"batch": batch}
    t0 = time.perf_counter()
    try:
        call(ids, PROBE_TOKENS if short else None)
        sync(device)
        entry["fits"] = True
    except Exception as exc:  # noqa: BLE001 -- running out of memory is the answer; anything else is raised again
        if not _out_of_memory(exc):
            raise
        entry.update(fits=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0]}"[:200])
    entry["seconds"] = time.perf_counter() - t0
    if device.type == "cuda":
        entry["peak_mib"] = _peak_mib(device)
    _free(device)
    return entry


def _spread(values: list[float]) -> tuple[float, float, float]:
    """(mean, standard deviation (0 for one value), median)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std, statistics.median(values)


def _attempts(call: _Caller, batch: int, attempts: int, device: torch.device) -> dict:
    """``attempts`` whole calls at ``batch``, timed: the rates, their spread, the seconds, tokens made, peak memory."""
    ids = call.ids(batch)
    _free(device)
    made: list = []
    seconds = [wall_seconds(lambda: made.append(call(ids)), device) for _ in range(attempts)]
    rec: dict = {"seconds": seconds, "tokens_made": sum(len(g.token_ids) for g in made[-1])}
    if device.type == "cuda":
        rec["peak_mem_mib"] = _peak_mib(device)
    for name, tokens in (("generated", batch * call.new_tokens), ("total", batch * (call.length + call.new_tokens))):
        mean, std, median = _spread([tokens / s for s in seconds])
        rec.update({f"{name}_tokens_per_s": mean, f"{name}_tokens_per_s_std": std,
                    f"{name}_tokens_per_s_median": median})  # fmt: skip
    return rec


def resolve_path(adapter, path: str) -> str:
    """The decode path ``path`` (``auto``: see the module docstring) for ``adapter``, put on it; a UserError when
    it cannot run here."""
    from evalsuite.bench.generate_cells import set_path
    from evalsuite.generation.engine import static_support

    if path == "auto":
        if adapter.device.type != "cuda":
            path = "eager"
        else:
            with adapter._autocast():
                support = static_support(adapter.model)
            path = {"graph": "graph", "static": "static"}.get(support, "eager")
    why = set_path(adapter, path)
    if why is not None:
        raise UserError(f"decode path {path!r} cannot run for {adapter.name}: {why}")
    return path


def _measure_model(adapter, s: _Settings, say=print) -> dict:
    """Search ``adapter``'s largest batch and time its attempts there (module docstring): the record's measured
    fields (``state_bytes``: one sequence's decode state after L + N tokens), ``status`` ``ok`` or ``oom: ...``."""
    from evalsuite.bench.generate_cells import state_bytes

    device = adapter.device
    path = resolve_path(adapter, s.path)
    call = _Caller(adapter, path, s.length, s.new_tokens, s.seed)
    short = path != "eager" and s.new_tokens > PROBE_TOKENS
    log: list[dict] = []

    def fits(batch: int) -> bool:
        log.append(_probe(call, batch, short, device))
        entry = log[-1]
        peak = f", peak {entry['peak_mib'] / 1024:.1f} GiB" if "peak_mib" in entry else ""
        say(f"  batch {batch}: {'fits' if entry['fits'] else 'does not fit'} ({entry['seconds']:.1f} s{peak})")
        return entry["fits"]

    t0 = time.perf_counter()
    batch = largest_batch(fits, s.batch_limit, s.batch_tolerance)
    rec = {"path": path, "probe": f"first {PROBE_TOKENS} tokens" if short else "whole call", "batch": batch,
           "at_limit": batch == s.batch_limit, "search_s": time.perf_counter() - t0, "probes": log,
           "params": sum(p.numel() for p in adapter.model.parameters()), "architecture": adapter.card.architecture,
           "state_bytes": state_bytes(adapter, s.length + s.new_tokens)}  # fmt: skip
    if batch == 0:
        return {**rec, "status": "oom: batch 1 does not fit"}
    if device.type == "cuda":  # the probe's peak at this batch, beside the whole calls' (the short probe's check)
        rec["probe_peak_mib"] = next(e["peak_mib"] for e in log if e["batch"] == batch)
    try:
        rec.update(_attempts(call, batch, s.attempts, device))
    except torch.OutOfMemoryError:
        return {**rec, "status": f"oom: a whole call at batch {batch} ran out of memory after its probe fitted"}
    finally:
        _free(device)
    return {**rec, "status": "ok"}


def _check(models: list[str], s: _Settings) -> None:
    """A UserError for the first option :func:`bench_throughput` cannot take."""
    from evalsuite.cards import load_card

    if not models:
        raise UserError("give at least one --model")
    if len(set(models)) < len(models):
        raise UserError("a model is named twice")
    if any(m.startswith("hf:") for m in models):
        raise UserError("bench throughput measures our own models (cards): its probes cut the engine's call short")
    for spec in models:  # an unknown card is one line now, not a record later
        load_card(spec)
    if s.baseline not in models:
        raise UserError(f"--baseline {s.baseline} is not one of the models ({', '.join(models)})")
    if s.path not in PATHS:
        raise UserError(f"unknown --path {s.path!r}; choose from {', '.join(PATHS)}")
    for name, value in (("--length", s.length), ("--new-tokens", s.new_tokens), ("--attempts", s.attempts),
                        ("--batch-limit", s.batch_limit), ("--batch-tolerance", s.batch_tolerance)):  # fmt: skip
        if value < 1:
            raise UserError(f"{name} must be at least 1, got {value}")


def with_ratios(rec: dict, base: dict | None) -> dict:
    """``rec`` with ``ratio_generated`` and ``ratio_total`` (its mean tokens/s over ``base``'s) when both ran."""
    rec = {k: v for k, v in rec.items() if not k.startswith("ratio_")}
    if base is not None and rec.get("status") == "ok" and base.get("status") == "ok":
        for name in ("generated", "total"):
            rec[f"ratio_{name}"] = rec[f"{name}_tokens_per_s"] / base[f"{name}_tokens_per_s"]
    return rec


def bench_throughput(out, *, models=DEFAULT_MODELS, baseline: str | None = None, length: int = LENGTH,
                     new_tokens: int = NEW_TOKENS, attempts: int = ATTEMPTS, batch_limit: int = BATCH_LIMIT,
                     batch_tolerance: int = 1, path: str = "auto", device: str = "auto", dtype: str | None = None,
                     seed: int = 0, verbose: bool = True, repair: bool = False) -> list[dict]:  # fmt: skip
    """Measure every model of ``models`` (cards; random weights) not yet under ``out`` (module docstring), the
    ``baseline`` (default: the first) first; returns the folder's records, in ``models`` order. ``dtype``: default
    bfloat16 on CUDA, float32 on a CPU. ``repair``: set aside corrupt lines of ``records.jsonl`` first. ``out`` is
    claimed for these settings (another run's there is a UserError) and locked while the run lasts."""
    from evalsuite.bench.generate_cells import load_model
    from evalsuite.runs.rundir import writing
    from evalsuite.runs.store import config_hash
    from evalsuite.runtime import resolve_device

    models = list(models)
    dev = resolve_device(device)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    s = _Settings(length, new_tokens, attempts, batch_limit, batch_tolerance, path,
                  dtype or ("bfloat16" if dev.type == "cuda" else "float32"), env["device"], seed,
                  baseline or (models[0] if models else ""))  # fmt: skip
    _check(models, s)
    say = (lambda text: print(text, flush=True)) if verbose else (lambda text: None)
    settings = dict(vars(s), weights="random")
    out = Path(out)
    with writing(out, "bench-throughput", config_hash(settings), settings, outputs=(JSON_NAME,), repair=repair) as run:
        records = {k: r for k, r in run.latest().items() if not str(r.get("status", "")).startswith("error")}
        for spec in [s.baseline] + [m for m in models if m != s.baseline]:
            if spec in records:
                continue
            say(f"{spec}: loading")
            rec = {"key": spec, "model": spec, **settings, "env": env}
            try:
                adapter = load_model(spec, str(dev), s.dtype, "random")
                rec.update(_measure_model(adapter, s, say), name=adapter.name)
            except Exception as exc:  # noqa: BLE001 -- one model's failure is its record, not the end of the run
                rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
            adapter = None  # the model leaves the device before the next loads
            _free(dev)
            records[spec] = rec = with_ratios(rec, records.get(s.baseline))
            run.append(rec)
            _save(out, records, models, s.baseline, env)
            say(f"{spec}: {_summary(rec, s.baseline)}")
        return _save(out, records, models, s.baseline, env)


def _summary(rec: dict, baseline: str) -> str:
    if rec["status"] != "ok":
        return rec["status"]
    ratio = f", {rec['ratio_generated']:.2f}x {baseline}" if "ratio_generated" in rec else ""
    return f"batch {rec['batch']}, {rec['generated_tokens_per_s']:,.0f} generated tokens/s{ratio}"


def _save(out: Path, records: dict[str, dict], models: list[str], baseline: str, env: dict) -> list[dict]:
    """Write the JSON and the table of the folder's records (the run's models first), ratios taken afresh."""
    from evalsuite.runs.store import atomic_write_bytes, atomic_write_json

    order = models + [k for k in records if k not in models]
    rows = [with_ratios(records[k], records.get(baseline)) for k in order if k in records]
    atomic_write_json(out / JSON_NAME, {"env": env, "records": rows})
    atomic_write_bytes(out / MD_NAME, format_markdown(rows, env, baseline) + "\n")
    return rows


def format_markdown(records: list[dict], env: dict, baseline: str) -> str:
    """One row per model: the batch, generated and total tokens/s (mean ± std, median), the ratio to the baseline,
    seconds per call, peak memory of the calls and of the probe at the batch, the search."""
    first = records[0] if records else {}
    lines = [f"# Inference throughput at the largest batch\n\n{env.get('device')}, torch {env.get('torch')}, commit "
             f"{env.get('git_commit')}. {first.get('length')}-token prompts, {first.get('new_tokens')} new tokens a "
             f"call (EOS off), {first.get('dtype')}, random weights. Batch: the largest whose call fits (doubling, "
             f"then bisection to within {first.get('batch_tolerance')}; at most {first.get('batch_limit')}, marked "
             "≥). Tokens/s: mean ± std (median) over the attempts; ratio: mean tokens/s over the baseline's.", "",
             "| model | params | path | batch | generated tokens/s | total tokens/s | × " + baseline +
             " | s per call | peak GiB (probe) | search | status |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---|"]  # fmt: skip
    for r in records:
        cells = [r["model"], f"{r['params'] / 1e9:.2f}B" if "params" in r else "-", r.get("path", "-")]
        cells.append(("≥" if r.get("at_limit") else "") + str(r["batch"]) if "batch" in r else "-")
        if r["status"] == "ok":
            for name in ("generated", "total"):
                mean, std, med = (r[f"{name}_tokens_per_s{x}"] for x in ("", "_std", "_median"))
                cells.append(f"{mean:,.0f} ± {std:,.0f} ({med:,.0f})")
            peak = (f"{r['peak_mem_mib'] / 1024:.1f} ({r['probe_peak_mib'] / 1024:.1f})"
                    if "peak_mem_mib" in r else "-")  # fmt: skip
            cells += [f"{r['ratio_generated']:.2f}x" if "ratio_generated" in r else "-",
                      f"{statistics.fmean(r['seconds']):.2f} × {len(r['seconds'])}", peak]  # fmt: skip
        else:
            cells += ["-"] * 5
        search = f"{len(r['probes'])} probes, {r['search_s']:.0f} s" if "probes" in r else "-"
        lines.append("| " + " | ".join(cells + [search, r["status"][:80]]) + " |")
    return "\n".join(lines)
