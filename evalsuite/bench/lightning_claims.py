"""The Lightning Attention paper's speed and memory claims (arXiv:2405.17381 §5.1, Figure 4) tested on
``evalsuite bench linear`` records.

§5.1: Lightning's time grows linearly with the sequence length in the forward and the backward pass, Vanilla's (norm
linear attention as the quadratic left product in PyTorch) and FlashAttention-2's quadratically; Vanilla runs out of
memory; Lightning's memory follows Flash2's trend but is lower. The paper prints no values, so each claim is checked
on the shape of our curves:

* the series (:func:`figure4_series`): Lightning (``lightning_triton``, or ``lightning_chunked`` off CUDA), Vanilla
  (``lightning_vanilla``) and Flash2, for which SDPA causal on PyTorch's FlashAttention-2 backend stands in
  (``sdpa_flash``, else ``sdpa_causal``: whichever backend PyTorch picks);
* growth (:func:`loglog_slope`): the least-squares slope of log ms against log T over the longer half of a series'
  lengths (the short ones are launch-bound); below 1.5 reads as linear, 1.5 or more as quadratic. It needs a fixed
  batch across T (``bench linear --batch``): at fixed tokens per call a quadratic op grows linearly;
* memory (:func:`memory_mib`): the forward's peak beyond its inputs; the backward's, the tensors the retained forward
  holds (``saved_mib``) plus the backward's own peak.
"""

from __future__ import annotations

import math

import numpy as np

from evalsuite.bench.linear_ops import SDPA, SDPA_FLASH, VANILLA

ROLES = {"Lightning": ("lightning_triton", "lightning_chunked"), "Vanilla": (VANILLA,), "Flash2": (SDPA_FLASH, SDPA)}
LABELS = {
    "lightning_triton": "Lightning",
    "lightning_chunked": "Lightning (PyTorch chunked twin)",
    VANILLA: "Vanilla (PyTorch left product)",
    SDPA_FLASH: "Flash2 (stand-in: SDPA causal, flash backend)",
    SDPA: "Flash2 (stand-in: SDPA causal, any backend)",
}
MODES = ("fwd", "bwd")
QUADRATIC = 1.5  # a log-log slope at or above this reads as quadratic growth, below it as linear


def figure4_series(records) -> dict[str, dict]:
    """``{role: {"provider", "label", "fwd": [records by T], "bwd": [...]}}`` for each role with timing records of
    the ``fwd`` / ``bwd`` modes (every status: an out-of-memory record marks where a series stops)."""
    timing = [r for r in records if r.get("kind") == "op" and r.get("mode") in MODES]
    out = {}
    for role, providers in ROLES.items():
        provider = next((p for p in providers if any(r["provider"] == p for r in timing)), None)
        if provider is not None:
            out[role] = {"provider": provider, "label": LABELS[provider]}
            for mode in MODES:
                out[role][mode] = sorted((r for r in timing if (r["provider"], r["mode"]) == (provider, mode)),
                                         key=lambda r: r["T"])  # fmt: skip
    return out


def memory_mib(rec: dict) -> float | None:
    """A record's memory for the figure: the peak beyond the inputs; in ``bwd`` with the retained forward's tensors."""
    if "peak_mem_mib" not in rec:
        return None
    return rec["peak_mem_mib"] + (rec.get("saved_mib", 0.0) if rec["mode"] == "bwd" else 0.0)


def loglog_slope(points) -> tuple[float, int, int] | None:
    """``(slope, first T, last T)`` of log y against log T fitted over the longer half of ``points`` ``[(T, y)]``
    (at least two), or None with fewer than two."""
    pts = sorted(points)
    if len(pts) < 2:
        return None
    tail = pts[-max(2, math.ceil(len(pts) / 2)) :]
    slope = np.polyfit(np.log([t for t, _ in tail]), np.log([y for _, y in tail]), 1)[0]
    return float(slope), tail[0][0], tail[-1][0]


def _growth(series, role, want_quadratic) -> tuple[str, bool | None]:
    """What the fitted slopes of one role show, and whether that is the growth the paper states."""
    if role not in series:
        return "not measured", None
    parts, verdicts = [], []
    for mode in MODES:
        ok = [r for r in series[role][mode] if "ms" in r]
        if len({r["B"] for r in ok}) > 1:
            return "B changes with T (fixed tokens per call): rerun with a fixed --batch", None
        fit = loglog_slope([(r["T"], r["ms"]) for r in ok])
        if fit is not None:
            parts.append(f"{mode} slope {fit[0]:.2f} over T = {fit[1]}-{fit[2]}")
            verdicts.append((fit[0] >= QUADRATIC) == want_quadratic)
    if not parts:
        return "fewer than two lengths timed", None
    return "; ".join(parts), all(verdicts)


def _vanilla_oom(series) -> tuple[str, bool | None]:
    if "Vanilla" not in series:
        return "not measured", None
    parts = []
    for mode in MODES:
        oom = [r["T"] for r in series["Vanilla"][mode] if r.get("status", "").startswith("oom")]
        ran = [r["T"] for r in series["Vanilla"][mode] if "ms" in r]
        if oom:
            parts.append(f"{mode}: out of memory from T = {min(oom)}" + (f" (ran up to {max(ran)})" if ran else ""))
        elif ran:
            parts.append(f"{mode}: ran at every length, up to T = {max(ran)}")
    if not parts:
        return "not measured", None
    return "; ".join(parts), any("out of memory" in p for p in parts)


def _memory_below(series) -> tuple[str, bool | None]:
    if "Lightning" not in series or "Flash2" not in series:
        return "not measured", None
    parts, below = [], []
    for mode in MODES:
        ours = {r["T"]: memory_mib(r) for r in series["Lightning"][mode] if memory_mib(r) is not None}
        theirs = {r["T"]: memory_mib(r) for r in series["Flash2"][mode] if memory_mib(r) is not None}
        common = sorted(set(ours) & set(theirs))
        if common:
            n = sum(ours[t] < theirs[t] for t in common)
            parts.append(f"{mode}: below at {n} of {len(common)} lengths (at T = {common[-1]}: "
                         f"{ours[common[-1]] / 1024:.2f} vs {theirs[common[-1]] / 1024:.2f} GiB)")  # fmt: skip
            below.append(n == len(common))
    if not parts:
        return "no memory measured (a CUDA run records it)", None
    return "; ".join(parts), all(below)


def check_claims(records) -> list[dict]:
    """The §5.1 claims against ``records``: per claim ``claim`` (the paper's words), ``ours`` (what the records
    show) and ``agrees`` (True, False, or None where the records do not say)."""
    series = figure4_series(records)
    checks = [
        ("Lightning Attention shows remarkable linear growth of processing time in both forward and backward passes",
         _growth(series, "Lightning", False)),
        ("Vanilla and Flash2 exhibit quadratic growth (Vanilla)", _growth(series, "Vanilla", True)),
        ("Vanilla and Flash2 exhibit quadratic growth (Flash2)", _growth(series, "Flash2", True)),
        ("Vanilla tends to rapidly exhaust memory resources", _vanilla_oom(series)),
        ("Lightning Attention shows a similar trend to Flash2 but requires less memory", _memory_below(series)),
    ]  # fmt: skip
    return [{"claim": claim, "ours": ours, "agrees": agrees} for claim, (ours, agrees) in checks]


def verdict(agrees: bool | None) -> str:
    return {True: "agrees", False: "disagrees", None: "not measured"}[agrees]


def claims_markdown(records) -> str:
    """A Markdown table of :func:`check_claims`, with the series it read."""
    series = figure4_series(records)
    lines = ["### Lightning paper, Figure 4 (§5.1): the claims against these records", "",
             "Series: " + "; ".join(f"{role} = `{s['provider']}`" for role, s in series.items()) + ".", "",
             "| claim (arXiv:2405.17381 §5.1) | ours | verdict |", "| --- | --- | --- |"]  # fmt: skip
    lines += [f"| {c['claim']} | {c['ours']} | {verdict(c['agrees'])} |" for c in check_claims(records)]
    return "\n".join(lines)
