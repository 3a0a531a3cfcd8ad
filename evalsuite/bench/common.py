"""What every benchmark shares: the run's device and software, timing, relative errors and fla's peer ops.

* :func:`env_info` -- device, versions and git commit, stored in every benchmark file;
  :func:`random_weights_adapter` -- a card's shapes with random weights, in the benchmarks' dtype.
* :func:`time_ms` -- (median, p20, p80) milliseconds of a call: ``triton.testing.do_bench`` on CUDA, a
  ``perf_counter`` loop elsewhere; :func:`graph_ms` -- device time per call inside a captured CUDA graph (what a
  decode step's graph replays); :func:`wall_seconds` -- one synchronised wall-clock call.
* :func:`interleaved_ms` -- several providers timed in turns in one process (A B A B ...), and
  :func:`time_providers` on top of it (build, warm up, peak memory, then the interleaved rounds);
  :func:`ratio_fields` -- the median and spread of the per-round ratios of two providers' samples
  (:func:`ratio_text` prints them).
* :func:`backward_call` -- the backward pass alone, re-run on one retained forward graph.
* :func:`peak_memory_mib` -- the peak extra device memory of one call.
* :func:`rel_error` and :func:`errors` -- ``|out - ref| / |ref|`` (Frobenius) and the max abs error.
* :func:`fla_op` / :func:`fla_version` -- fla's ops when the package imports (the peers are optional).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch

QUANTILES = [0.5, 0.2, 0.8]  # median, p20, p80


class Unavailable(Exception):
    """A provider that cannot run here (missing package or device); recorded, not raised."""


def env_info() -> dict:
    """Device, software versions and git commit (the suite's provenance), stored in every record; on CUDA also
    whether kernels launch with programmatic dependent launch (``pdl``: Hopper and newer unless ``EVALSUITE_PDL=0``),
    which changes decode-step times."""
    from evalsuite.kernels import triton_utils
    from evalsuite.runs.provenance import git_commit, versions

    info = {**versions(), "git_commit": git_commit(), "cuda": torch.version.cuda}
    cuda = torch.cuda.is_available()
    info["device"] = torch.cuda.get_device_name() if cuda else "cpu"
    info["pdl"] = cuda and triton_utils.triton_installed() and triton_utils.pdl(torch.device("cuda"))
    return info


def random_weights_adapter(card: str, device: str, **options):
    """A :class:`~evalsuite.adapters.native.NativeAdapter` of ``card``'s shapes with random weights (seed 0), bf16 on
    CUDA and float32 elsewhere; ``options``: the adapter's other keyword arguments."""
    from dataclasses import replace

    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.cards import load_card

    spec = replace(load_card(card), weights={"source": "random", "seed": 0})
    dtype = "bfloat16" if torch.device(device).type == "cuda" else "float32"
    return NativeAdapter(spec, device=device, dtype=dtype, **options)


def sync(device) -> None:
    """Wait for ``device``'s queued work (a no-op off CUDA)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def wall_seconds(fn, device) -> float:
    """Wall seconds of one ``fn()``, the device synchronised before and after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def time_ms(fn, leaves=(), device="cuda", warmup=25, rep=100, max_calls=100) -> tuple[float, float, float]:
    """(median, p20, p80) ms of ``fn()``; the grads of ``leaves`` are reset between calls. ``fn`` should have run
    once already (compiled, autotuned).

    CUDA: :func:`triton.testing.do_bench` with ``warmup`` / ``rep`` in ms, raised for slow calls to at least 3 / 15
    calls. Elsewhere: a ``perf_counter`` loop of at least 3 calls, more while ``rep`` ms last (at most ``max_calls``).
    """
    leaves = list(leaves)
    if torch.device(device).type == "cuda":
        import triton.testing

        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        one = start.elapsed_time(stop)
        warmup, rep = max(warmup, 3 * one), max(rep, 15 * one)
        ms, lo, hi = triton.testing.do_bench(fn, warmup=warmup, rep=rep, grad_to_none=leaves, quantiles=QUANTILES)
        return ms, lo, hi
    times, stop = [], time.perf_counter() + rep / 1e3
    while len(times) < 3 or (time.perf_counter() < stop and len(times) < max_calls):
        for t in leaves:
            t.grad = None
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    ms, lo, hi = np.quantile(times, QUANTILES)
    return float(ms), float(lo), float(hi)


def graph_ms(fn, reps: int = 50, replays: int = 5) -> float:
    """Device ms of one ``fn()`` (CUDA): ``reps`` calls captured in one CUDA graph, the median of ``replays``
    replays divided by ``reps`` -- the kernels' time as a decode step's graph runs them, without the host's launch
    work that dominates a small call timed alone."""
    fn()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture (the torch.cuda.graphs recipe)
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / reps)
    return sorted(times)[len(times) // 2]


FLUSH_BYTES = 256 * 2**20  # larger than any GPU's L2 (do_bench's choice), zeroed before each timed CUDA call


class Call(NamedTuple):
    """One provider's timed call: ``fn()`` runs it, ``leaves`` get their ``.grad`` reset before each call, ``fields``
    go into its record (what the builder measured, e.g. a retained forward's memory)."""

    fn: Callable[[], object]
    leaves: tuple = ()
    fields: dict = {}


def _timed_calls(fn, leaves, n, device, clock, flush) -> list[float]:
    """ms of each of ``n`` back-to-back calls: CUDA events around each (the L2 flushed before it), else ``clock``."""
    if flush is not None:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for start, end in events:
            for t in leaves:
                t.grad = None
            flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    times = []
    for _ in range(n):
        for t in leaves:
            t.grad = None
        t0 = clock()
        fn()
        times.append((clock() - t0) * 1e3)
    return times


def interleaved_ms(calls: dict[str, Callable[[], object]], leaves: dict[str, tuple] | None = None, *, rounds: int = 10,
                   block_ms: float = 10.0, warmup_ms: float = 25.0, max_block: int = 100, device="cuda",
                   clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:  # fmt: skip
    """Per-call ms of several providers timed in turns in one process: ``{name: [one sample per round]}``.

    Each provider first runs one timed call (its block size: enough calls for ``block_ms``, 1 to ``max_block``) and
    ``warmup_ms`` of untimed ones. Then each of ``rounds`` rounds times one block of every provider in the order of
    ``calls`` (A B A B ...); a sample is the median per-call ms of its block. A single op's median moves by tens of
    percent between processes on a shared GPU (clocks, neighbours), so two providers' medians from separate runs
    give a noisy ratio; samples of the same round see the same conditions, and the ratio of a round's pair
    (:func:`ratio_fields`) cancels what drifts between rounds. CUDA: events around each call with the L2 flushed
    before it, as ``triton.testing.do_bench`` does; elsewhere ``clock`` (seconds) around each call.
    """
    leaves = leaves or {}
    cuda = torch.device(device).type == "cuda"
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device) if cuda and calls else None
    sizes = {}
    for name, fn in calls.items():
        one = _timed_calls(fn, leaves.get(name, ()), 1, device, clock, flush)[0]
        n_warm = min(max_block, int(warmup_ms / max(one, 1e-6)))
        _timed_calls(fn, leaves.get(name, ()), n_warm, device, clock, flush)
        sizes[name] = max(1, min(max_block, round(block_ms / max(one, 1e-6))))
    samples: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            block = _timed_calls(fn, leaves.get(name, ()), sizes[name], device, clock, flush)
            samples[name].append(float(np.median(block)))
    return samples


def ratio_fields(name: str, ours: list[float], peer: list[float]) -> dict:
    """``{name: median, name_p20, name_p80, name_pairs}`` of the per-round ratios ``ours[i] / peer[i]`` of two
    providers' :func:`interleaved_ms` samples (not the ratio of their medians: each pair shares its round's
    conditions)."""
    ratios = np.asarray(ours, dtype=float) / np.asarray(peer, dtype=float)
    mid, lo, hi = np.quantile(ratios, QUANTILES)
    return {name: float(mid), f"{name}_p20": float(lo), f"{name}_p80": float(hi), f"{name}_pairs": len(ratios)}


def ratio_text(rec: dict, name: str) -> str:
    """``1.21x [1.18-1.25]``: a record's ratio ``name`` (:func:`ratio_fields`) with its p20-p80 spread, or ``-``."""
    if name not in rec:
        return "-"
    spread = f" [{rec[f'{name}_p20']:.2f}-{rec[f'{name}_p80']:.2f}]" if f"{name}_p20" in rec else ""
    return f"{rec[name]:.2f}x{spread}"


def _failure(exc: BaseException) -> str:
    """The status of a provider that did not run: ``unavailable[: why]``, ``oom`` or ``error: Type: message``."""
    if isinstance(exc, Unavailable):
        return f"unavailable: {exc}" if str(exc) else "unavailable"
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    return f"error: {type(exc).__name__}: {exc}"[:500]


def time_providers(builders: dict[str, Callable[[], Call]], *, device, rounds: int = 10, block_ms: float = 10.0,
                   warmup_ms: float = 25.0) -> tuple[dict[str, dict], dict[str, list[float]]]:  # fmt: skip
    """Build each provider's :class:`Call` in turn, run it once (compile, autotune), take its peak extra memory
    (CUDA), then time the ones that ran with :func:`interleaved_ms`.

    Returns ``(fields, samples)``: per provider its record fields -- ``status`` ("ok", "oom", "unavailable: ...",
    "error: ..."), and when ok ``ms`` / ``ms_p20`` / ``ms_p80`` over the rounds' samples, ``samples_ms``, ``rounds``,
    ``peak_mem_mib`` (CUDA) and the builder's fields -- and the samples of the providers that ran. A provider that
    fails is recorded, not raised; the ones built earlier stay in memory while later ones build, so a caller puts a
    provider that may fill the device last.
    """
    cuda = torch.device(device).type == "cuda"
    fields: dict[str, dict] = {}
    ready: dict[str, Call] = {}
    for name, build in builders.items():
        call = None
        try:
            call = build()
            call.fn()
            fields[name] = dict(call.fields)
            if cuda:
                fields[name]["peak_mem_mib"] = peak_memory_mib(call.fn, call.leaves)
            ready[name] = call
        except Exception as exc:  # noqa: BLE001 -- one failing provider must not stop the others
            fields[name] = {"status": _failure(exc)}
        if name not in ready and cuda:  # past the except block: its traceback no longer holds the tensors
            del call
            torch.cuda.empty_cache()
    try:
        samples = interleaved_ms({n: c.fn for n, c in ready.items()}, {n: c.leaves for n, c in ready.items()},
                                 rounds=rounds, block_ms=block_ms, warmup_ms=warmup_ms, device=device)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 -- e.g. out of memory with every provider's inputs held at once
        status = _failure(exc)
        for name in ready:
            fields[name] = {"status": f"{status} (interleaved timing)"}
        return fields, {}
    for name, times in samples.items():
        mid, lo, hi = np.quantile(times, QUANTILES)
        fields[name] = {"status": "ok", "ms": float(mid), "ms_p20": float(lo), "ms_p80": float(hi),
                        "samples_ms": times, "rounds": len(times), **fields[name]}  # fmt: skip
    return fields, samples


def backward_call(forward: Callable[[], torch.Tensor], leaves, grad_out: torch.Tensor, device) -> Call:
    """The backward pass alone: ``forward()`` runs once here and its graph is kept; each call is
    ``torch.autograd.grad(out, leaves, grad_out, retain_graph=True)``, the same backward kernels on the same saved
    tensors every time (the returned gradients are not accumulated into ``.grad``, so nothing is reset between
    calls). ``fields``: ``saved_mib``, the memory the forward left allocated (its output and the tensors autograd
    saved for the backward; CUDA), which a backward needs besides its own peak."""
    leaves = tuple(leaves)
    cuda = torch.device(device).type == "cuda"
    before = torch.cuda.memory_allocated(device) if cuda else 0
    out = forward()
    fields = {"saved_mib": (torch.cuda.memory_allocated(device) - before) / 2**20} if cuda else {}

    def fn():
        return torch.autograd.grad(out, leaves, grad_out, retain_graph=True)

    return Call(fn, (), fields)


def peak_memory_mib(fn, leaves) -> float:
    """Peak memory one call allocates beyond its inputs (MiB, CUDA); gradients of the inputs count."""
    for t in leaves:
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    for t in leaves:
        t.grad = None
    return peak / 2**20


def rel_error(out, ref) -> float:
    """``|out - ref| / |ref|`` (Frobenius, float64; the absolute error where ref is 0); inf if out is not finite."""
    out, ref = out.detach().double(), ref.detach().double()
    if not torch.isfinite(out).all():
        return math.inf
    den = ref.norm()
    return float((out - ref).norm() / den) if den > 0 else float((out - ref).norm())


def errors(out, ref) -> dict:
    """``{"rel": rel_error(out, ref), "max_abs": max |out - ref|}``."""
    diff = out.detach().double() - ref.detach().double()
    return {"rel": rel_error(out, ref), "max_abs": float(diff.abs().max()) if diff.numel() else 0.0}


def fla_version() -> str | None:
    """fla's version, or None where it does not import."""
    try:
        import fla
    except Exception:  # noqa: BLE001 -- any import failure means fla is not usable here
        return None
    return getattr(fla, "__version__", "unknown")


def fla_op(name: str):
    """``fla.ops.<module>.<fn>`` for ``name = "module.fn"``, or None when fla does not import."""
    module, fn = name.split(".")
    try:
        mod = __import__(f"fla.ops.{module}", fromlist=[fn])
    except Exception:  # noqa: BLE001 -- missing package, CUDA/triton mismatch: skip the provider
        return None
    return getattr(mod, fn, None)


def kernel_table(prof, calls: int, cuda: bool, top: int | None = 40) -> tuple[float, list[dict]]:
    """``(device µs per call, rows)`` of a ``torch.profiler`` run over ``calls`` calls: the kernels (CUDA) or leaf
    ops (CPU; each op's self time) by time, the ``top`` longest (None: all) as ``{"kernel", "calls_per_call",
    "us_per_call"}``."""
    self_us = (lambda e: e.self_device_time_total) if cuda else (lambda e: e.self_cpu_time_total)
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    kernels = [e for e in prof.key_averages() if e.device_type == kind and self_us(e) > 0]
    total = sum(self_us(e) for e in kernels) / calls
    rows = [{"kernel": e.key, "calls_per_call": e.count / calls, "us_per_call": self_us(e) / calls}
            for e in sorted(kernels, key=lambda e: -self_us(e))[:top]]  # fmt: skip
    return total, rows


def format_kernel_rows(rows: list[dict], total_us: float, unit: str = "call") -> list[str]:
    """Text lines of :func:`kernel_table`'s rows: name, launches and µs per ``unit``, share of ``total_us``."""
    lines = [f"{'kernel':<100} {'n/' + unit:>10} {'us/' + unit:>9} {'share':>6}"]
    for r in rows:
        lines.append(f"{r['kernel'][:100]:<100} {r['calls_per_call']:>10.2f} {r['us_per_call']:>9.1f} "
                     f"{r['us_per_call'] / total_us:>6.1%}")  # fmt: skip
    return lines
