"""What every benchmark shares: the run's device and software, timing, relative errors and fla's peer ops.

* :func:`env_info` -- device, versions and git commit, stored in every benchmark file.
* :func:`time_ms` -- (median, p20, p80) milliseconds of a call: ``triton.testing.do_bench`` on CUDA, a
  ``perf_counter`` loop elsewhere; :func:`graph_ms` -- device time per call inside a captured CUDA graph (what a
  decode step's graph replays); :func:`wall_seconds` -- one synchronised wall-clock call.
* :func:`peak_memory_mib` -- the peak extra device memory of one call.
* :func:`rel_error` and :func:`errors` -- ``|out - ref| / |ref|`` (Frobenius) and the max abs error.
* :func:`fla_op` / :func:`fla_version` -- fla's ops when the package imports (the peers are optional).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

QUANTILES = [0.5, 0.2, 0.8]  # median, p20, p80


class Unavailable(Exception):
    """A provider that cannot run here (missing package or device); recorded, not raised."""


def env_info() -> dict:
    """Device, software versions and git commit (the suite's provenance), stored in every record."""
    from evalsuite.runs.provenance import git_commit, versions

    info = {**versions(), "git_commit": git_commit(), "cuda": torch.version.cuda}
    info["device"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return info


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
