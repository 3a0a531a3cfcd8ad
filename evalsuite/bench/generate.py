"""Generation speed against the memory-bandwidth bound: ``evalsuite bench generate``.

For each model (a card, by default FoX (Pro) at its 760M shapes with random weights, or ``hf:DIR``), decode path,
prompt length L and batch B: B random prompts of L tokens go through the adapter's ``generate`` (EOS off, so every
call makes all its tokens). ``t1``, ``tM``, ``tN``: calls making 1 (the prefill and one LM-head pass), M = N / 2 and
N tokens, each call repeated (``--repeats``, default 3) and timed by its median. Prefill tokens/s = B L / t1; decode
tokens/s = B (N - M) / (tN - tM), the steady state past the first steps and the CUDA-graph capture, whose one-off
cost per call is ``call_overhead_s`` = tM - t1 - (M - 1) x the steady step time. All include the host's work, as a
task sees it. For our own models the N-token call also times its steps from inside
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
``generate_bench.json``, ``.md``, ``.png``.

    python -m evalsuite.bench.generate --out results/bench/h100/generate
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from evalsuite.errors import UserError
from evalsuite.generation.engine import HEADROOM, StepTimer, bytes_per_prompt, free_device_bytes, prompt_bytes
from evalsuite.generation.types import GenerationConfig
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import config_hash

PATHS = ("eager", "static", "graph", "compiled")
DEFAULT_MODELS = ("fox-pro",)  # the 760M FoX (Pro) shapes of the paper
DEFAULT_LENGTHS = tuple(2**i for i in range(10, 17))  # 1K .. 64K
DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_PATHS = ("eager", "graph")
JSON_NAME, MD_NAME, PNG_NAME = "generate_bench.json", "generate_bench.md", "generate_bench.png"
COPY_MIB = {"cuda": 1024, "cpu": 256}  # the bandwidth copy: well beyond every cache
REPEATS = 3  # timed repeats of each call per cell (medians)
RESUME_KEYS = ("new_tokens", "dtype", "weights", "device", "seed")  # a resumed run must agree on these


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn, device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def measure_copy_bandwidth(device, mib: int | None = None, reps: int = 5) -> dict:
    """Memory bandwidth from a device-to-device copy of ``mib`` MiB: (bytes read + bytes written) / median time
    of ``reps`` copies, after one warm-up copy."""
    device = torch.device(device)
    mib = mib or COPY_MIB.get(device.type, 256)
    src = torch.ones(mib * 2**20, dtype=torch.uint8, device=device)  # written first: no zero-page reads on a CPU
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = sorted(_timed(lambda: dst.copy_(src), device) for _ in range(reps))
    seconds = times[len(times) // 2]
    return {"copy_mib": mib, "seconds": seconds, "bytes_per_s": 2 * src.numel() / seconds}


def load_model(spec: str, device: str, dtype: str, weights: str):
    """The adapter of ``spec``: a card (``weights="random"``: its shapes with random weights, seed 0) or ``hf:DIR``."""
    from evalsuite.adapters.registry import AdapterOptions, load_adapter, split_spec

    kind, name = split_spec(spec)
    if kind != "native":
        return load_adapter(spec, AdapterOptions(device=device, dtype=dtype))
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    card = load_card(name)
    if weights == "random":
        card = replace(card, weights={"source": "random", "seed": 0})
    return NativeAdapter(card, device=device, dtype=dtype)


def _native(adapter) -> bool:
    from evalsuite.adapters.native import NativeAdapter

    return isinstance(adapter, NativeAdapter)


def set_path(adapter, path: str) -> str | None:
    """Put ``adapter`` on decode ``path``; returns why it cannot run here, or None."""
    from evalsuite.adapters.hf import HFAdapter
    from evalsuite.generation.engine import compiled_support, static_support

    cuda = adapter.device.type == "cuda"
    if _native(adapter):
        if path in ("graph", "compiled") and not cuda:
            return "needs CUDA"
        with adapter._autocast():  # graph safety may depend on the cache dtype
            support = static_support(adapter.model) if path != "eager" else None
            compiles = path == "compiled" and compiled_support(adapter.model)
        if path != "eager" and support is None:
            return f"{type(adapter.model).__name__} offers no static decoder"
        if path in ("graph", "compiled") and support != "graph":
            return f"{type(adapter.model).__name__}'s static step is not graph-safe here"
        if path == "compiled" and not compiles:
            return f"{type(adapter.model).__name__} offers no compiled step"
        adapter.decode_path = path
        return None
    if isinstance(adapter, HFAdapter):
        if path != "eager" and not cuda:
            return "needs CUDA"
        if path == "compiled":
            return "its graph path is the compiled one (static cache + torch.compile)"
        adapter.cache, adapter.compile = ("dynamic", False) if path == "eager" else ("static", path == "graph")
        return None
    return f"{type(adapter).__name__} has no decode paths" if path != "eager" else None


def step_weight_bytes(adapter) -> int:
    """Weight bytes one decode step reads: every parameter as stored, less the input embedding (a step gathers B
    rows of it) unless the LM head is the embedding."""
    model = adapter.model
    if _native(adapter):
        emb, tied = model.input_embedding.weight, bool(getattr(model.config, "tie_word_embeddings", False))
    else:
        emb, head = model.get_input_embeddings().weight, model.get_output_embeddings()
        tied = head is not None and head.weight.data_ptr() == emb.data_ptr()
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total - (0 if tied else emb.numel() * emb.element_size())


def _hf_kv_bytes(config, length: int, dtype: torch.dtype) -> int | None:
    """K and V of every layer at ``length`` for one sequence of a standard HF decoder; None if the config lacks the
    fields (not a plain attention model)."""
    layers, heads = getattr(config, "num_hidden_layers", None), getattr(config, "num_attention_heads", None)
    if not layers or not heads:
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * layers * kv_heads * head_dim * length * torch.empty((), dtype=dtype).element_size()


def state_bytes(adapter, length: int) -> int | None:
    """Decode-state bytes of one sequence after ``length`` tokens (None: unknown)."""
    if _native(adapter):
        return int(adapter.model.decode_state_size(length, adapter.dtype)["bytes"])
    return _hf_kv_bytes(adapter.config, length, adapter.dtype)


def cell_bytes(adapter, length: int, batch: int, new_tokens: int) -> int | None:
    """Estimated device bytes of a generate call (state at capacity, prefill activations, logits); None: unknown."""
    if _native(adapter):
        return batch * bytes_per_prompt(adapter.model, length, new_tokens, adapter.dtype)
    kv = _hf_kv_bytes(adapter.config, length + new_tokens, adapter.dtype)
    if kv is None:
        return None
    return batch * prompt_bytes(kv, length, adapter.config.hidden_size, adapter.vocab)


def free_bytes(device: torch.device) -> int | None:
    """Free memory of ``device``: CUDA's, or the host's available physical memory on a CPU (None: unknown)."""
    if device.type == "cuda":
        return free_device_bytes(device)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def measure_cell(adapter, length: int, batch: int, new_tokens: int, *, warmup: bool = True, seed: int = 0,
                 repeats: int = REPEATS) -> dict:  # fmt: skip
    """Time one (length, batch) cell on the adapter's current path (see the module docstring): the three calls
    ``repeats`` times over, each call's time the median of its repeats (one slow prefill or capture does not move
    the two-call rate)."""
    device = adapter.device
    gen = torch.Generator().manual_seed(seed + 7919 * length + batch)
    prompts = torch.randint(0, adapter.tokenizer.vocab_size, (batch, length), generator=gen).tolist()
    counts = (1, max(1, new_tokens // 2), new_tokens)
    configs = [GenerationConfig(max_new_tokens=k, stop_at_eos=False) for k in counts]
    if warmup:  # kernels compiled and autotuned, static caches compiled, for these shapes, outside the timings
        adapter.generate(prompts, configs[1])
        adapter.generate(prompts, configs[2])
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times: list[list[float]] = [[], [], []]  # per call kind, one wall time per repeat
    timers: list[StepTimer | None] = [None, None, None]  # the last repeat's, for our own models
    in_call, made = [], []

    for _ in range(repeats):
        for i, config in enumerate(configs):
            if hasattr(adapter, "step_timer"):
                adapter.step_timer = timers[i] = StepTimer()
            try:
                times[i].append(_timed(lambda config=config: made.append(adapter.generate(prompts, config)), device))
            finally:
                if hasattr(adapter, "step_timer"):
                    adapter.step_timer = None
            if i == 2 and timers[2] is not None and timers[2].ms_per_step is not None:
                in_call.append(timers[2].ms_per_step)
    t1, tm, tn = (statistics.median(t) for t in times)
    m = counts[1]
    step_s = max(tn - tm, 1e-9) / (new_tokens - m)
    rec = {"prefill_s": t1, "half_s": tm, "total_s": tn, "prefill_tokens_per_s": batch * length / t1}
    rec.update(decode_tokens_per_s=batch / step_s, ms_per_step=step_s * 1e3, call_overhead_s=tm - t1 - (m - 1) * step_s)
    rec.update(repeats=repeats, call_times_s={str(k): t for k, t in zip(counts, times, strict=True)})
    if in_call:  # the same steps timed inside the N-token calls (StepTimer), median over the repeats
        rec.update(ms_per_step_in_call=statistics.median(in_call), steps_in_call=timers[2].steps)
    if timers[0] is not None:  # where each call's time went: what differs between the calls the rate is taken from
        rec["phases_s"] = {str(k): t.phases for k, t in zip(counts, timers, strict=True)}
    rec["tokens_made"] = sum(len(g.token_ids) for g in made[-1])
    if device.type == "cuda":
        rec["peak_mem_mib"] = torch.cuda.max_memory_allocated(device) / 2**20
    return rec


def add_bound(rec: dict, weight_bytes: int, seq_state_bytes: int | None, bandwidth: float) -> None:
    """``bound_tokens_per_s`` and ``fraction_of_bound`` of a timed record (see the module docstring)."""
    rec.update(weight_bytes=weight_bytes, state_bytes=seq_state_bytes, copy_bytes_per_s=bandwidth)
    if seq_state_bytes is None:
        return
    step_s = (weight_bytes + rec["batch"] * seq_state_bytes) / bandwidth
    rec["bound_tokens_per_s"] = rec["batch"] / step_s
    if "decode_tokens_per_s" in rec:
        rec["fraction_of_bound"] = rec["decode_tokens_per_s"] / rec["bound_tokens_per_s"]
    if "ms_per_step_in_call" in rec:  # the steady step alone (the two-call difference carries one-off costs)
        rec["fraction_of_bound_in_call"] = rec["batch"] * 1e3 / rec["ms_per_step_in_call"] / rec["bound_tokens_per_s"]


def _key(r: dict) -> tuple:
    return r["model"], r["path"], r["length"], r["batch"]


def _load_previous(out: Path, params: dict) -> tuple[RunDir, list[dict]]:
    """The run directory ``out`` (claimed for these settings: an earlier run with other ``RESUME_KEYS`` values is a
    UserError) and the records of the cells it finished; cells that errored are left out so they run again."""
    resume = {k: params[k] for k in RESUME_KEYS}
    run = RunDir.claim(out, "bench-generate", config_hash(resume), resume, outputs=(JSON_NAME,))
    kept = [r for r in run.latest().values() if not str(r.get("status", "")).startswith("error")]
    return run, [{k: v for k, v in r.items() if k != "key"} for r in kept]


def bench_generate(out, *, models=DEFAULT_MODELS, lengths=DEFAULT_LENGTHS, batches=DEFAULT_BATCHES,
                   new_tokens: int = 128, paths=DEFAULT_PATHS, device: str = "auto", dtype: str | None = None,
                   weights: str = "random", copy_mib: int | None = None, warmup: bool = True, seed: int = 0,
                   repeats: int = REPEATS, verbose: bool = True) -> list[dict]:  # fmt: skip
    """The whole sweep; writes the JSON (as it goes), Markdown and PNG under ``out``; returns the records.

    ``dtype``: default bfloat16 on CUDA, float32 on a CPU. ``weights``: ``random`` (the cards' shapes, seed 0) or
    ``card`` (what each card names). ``copy_mib``: size of the bandwidth copy (default 1 GiB on CUDA, 256 MiB on a
    CPU). ``warmup``: one untimed full call per cell first. ``repeats``: timed repeats of each call (medians).
    """
    from evalsuite.bench.attention import env_info
    from evalsuite.runs.store import atomic_write_json
    from evalsuite.runtime import resolve_device

    bad = [p for p in paths if p not in PATHS]
    if bad:
        raise UserError(f"unknown path(s) {', '.join(bad)}; choose from {', '.join(PATHS)}")
    if weights not in ("random", "card"):
        raise UserError("--weights must be random or card")
    if new_tokens < 2:
        raise UserError("--new-tokens must be at least 2 (decode speed needs a step after the first token)")
    if not models or not lengths or not batches or min(lengths) < 1 or min(batches) < 1:
        raise UserError("give at least one model, and positive lengths and batch sizes")
    if repeats < 1:
        raise UserError("--repeats must be at least 1")
    dev = resolve_device(device)
    dtype = dtype or ("bfloat16" if dev.type == "cuda" else "float32")
    out = Path(out)
    env = env_info()
    env["device"] = env["device"] if dev.type == "cuda" else "cpu"
    params = dict(models=list(models), lengths=sorted(lengths), batches=sorted(batches), new_tokens=new_tokens,
                  paths=list(paths), dtype=dtype, weights=weights, device=env["device"], seed=seed,
                  warmup=warmup, repeats=repeats)  # fmt: skip
    run, records = _load_previous(out, params)
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
            what = (f"prefill {rec['prefill_tokens_per_s']:10.0f} tok/s  decode {rec['decode_tokens_per_s']:9.1f} tok/s"
                    if rec["status"] == "ok" else rec["status"])  # fmt: skip
            print(f"{rec['model']:20s} {rec['path']:6s} L={rec['length']:<6d} B={rec['batch']:<4d} {what}", flush=True)

    for spec in models:
        cells = [(p, L, B) for p in paths for L in sorted(lengths) for B in sorted(batches)]
        cells = [c for c in cells if (spec, *c) not in done]
        if not cells:
            continue
        try:
            adapter = load_model(spec, str(dev), dtype, weights)
        except Exception as exc:  # noqa: BLE001 -- a model that cannot load is a recorded cell status, not a crash
            for p, L, B in cells:
                add({"model": spec, "path": p, "length": L, "batch": B, "status": f"error: {exc}"[:500]})
            continue
        weight_bytes = step_weight_bytes(adapter)
        for path in dict.fromkeys(p for p, _, _ in cells):
            try:
                why = set_path(adapter, path)
            except Exception as exc:  # noqa: BLE001 -- e.g. a static decoder that fails to build: recorded
                why = f"{type(exc).__name__}: {exc}"[:300]
            oom_at: dict[int, int] = {}  # length -> smallest batch that ran out of memory
            for _, L, B in [c for c in cells if c[0] == path]:
                rec = {"model": spec, "name": adapter.name, "path": path, "length": L, "batch": B}
                rec["device"] = env["device"]
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
                        rec.update(
                            measure_cell(adapter, L, B, new_tokens, warmup=warmup, seed=seed, repeats=repeats),
                            status="ok",
                        )
                    except torch.OutOfMemoryError:
                        rec["status"], oom_at[L] = "oom", min(B, oom_at.get(L, B))
                    except Exception as exc:  # noqa: BLE001 -- one failing cell must not stop the sweep
                        rec["status"] = f"error: {type(exc).__name__}: {exc}"[:500]
                    if dev.type == "cuda":
                        torch.cuda.empty_cache()
                add_bound(rec, weight_bytes, state_bytes(adapter, L), bandwidth["bytes_per_s"])
                add(rec)
        del adapter
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    save()
    (out / MD_NAME).write_text(format_markdown(records, env, params) + "\n")
    plot_generate_bench(records, out / PNG_NAME, env)
    return records


def format_markdown(records, env: dict, params: dict) -> str:
    """One table per model: prefill and decode tokens/s, ms per step, the bound and the fraction of it."""
    bw = env.get("copy_bandwidth", {})
    lines = [f"# Generation benchmark\n\n{env.get('device')}, torch {env.get('torch')}, {params['dtype']}, "
             f"{params['weights']} weights, {params['new_tokens']} new tokens per call; copy bandwidth "
             f"{bw.get('bytes_per_s', 0) / 1e9:.1f} GB/s ({bw.get('copy_mib')} MiB copy)."]  # fmt: skip
    head = ["path", "length", "batch", "prefill tok/s", "decode tok/s", "ms/step", "ms/step in call", "bound tok/s",
            "of bound", "in call", "status"]  # fmt: skip
    for model in dict.fromkeys(r["model"] for r in records):
        lines += ["", f"## {model}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows = sorted((r for r in records if r["model"] == model), key=lambda r: (r["path"], r["length"], r["batch"]))
        for r in rows:

            def num(key, fmt, r=r):
                return format(r[key], fmt) if key in r else "-"

            def pct(key, r=r):
                return f"{100 * r[key]:.1f}%" if key in r else "-"

            cells = [r["path"], str(r["length"]), str(r["batch"]), num("prefill_tokens_per_s", ".0f"),
                     num("decode_tokens_per_s", ".1f"), num("ms_per_step", ".2f"), num("ms_per_step_in_call", ".2f"),
                     num("bound_tokens_per_s", ".0f"), pct("fraction_of_bound"), pct("fraction_of_bound_in_call"),
                     r["status"][:60]]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_generate_bench(records, path, env=None) -> None:
    """Per model: decode tokens/s vs prompt length (one line per path and batch, the bound dashed) above prefill
    tokens/s; log scales."""
    from matplotlib.figure import Figure

    ok = [r for r in records if r.get("status") == "ok"]
    models = list(dict.fromkeys(r["model"] for r in ok))
    if not models:
        return
    fig = Figure(figsize=(5.5 * len(models), 7.5))
    axes = fig.subplots(2, len(models), squeeze=False)
    batches = sorted({r["batch"] for r in ok})
    styles = dict(zip(PATHS, ("-", "-.", "--", ":"), strict=True))
    for col, model in enumerate(models):
        ax_d, ax_p = axes[0][col], axes[1][col]
        for i, B in enumerate(batches):
            color = f"C{i}"
            bound = {r["length"]: r for r in records
                     if r["model"] == model and r["batch"] == B and "bound_tokens_per_s" in r}  # fmt: skip
            bound = [bound[n] for n in sorted(bound)]
            if bound:
                ax_d.plot([r["length"] for r in bound], [r["bound_tokens_per_s"] for r in bound], ":", color=color,
                          alpha=0.6, label=f"bound B={B}")  # fmt: skip
            for p in PATHS:
                rs = sorted((r for r in ok if (r["model"], r["batch"], r["path"]) == (model, B, p)),
                            key=lambda r: r["length"])  # fmt: skip
                xs, style = [r["length"] for r in rs], dict(marker="o", color=color, label=f"{p} B={B}")
                if rs:
                    ax_d.plot(xs, [r["decode_tokens_per_s"] for r in rs], styles[p], **style)
                    ax_p.plot(xs, [r["prefill_tokens_per_s"] for r in rs], styles[p], **style)
        for ax, what in ((ax_d, "decode tokens/s"), (ax_p, "prefill tokens/s")):
            ax.set(xscale="log", yscale="log", xlabel="prompt length (tokens)", ylabel=what)
            ax.set_xscale("log", base=2)
            ax.grid(True, which="both", alpha=0.3)
        ax_d.set_title(model)
        ax_d.legend(fontsize=7)
    env = env or {}
    fig.suptitle(f"generate  {env.get('device', '')}  torch {env.get('torch', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> None:
    """``python -m evalsuite.bench.generate``: the same run without the CLI's dependencies."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output folder (JSON, Markdown, PNG); a rerun resumes")
    parser.add_argument("--model", action="append", help="card or hf:DIR, repeatable (default: fox-pro)")
    parser.add_argument("--lengths", type=int, nargs="+", default=list(DEFAULT_LENGTHS))
    parser.add_argument("--batches", type=int, nargs="+", default=list(DEFAULT_BATCHES))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--paths", nargs="+", default=list(DEFAULT_PATHS), choices=PATHS)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default=None, choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--weights", default="random", choices=("random", "card"))
    parser.add_argument("--copy-mib", type=int, default=None)
    parser.add_argument("--no-warmup", action="store_true")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="timed repeats of each call (medians)")
    args = parser.parse_args(argv)
    bench_generate(args.out, models=args.model or list(DEFAULT_MODELS), lengths=args.lengths, batches=args.batches,
                   new_tokens=args.new_tokens, paths=args.paths, device=args.device, dtype=args.dtype,
                   weights=args.weights, copy_mib=args.copy_mib, warmup=not args.no_warmup,
                   repeats=args.repeats)  # fmt: skip


if __name__ == "__main__":
    main()
