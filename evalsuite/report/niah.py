"""NIAH summaries and heatmaps in the style of the FoX paper's Figure 4 (arXiv:2503.02130, §4.3).

Heatmap: needle depth (rows, 0 % at the top) x context length (columns), the mean score of each cell,
colours from red (#F0496E) through yellow (#EBB839) to green (#0CD79F) over the scorer's range (1-10 for
the judge and the offline score, 0-1 for match rates and accuracies), one panel per run and subtask titled with the
model's display name, on a grid sized to the panel count, and a dashed black line between the last column within the
model's training length and the first beyond it (FoX draws it through the nearest column, which hides on which side
that column lies). The x axis counts tokens, or bytes for a byte-level tokenizer. Runs without a depth grid (the DRT
tests place needles at random) get rows for bins of where the earliest needle fell, from the samples'
``needle_starts``. Summary: the mean over cells within (length <= training length) and beyond it.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError
from evalsuite.metrics.cells import within_beyond
from evalsuite.report.palette import display_name
from evalsuite.report.plots import save_figure
from evalsuite.report.records import card_architecture, find_runs, length_unit, load_run, run_labels
from evalsuite.runs.store import RESULTS_FILE

COLORS = ("#F0496E", "#EBB839", "#0CD79F")  # FoX's red -> yellow -> green
SCALES = {"judge": (1, 10), "score": (1, 10)}  # every other metric is a 0-1 rate
NIAH_TASKS = ("niah", "drt-passkey")  # the needle tests: text NIAH and the DRT token-level passkey
TITLES = {
    "easy": "NIAH, easy",
    "standard": "NIAH, standard",
    "2hop": "NIAH, 2-hop",
    "1hop": "NIAH, 1-hop control",
    "2hop-drt": "2-hop passkey (DRT)",
    "passkey-drt": "Passkey (DRT)",
}
METRIC_NAMES = {
    "judge": "Score (1–10, LLM judge)",
    "score": "Score (1–10: 10 = needle stated, 1 = not)",
    "match": "Needle stated (share of samples)",
    "recall": "Needle's key words stated (share)",
    "bridge_stated": "Bridge town stated (share of samples)",
    "accuracy": "Scored token right (share of samples)",
    "answer_token_acc": "Answer tokens right (share)",
    "answer_exact": "Whole answer right (share of samples)",
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
    """Column coordinate of the training-length line: the boundary between the last column within the training
    length (length <= ``train_length``, as the summary counts it) and the first beyond it, so the line runs between
    two column centres and cuts no column; None when the training length is unknown or every column lies on one
    side of it."""
    if train_length is None:
        return None
    within = sum(1 for n in lengths if n <= train_length)
    return within - 0.5 if 0 < within < len(lengths) else None


@dataclass(frozen=True)
class Panel:
    """One heatmap: a run's subtask under one metric; ``title`` is what the figure shows above it."""

    run_dir: Path
    results: dict
    subtask: str
    metric: str
    title: str


def niah_panels(loaded: Sequence[tuple[Path, dict]], metric: str | None = None) -> list[Panel]:
    """A panel per (run, subtask), titled with the model's display name above the subtask's name; where one model
    has several runs of one subtask, the name adds what tells those runs apart (:func:`run_labels`)."""
    cells = []  # (run dir, results, subtask, metric, display name)
    for run_dir, results in loaded:
        chosen = metric or default_metric(results)
        name = display_name(results["model"], card_architecture(results))
        subtasks = dict.fromkeys(r["subtask"] for r in results["records"])
        cells += [(run_dir, results, subtask, chosen, name) for subtask in subtasks]
    if not any(r["metric"] == c[3] for c in cells for r in c[1]["records"]):
        raise UserError(f"no NIAH records with metric {metric!r}")
    groups: dict[tuple[str, str], list[int]] = {}
    for i, (_, _, subtask, _, name) in enumerate(cells):
        groups.setdefault((name, subtask), []).append(i)
    titles = {}
    for (name, subtask), members in groups.items():
        labels = run_labels([name] * len(members), [cells[i][0] for i in members])
        for i, label in zip(members, labels, strict=True):
            titles[i] = f"{textwrap.fill(label, 56)}\n{TITLES.get(subtask, subtask)}"
    return [Panel(*cell[:4], titles[i]) for i, cell in enumerate(cells)]


def panel_grid(fig, n: int, max_cols: int = 4) -> list:
    """``n`` axes in rows of at most ``max_cols``, the columns as few as keep the rows full (5 panels: 3 + 2, not
    4 + 1), a short last row centred: no empty slot. Returns the axes in reading order."""
    nrows = -(-n // max(1, max_cols))
    ncols = -(-n // nrows)
    grid = fig.add_gridspec(nrows, 2 * ncols)  # half-width columns, so a short row can be centred
    axes = []
    for row in range(nrows):
        in_row = min(ncols, n - row * ncols)
        offset = ncols - in_row
        axes += [fig.add_subplot(grid[row, offset + 2 * i : offset + 2 * i + 2]) for i in range(in_row)]
    return axes


def niah_figure(loaded: Sequence[tuple[Path, dict]], metric: str | None = None, max_cols: int = 4):
    """The heatmaps of :func:`plot_niah`: one panel per run and subtask on a grid sized to their count, one colour
    bar per scale."""
    from matplotlib.colors import LinearSegmentedColormap
    from matplotlib.figure import Figure

    panels = niah_panels(loaded, metric)
    cmap = LinearSegmentedColormap.from_list("fox_niah", COLORS)
    nrows = -(-len(panels) // max(1, max_cols))
    ncols = -(-len(panels) // nrows)
    fig = Figure(figsize=(6 * ncols, 5.6 * nrows), layout="constrained")  # no title over the row above's labels
    axes = panel_grid(fig, len(panels), max_cols)
    shared_scale = len({SCALES.get(p.metric, (0, 1)) for p in panels}) == 1
    image = None
    for ax, panel in zip(axes, panels, strict=True):
        image = _draw_panel(ax, panel, cmap)
        if not shared_scale:  # e.g. a 1-10 score next to a 0-1 accuracy: each panel its own scale
            fig.colorbar(image, ax=ax, shrink=0.8, label=metric_label(panel.metric))
    if shared_scale:
        names = {metric_label(p.metric) for p in panels}
        fig.colorbar(image, ax=axes, shrink=0.8, label=names.pop() if len(names) == 1 else "score")
    return fig


def _draw_panel(ax, panel: Panel, cmap):
    """One heatmap on ``ax``: depth (or needle-position bins) x length, a dashed line at the training length."""
    values, depths, lengths = heatmap_matrix(panel.results["records"], panel.subtask, panel.metric)
    labels, ylabel = ["random" if d is None else f"{d:g}" for d in depths], "Needle depth (%)"
    binned = needle_depth_matrix(panel.run_dir, panel.subtask, panel.metric) if depths == [None] else None
    if depths == [None]:  # needles at random positions: rows are bins of where the (earliest) needle fell
        ylabel = ""
    if binned is not None:
        (values, labels, lengths), ylabel = binned, "Needle position (% of the prompt)"
    vmin, vmax = SCALES.get(panel.metric, (0, 1))
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto", interpolation="nearest")
    ax.set_xticks(range(len(lengths)), [str(x) for x in lengths], rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xticks(np.arange(len(lengths) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(labels) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=0.5)
    ax.tick_params(which="minor", length=0)
    train_length = panel.results.get("train_length")
    x = line_position(lengths, train_length)
    if x is not None:
        ax.axvline(x, color="black", linestyle="--", linewidth=4)
    trained = f"; training length {train_length:,}{' (dashed)' if x is not None else ''}" if train_length else ""
    ax.set_title(panel.title)
    ax.set_xlabel(f"Context length ({length_unit(panel.results)}){trained}")
    ax.set_ylabel(ylabel)
    return image


def metric_label(metric: str) -> str:
    """The colour bar's label for ``metric``: what is scored and on which scale."""
    return METRIC_NAMES.get(metric, metric)


def plot_niah(
    runs: Sequence[Path | str], out_stem: Path | str, metric: str | None = None, ncols: int = 4
) -> tuple[list[Path], object]:
    """Heatmaps of every NIAH run under ``runs`` (at most ``ncols`` panels a row) plus the within/beyond summary.

    Writes ``<stem>.png``, ``<stem>.pdf``, ``<stem>_summary.csv`` and ``<stem>_summary.md``.
    Returns (written paths, the summary DataFrame).
    """
    from evalsuite.report.tables import write_table

    loaded = load_niah_runs(runs)
    paths = save_figure(niah_figure(loaded, metric, ncols), out_stem)
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
