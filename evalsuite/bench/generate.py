"""Generation speed against the memory-bandwidth bound: ``evalsuite bench generate``.

For each model (a card, by default FoX (Pro) at its 760M shapes with random weights, or ``hf:DIR``), decode path,
sampling (``greedy``, or ``sampled``: :data:`~evalsuite.bench.generate_cells.SAMPLERS`' seeded draw with a top-k and
a top-p cut), prompt length L and batch B: B random prompts of L tokens go through the adapter's ``generate`` (EOS
off, so every call makes all its tokens). ``t1``, ``tM``, ``tN``: calls making 1 (the prefill and one LM-head pass),
M = N / 2 and N tokens, each call repeated (``--repeats``, default 3) and timed by its median; ``--call-tokens`` adds
calls of other token counts (at most N), timed alike, for the seconds a whole call of k new tokens takes
(``call_times_s``, keyed by k: the GSA paper's inference latency, arXiv:2409.07146 Figure 4(c)). Prefill tokens/s =
B L / t1; decode tokens/s = B (N - M) / (tN - tM), the steady state past the first steps and the CUDA-graph capture,
whose one-off cost per call is ``call_overhead_s`` = tM - t1 - (M - 1) x the steady step time. All include the
host's work, as a task sees it. For our own models the N-token call also times its steps from inside
(:class:`~evalsuite.generation.engine.StepTimer`: the steps after the capture, the device synchronised at both ends):
``ms_per_step_in_call`` (median over the repeats), free of the differences between two calls' one-off costs; and
every call's wall time by phase in the last repeat (``phases_s``, keyed by the call's token count: setup, prefill,
first_steps, steps, finish), to show where two calls differ beyond their steps.

Bound: a decode step reads every weight once (the input embedding only for B rows, unless the head is tied to
it) and the whole decode state of the batch at length L, so decode tokens/s <= B * bandwidth / (weight bytes +
B * state bytes); the bandwidth is measured in the same run by a large device-to-device copy (bytes read plus
bytes written per second). ``fraction_of_bound`` = measured / bound; ``fraction_of_bound_in_call`` the same from the
in-call step time.

Paths: native models ``eager`` (``model.forward`` with a state), ``static`` (the family's static decoder, eager)
and ``graph`` (its step replayed as a CUDA graph) -- :mod:`evalsuite.generation.engine`; ``hf:`` models ``eager``
(dynamic cache), ``static`` (static cache) and ``graph`` (static cache + ``torch.compile`` reduce-overhead). A path
that cannot run is recorded as ``unavailable``, a cell that would not fit in memory as ``skipped``, one that runs
out as ``oom``; nothing stops the sweep. The output folder is a run directory (:class:`~evalsuite.runs.rundir.RunDir`):
each cell's record is appended to ``records.jsonl`` as it finishes and ``generate_bench.json`` rewritten, and a rerun
into the same folder with the same settings resumes (cells that ended in an error run again). Writes
``generate_bench.json``, ``.md``, ``.png`` (:mod:`.generate_report`); one cell's measurement is
:mod:`.generate_cells`'s.
"""

from __future__ import annotations

from pathlib import Path

import torch

from evalsuite.bench.common import env_info
from evalsuite.bench.generate_cells import (
    REPEATS,
    SAMPLERS,
    add_bound,
    cell_bytes,
    free_bytes,
    load_model,
    measure_cell,
    measure_copy_bandwidth,
    set_path,
    state_bytes,
    step_weight_bytes,
)
from evalsuite.bench.generate_report import format_markdown, plot_generate_bench
from evalsuite.errors import UserError
from evalsuite.generation.engine import HEADROOM
from evalsuite.runs.rundir import RunDir, writing
from evalsuite.runs.store import config_hash

PATHS = ("eager", "static", "graph", "compiled")
DEFAULT_MODELS = ("fox-pro",)  # the 760M FoX (Pro) shapes of the paper
DEFAULT_LENGTHS = tuple(2**i for i in range(10, 17))  # 1K .. 64K
DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_PATHS = ("eager", "graph")
DEFAULT_SAMPLINGS = ("greedy",)
JSON_NAME, MD_NAME, PNG_NAME = "generate_bench.json", "generate_bench.md", "generate_bench.png"
RESUME_KEYS = ("new_tokens", "dtype", "weights", "device", "seed")  # the settings a run directory holds


def _key(r: dict) -> tuple:
    return r["model"], r["path"], r.get("sampling", "greedy"), r["length"], r["batch"]


def _previous(run: RunDir) -> list[dict]:
    """The records of the cells ``run`` finished; cells that errored are left out so they run again."""
    kept = [r for r in run.latest().values() if not str(r.get("status", "")).startswith("error")]
    return [{k: v for k, v in r.items() if k != "key"} for r in kept]


def _check_options(paths, samplings, weights, new_tokens, models, lengths, batches, repeats, call_tokens) -> None:
    """A UserError for the first option :func:`bench_generate` cannot take."""
    for given, known, what in ((paths, PATHS, "path"), (samplings, tuple(SAMPLERS), "sampling")):
        bad = [p for p in given if p not in known]
        if bad or not given:
            raise UserError(f"unknown {what}(s) {', '.join(bad)}; choose from {', '.join(known)}")
    if weights not in ("random", "card"):
        raise UserError("--weights must be random or card")
    if new_tokens < 2:
        raise UserError("--new-tokens must be at least 2 (decode speed needs a step after the first token)")
    if not models or not lengths or not batches or min(lengths) < 1 or min(batches) < 1:
        raise UserError("give at least one model, and positive lengths and batch sizes")
    if repeats < 1:
        raise UserError("--repeats must be at least 1")
    if any(not 1 <= k <= new_tokens for k in call_tokens):
        raise UserError(f"--call-tokens must lie between 1 and --new-tokens ({new_tokens}), got {list(call_tokens)}")


def bench_generate(out, *, models=DEFAULT_MODELS, lengths=DEFAULT_LENGTHS, batches=DEFAULT_BATCHES,
                   new_tokens: int = 128, paths=DEFAULT_PATHS, samplings=DEFAULT_SAMPLINGS, device: str = "auto",
                   dtype: str | None = None, weights: str = "random", copy_mib: int | None = None,
                   warmup: bool = True, seed: int = 0, repeats: int = REPEATS, call_tokens=(), verbose: bool = True,
                   repair: bool = False) -> list[dict]:  # fmt: skip
    """The whole sweep; writes the JSON (as it goes), Markdown and PNG under ``out``; returns the records.

    ``samplings``: ``greedy`` and/or ``sampled`` (:data:`~evalsuite.bench.generate_cells.SAMPLERS`), an axis of the
    cells like ``paths``. ``dtype``: default bfloat16 on CUDA, float32 on a CPU. ``weights``: ``random`` (the cards'
    shapes, seed 0) or ``card`` (what each card names). ``copy_mib``: size of the bandwidth copy (default 1 GiB on
    CUDA, 256 MiB on a CPU). ``warmup``: one untimed call of each token count past 1 per cell first. ``repeats``:
    timed repeats of each call (medians). ``call_tokens``: more token counts each timed as a whole call (at most
    ``new_tokens``). ``repair``: set aside the corrupt lines of ``records.jsonl`` first (their cells run again).
    ``out`` is claimed for these settings (another run's ``RESUME_KEYS`` values there are a UserError) and locked
    while the sweep runs.
    """
    from evalsuite.runs.store import atomic_write_bytes, atomic_write_json
    from evalsuite.runtime import resolve_device

    call_tokens = sorted(set(call_tokens))
    _check_options(paths, samplings, weights, new_tokens, models, lengths, batches, repeats, call_tokens)
    dev = resolve_device(device)
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    out = Path(out)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    params = dict(models=list(models), lengths=sorted(lengths), batches=sorted(batches), new_tokens=new_tokens,
                  paths=list(paths), samplings=list(samplings), dtype=dtype, weights=weights, device=env["device"],
                  seed=seed, warmup=warmup, repeats=repeats, call_tokens=call_tokens)  # fmt: skip
    resume = {k: params[k] for k in RESUME_KEYS}  # a resumed run must agree on these
    if call_tokens:  # (absent otherwise: a run made before the option resumes as it was)
        resume["call_tokens"] = call_tokens
    with writing(out, "bench-generate", config_hash(resume), resume, outputs=(JSON_NAME,), repair=repair) as run:
        records = _previous(run)
        bandwidth = measure_copy_bandwidth(dev, copy_mib)
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the copy's buffers go back before the models load
        env["copy_bandwidth"] = bandwidth
        done = {_key(r): r for r in records}

        def save():
            atomic_write_json(out / JSON_NAME, {"env": env, "params": params, "records": records})

        def add(rec):
            records[:] = [r for r in records if _key(r) != _key(rec)] + [rec]
            done[_key(rec)] = rec
            run.append({"key": "|".join(map(str, _key(rec))), **rec})
            save()
            if verbose:
                decode = f"{rec['decode_tokens_per_s']:9.1f} tok/s" if "decode_tokens_per_s" in rec else "unresolved"
                what = (f"prefill {rec['prefill_tokens_per_s']:10.0f} tok/s  decode {decode}"
                        if rec["status"] == "ok" else rec["status"])  # fmt: skip
                cell = (f"{rec['model']:20s} {rec['path']:8s} {rec['sampling']:7s} L={rec['length']:<6d} "
                        f"B={rec['batch']:<4d}")  # fmt: skip
                print(f"{cell} {what}", flush=True)

        timing = dict(new_tokens=new_tokens, warmup=warmup, seed=seed, repeats=repeats, calls=tuple(call_tokens))
        for spec in models:
            cells = [(p, s, L, B) for p in paths for s in samplings for L in sorted(lengths) for B in sorted(batches)]
            cells = [c for c in cells if (spec, *c) not in done]
            if not cells:
                continue
            _run_model(spec, cells, add, dev, dtype, weights, env["device"], bandwidth["bytes_per_s"], timing)
        save()
        atomic_write_bytes(out / MD_NAME, format_markdown(records, env, params) + "\n")
        plot_generate_bench(records, out / PNG_NAME, env)
        return records


def _run_model(spec, cells, add, dev, dtype, weights, device_name, bandwidth, timing) -> None:
    """Load model ``spec`` and hand ``add`` one record per ``(path, sampling, length, batch)`` of ``cells``: timed, or
    why not (unavailable path, too big for the free memory, out of memory, error). ``timing``: :func:`measure_cell`'s
    ``new_tokens``, ``warmup``, ``seed``, ``repeats`` and ``calls``."""
    try:
        adapter = load_model(spec, str(dev), dtype, weights)
    except Exception as exc:  # noqa: BLE001 -- a model that cannot load is a recorded cell status, not a crash
        for p, s, L, B in cells:
            add({"model": spec, "path": p, "sampling": s, "length": L, "batch": B, "status": f"error: {exc}"[:500]})
        return
    weight_bytes = step_weight_bytes(adapter)
    new_tokens = timing["new_tokens"]
    for path in dict.fromkeys(c[0] for c in cells):
        try:
            why = set_path(adapter, path)
        except Exception as exc:  # noqa: BLE001 -- e.g. a static decoder that fails to build: recorded
            why = f"{type(exc).__name__}: {exc}"[:300]
        oom_at: dict[int, int] = {}  # length -> smallest batch that ran out of memory
        for _, sampling, L, B in [c for c in cells if c[0] == path]:
            rec = {"model": spec, "name": adapter.name, "path": path, "sampling": sampling, "length": L, "batch": B,
                   "device": device_name}  # fmt: skip
            need, free = cell_bytes(adapter, L, B, new_tokens), free_bytes(dev)
            rec.update(estimated_bytes=need, free_bytes=free)  # the estimate, to compare with peak_mem_mib
            if why is not None:
                rec["status"] = f"unavailable: {why}"
            elif L in oom_at and B >= oom_at[L]:
                rec["status"] = f"skipped: batch {oom_at[L]} ran out of memory at this length"
            elif need is not None and free is not None and need > HEADROOM * free:
                rec["status"] = f"skipped: needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
            else:
                try:
                    rec.update(measure_cell(adapter, L, B, sampling=sampling, **timing), status="ok")
                except torch.OutOfMemoryError:
                    rec["status"], oom_at[L] = "oom", min(B, oom_at.get(L, B))
                except Exception as exc:  # noqa: BLE001 -- one failing cell must not stop the sweep
                    rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            add_bound(rec, weight_bytes, state_bytes(adapter, L), bandwidth)
            add(rec)
    del adapter
    if dev.type == "cuda":
        torch.cuda.empty_cache()
