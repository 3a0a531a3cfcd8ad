"""NIAH summaries and heatmaps in the style of the FoX paper's Figure 4 (arXiv:2503.02130, §4.3).

Heatmap: needle depth (rows, 0 % at the top) x context length (columns), the mean score of each cell,
colours from red (#F0496E) through yellow (#EBB839) to green (#0CD79F) over the scorer's range (1-10 for
the judge and the offline score, 0-1 for match rates and accuracies), one panel per run and subtask,
and a dashed black line at the model's training length (placed between columns by linear interpolation;
FoX draws it through the nearest column). Runs without a depth grid (the DRT tests place needles at random) get
rows for bins of where the earliest needle fell, from the samples' ``needle_starts``. Summary: the mean over cells
within (length <= training length) and beyond it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError
from evalsuite.metrics.cells import within_beyond
from evalsuite.report.plots import save_figure
from evalsuite.report.records import find_runs, load_run, run_labels
from evalsuite.runs.store import RESULTS_FILE

COLORS = ("#F0496E", "#EBB839", "#0CD79F")  # FoX's red -> yellow -> green
SCALES = {"judge": (1, 10), "score": (1, 10)}  # every other metric is a 0-1 rate
NIAH_TASKS = ("niah", "drt-passkey")  # the needle tests: text NIAH and the DRT token-level passkey
TITLES = {"easy": "Easy", "standard": "Standard", "2hop": "2-hop", "1hop": "1-hop control", "2hop-drt": "2-hop (DRT)"}
METRIC_NAMES = {
    "judge": "judge score (1-10)",
    "score": "match score (1-10)",
    "match": "match rate",
    "recall": "key-word recall",
    "bridge_stated": "bridge stated",
    "accuracy": "scored-token accuracy (DRT: passkey first, 2-hop last)",
    "answer_token_acc": "answer-token accuracy",
    "answer_exact": "answer exact (teacher-forced)",
}


def load_niah_runs(paths: Sequence[Path | str]) -> list[tuple[Path, dict]]:
    """(run dir, results.json) for every finished NIAH run under ``paths``."""
    runs = []
    for run_dir in find_runs(paths):
        if (run_dir / RESULTS_FILE).is_file():
            results = load_run(run_dir)
            if results.get("task") in NIAH_TASKS:
                runs.append((run_dir, results))
    if not runs:
        raise UserError(f"no finished NIAH runs (results.json with task 'niah') under: {', '.join(map(str, paths))}")
    return runs


def default_metric(results: dict) -> str:
    """The judge when the run was judged, else the offline score; DRT runs: the scored token's accuracy."""
    metrics = {r["metric"] for r in results.get("records", []) if r.get("value") is not None}
    for metric in ("judge", "score", "accuracy"):
        if metric in metrics:
            return metric
    return "score"


def heatmap_matrix(records: Sequence[dict], subtask: str, metric: str) -> tuple[np.ndarray, list, list[int]]:
    """(values ``[depths, lengths]`` with NaN for empty cells, depths, lengths) of one subtask's metric."""
    rows = [r for r in records if r["subtask"] == subtask and r["metric"] == metric]
    lengths = sorted({r["length"] for r in rows})
    depths = sorted({r["depth"] for r in rows}, key=lambda d: -1 if d is None else d)
    values = np.full((len(depths), len(lengths)), np.nan)
    for r in rows:
        if r["value"] is not None:
            values[depths.index(r["depth"]), lengths.index(r["length"])] = r["value"]
    return values, depths, lengths


NEEDLE_BINS = 5  # DRT runs place needles at random: rows of the heatmap are bins of the needle's position


def needle_depth_matrix(
    run_dir: Path, subtask: str, metric: str, bins: int = NEEDLE_BINS
) -> tuple[np.ndarray, list[str], list[int]] | None:
    """For runs whose needles sit at random positions (the DRT tests: no depth grid), the mean of ``metric`` per
    (bin of the earliest needle's position as a share of the prompt, length) from the samples in
    ``records.jsonl``: (values ``[bins, lengths]``, NaN where a bin is empty; row labels; lengths). None when the
    samples carry no needle positions."""
    path = run_dir / "records.jsonl"
    if not path.is_file():
        return None
    import json

    samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    samples = [s for s in samples if s.get("subtask") == subtask and s.get("needle_starts")
               and s.get("prompt_tokens") and metric in s.get("scores", {})]  # fmt: skip
    if not samples:
        return None
    lengths = sorted({s["length"] for s in samples})
    sums, counts = np.zeros((bins, len(lengths))), np.zeros((bins, len(lengths)))
    for s in samples:
        depth = min(s["needle_starts"]) / s["prompt_tokens"]
        row, col = min(int(depth * bins), bins - 1), lengths.index(s["length"])
        sums[row, col] += s["scores"][metric]
        counts[row, col] += 1
    with np.errstate(invalid="ignore"):
        values = sums / counts  # NaN where empty
    labels = [f"{100 * i // bins}-{100 * (i + 1) // bins}%" for i in range(bins)]
    return values, labels, lengths


def line_position(lengths: Sequence[int], train_length: int | None) -> float | None:
    """Column coordinate of the training length (interpolated between column centres), or None outside."""
    if train_length is None or not lengths or not lengths[0] <= train_length <= lengths[-1]:
        return None
    return float(np.interp(train_length, lengths, np.arange(len(lengths))))


def plot_niah(
    runs: Sequence[Path | str], out_stem: Path | str, metric: str | None = None, ncols: int = 4
) -> tuple[list[Path], object]:
    """Heatmaps of every NIAH run under ``runs`` plus the within/beyond summary table.

    Writes ``<stem>.png``, ``<stem>.pdf``, ``<stem>_summary.csv`` and ``<stem>_summary.md``.
    Returns (written paths, the summary DataFrame).
    """
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    from evalsuite.report.tables import write_table

    loaded = load_niah_runs(runs)
    labels = run_labels([r["model"] for _, r in loaded], [d for d, _ in loaded])
    panels = []
    for (run_dir, results), label in zip(loaded, labels, strict=True):
        chosen = metric or default_metric(results)
        subtask_order = list(dict.fromkeys(r["subtask"] for r in results["records"]))
        for subtask in subtask_order:
            panels.append((run_dir, results, subtask, chosen, label))
    if not any(r["metric"] == p[3] for p in panels for r in p[1]["records"]):
        raise UserError(f"no NIAH records with metric {metric!r}")

    cmap = LinearSegmentedColormap.from_list("fox_niah", COLORS)
    ncols = max(1, min(ncols, len(panels)))
    nrows = -(-len(panels) // ncols)
    fig = Figure(figsize=(6 * ncols, 5.6 * nrows), layout="constrained")  # no title over the row above's labels
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False)).ravel()
    shared_scale = len({SCALES.get(p[3], (0, 1)) for p in panels}) == 1
    image = None
    for ax, (run_dir, results, subtask, chosen, label) in zip(axes, panels, strict=False):
        values, depths, lengths = heatmap_matrix(results["records"], subtask, chosen)
        labels, ylabel = ["random" if d is None else f"{d:g}" for d in depths], "Depth Percent"
        binned = needle_depth_matrix(run_dir, subtask, chosen) if depths == [None] else None
        if depths == [None]:  # needles at random positions: rows are bins of where the (earliest) needle fell
            ylabel = ""
        if binned is not None:
            (values, labels, lengths), ylabel = binned, "Needle position (% of the prompt)"
        vmin, vmax = SCALES.get(chosen, (0, 1))
        image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
        ax.set_xticks(range(len(lengths)), [str(x) for x in lengths], rotation=45, ha="right")
        ax.set_yticks(range(len(labels)), labels)
        ax.set_xticks(np.arange(len(lengths) + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(len(labels) + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="white", linewidth=0.5)
        ax.tick_params(which="minor", length=0)
        x = line_position(lengths, results.get("train_length"))
        if x is not None:
            ax.axvline(x, color="black", linestyle="--", linewidth=4)
        ax.set_title(f"{label}, {TITLES.get(subtask, subtask)}")
        ax.set_xlabel("Document Length")
        ax.set_ylabel(ylabel)
        if not shared_scale:  # e.g. a 1-10 score next to a 0-1 accuracy: each panel its own scale
            fig.colorbar(image, ax=ax, shrink=0.8, label=METRIC_NAMES.get(chosen, chosen))
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    if image is not None and shared_scale:
        names = {METRIC_NAMES.get(p[3], p[3]) for p in panels}
        label = names.pop() if len(names) == 1 else "score"
        fig.colorbar(image, ax=list(axes[: len(panels)]), shrink=0.8, label=label)

    paths = save_figure(fig, out_stem)
    table = summary_table(loaded, metric)
    paths += write_table(table, f"{out_stem}_summary", formats=("csv", "md"))
    return paths, table


def summary_table(loaded: Sequence[tuple[Path, dict]], metric: str | None = None):
    """One row per (run, subtask): the chosen metric's mean within / beyond the training length."""
    import pandas as pd

    rows = []
    labels = run_labels([r["model"] for _, r in loaded], [d for d, _ in loaded])
    for (_, results), label in zip(loaded, labels, strict=True):
        chosen = metric or default_metric(results)
        for s in within_beyond(results["records"], results.get("train_length")):
            if s["metric"] == chosen:
                rows.append(
                    {
                        "model": results["model"],
                        "subtask": s["subtask"],
                        "metric": chosen,
                        "train_length": results.get("train_length"),
                        "within": s["within"],
                        "beyond": s["beyond"],
                        "all": s["all"],
                        "run": label,
                    }
                )
    return pd.DataFrame(rows, columns=["model", "subtask", "metric", "train_length", "within", "beyond", "all", "run"])
