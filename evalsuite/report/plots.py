"""Per-token loss plots in the style of the FoX paper's Figure 2.

Left panel: smoothed per-token loss L(i) against position i (in tokens, or bytes for a byte-level model). Right
panel: cumulative perplexity P(l) = exp(mean of L over the first l tokens) against context length l. A dashed
vertical line marks each model's training context length. Colours and names come from
:mod:`evalsuite.report.palette`, the same for a model in every figure.

Figures are built with ``matplotlib.figure.Figure`` rather than pyplot: no global figure registry and no
backend switch, so plotting is safe in notebooks, threads and tests (PNG/PDF rendering uses Agg).
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MultipleLocator

from evalsuite.errors import UserError
from evalsuite.report.palette import LINESTYLES, display_name, legend_below, model_color
from evalsuite.report.records import (
    LOSS_CURVE_FILE,
    card_architecture,
    find_runs,
    length_unit,
    load_loss_curve,
    load_run,
    run_labels,
)
from evalsuite.runs.store import atomic_write_bytes

K = 1024


@dataclass
class LossRun:
    """What the plot needs from one loss run directory: ``loss`` is L(i), shape ``[positions]``."""

    run_dir: Path
    model: str
    train_length: int | None
    loss: np.ndarray
    architecture: str | None = None  # the card's, when the model had one (its colour and name in the figure)
    unit: str = "tokens"  # what a position counts: "tokens", or "bytes" for a byte-level tokenizer


def moving_average(x: np.ndarray, window: int = 101) -> np.ndarray:
    """Centred moving average over ``[i - window//2, i + window//2]``, clipped at the array edges.

    Near the edges the window shrinks (no padding), so every output is a mean of real values. For an even
    ``window`` the span is ``window + 1`` values, as the half-width ``window//2`` is used on both sides.
    Runs in O(n) with a cumulative sum (float64).
    """
    if window < 1:
        raise UserError(f"smoothing window must be >= 1, got {window}")
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    half = window // 2
    csum = np.concatenate(([0.0], np.cumsum(x)))
    idx = np.arange(n)
    lo = np.maximum(idx - half, 0)
    hi = np.minimum(idx + half + 1, n)
    return (csum[hi] - csum[lo]) / (hi - lo)


def cumulative_perplexity(loss: np.ndarray) -> np.ndarray:
    """P(l) = exp((1/l) * sum_{i<l} L(i)) for l = 1..n (FoX §4.2); not smoothed."""
    loss = np.asarray(loss, dtype=np.float64)
    return np.exp(np.cumsum(loss) / np.arange(1, loss.shape[0] + 1))


def load_loss_runs(paths: Sequence[Path | str]) -> list[LossRun]:
    """Load each loss run under ``paths`` (run dirs or folders of them), in ``find_runs`` order."""
    run_dirs = [run for run in find_runs(paths) if (run / LOSS_CURVE_FILE).is_file()]
    if not run_dirs:
        raise UserError(f"no loss runs (with {LOSS_CURVE_FILE}) found under: {', '.join(map(str, paths))}")
    runs = []
    for run_dir in run_dirs:
        meta = load_run(run_dir)
        loss, count = load_loss_curve(run_dir)
        # Positions no window reached carry no information; keep the prefix that has data.
        covered = np.flatnonzero(count > 0)
        if covered.size == 0:
            raise UserError(f"{run_dir / LOSS_CURVE_FILE} has no positions with count > 0")
        train_length = meta.get("train_length")
        runs.append(
            LossRun(
                run_dir=run_dir,
                model=str(meta.get("model") or run_dir.name),
                train_length=int(train_length) if train_length is not None else None,
                loss=loss[: covered[-1] + 1],
                architecture=card_architecture(meta),
                unit=length_unit(meta),
            )
        )
    return runs


def plot_loss(
    runs: list[Path],
    out_path_stem: Path,
    window: int = 101,
    start: int | None = None,
    labels: Sequence[str] | None = None,
    *,
    loss_ylim: tuple[float, float] | None = None,
    ppl_ylim: tuple[float, float] | None = None,
) -> list[Path]:
    """Plot L(i) (smoothed with ``window``) and P(l) for loss runs; save ``<stem>.png`` and ``<stem>.pdf``.

    Args:
        runs: loss run directories, or folders containing them.
        out_path_stem: output path without suffix.
        window: moving-average window for L(i) (FoX uses 101; 1001 in its Figure 7).
        start: first token index shown (FoX Figure 2 uses 128); smoothing uses the whole curve.
        labels: legend labels, one per run found (default: the model's display name, plus what tells its runs
            apart when it has several).
        loss_ylim, ppl_ylim: y limits of the two panels (default: automatic).

    Returns:
        ``[png_path, pdf_path]``.
    """
    loaded = load_loss_runs(runs)
    fig = loss_figure(loaded, window, start, labels, loss_ylim=loss_ylim, ppl_ylim=ppl_ylim)
    return save_figure(fig, out_path_stem)


def loss_figure(
    loaded: Sequence[LossRun],
    window: int = 101,
    start: int | None = None,
    labels: Sequence[str] | None = None,
    *,
    loss_ylim: tuple[float, float] | None = None,
    ppl_ylim: tuple[float, float] | None = None,
) -> Figure:
    """The figure of :func:`plot_loss` for loaded runs: one colour per model (:mod:`evalsuite.report.palette`),
    repeated runs of a model told apart by line style, a legend below both panels wrapped into columns."""
    if labels is None:
        names = [display_name(r.model, r.architecture) for r in loaded]
        labels = run_labels(names, [r.run_dir for r in loaded])
    elif len(labels) != len(loaded):
        raise UserError(f"got {len(labels)} labels for {len(loaded)} loss runs")
    start = max(int(start or 0), 0)

    fig = Figure(figsize=(6.4 * 2 + 2, 4.8))
    ax_loss, ax_ppl = fig.subplots(1, 2)
    colors = {r.model: model_color(r.model, r.architecture) for r in loaded}
    seen: dict[str, int] = {}
    for run, label in zip(loaded, labels, strict=True):
        style = LINESTYLES[seen.get(run.model, 0) % len(LINESTYLES)]
        seen[run.model] = seen.get(run.model, 0) + 1
        smoothed = moving_average(run.loss, window)
        ppl = cumulative_perplexity(run.loss)
        index = np.arange(run.loss.shape[0])  # token index i (0-based)
        length = index + 1  # context length l
        shown = index >= start
        kwargs = dict(color=colors[run.model], linestyle=style, label=label)
        ax_loss.plot(index[shown], smoothed[shown], **kwargs)
        ax_ppl.plot(length[length >= max(start, 1)], ppl[length >= max(start, 1)], **kwargs)

    x_max = max(r.loss.shape[0] for r in loaded)
    unit = " / ".join(sorted({r.unit for r in loaded}))
    for ax, xlabel, ylabel, ylim in (
        (ax_loss, f"Position $i$ ({unit})", "Loss $L(i)$ (nats)", loss_ylim),
        (ax_ppl, f"Context length $l$ ({unit})", "Perplexity $P(l)$", ppl_ylim),
    ):
        drawn = _draw_train_lengths(ax, loaded, colors, lo=start, hi=x_max)
        _format_x_axis(ax, x_max)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim is not None:
            ax.set_ylim(*ylim)

    ax_ppl.set_yscale("log")  # P(l) falls over orders of magnitude from l = 1
    handles, legend_labels = ax_loss.get_legend_handles_labels()
    if drawn:  # one entry for the dashed lines: in their colour, or grey for lines each in its model's colour
        one = len(drawn) == 1
        handles.append(Line2D([], [], color=next(iter(drawn)) if one else "0.4", linestyle="--"))
        legend_labels.append("training length" if one else "training length (in its model's colour)")
    legend_below(fig, handles, legend_labels)
    return fig


def _draw_train_lengths(ax, runs: Sequence[LossRun], colors: dict[str, str], lo: int, hi: int) -> set[str]:
    """Dashed line at each distinct training length within [lo, hi]; returns the colours drawn.

    With one distinct length the line is black; with several, each line takes the colour of its model
    (black if models of different colours share that length).
    """
    by_length: dict[int, set[str]] = {}
    for run in runs:
        if run.train_length is not None:
            by_length.setdefault(run.train_length, set()).add(colors[run.model])
    drawn = set()
    for length, line_colors in sorted(by_length.items()):
        if not lo <= length <= hi:
            continue
        color = line_colors.pop() if len(by_length) > 1 and len(line_colors) == 1 else "black"
        ax.axvline(length, color=color, linestyle="--", linewidth=2.5 if color == "black" else 1.5)
        drawn.add(color)
    return drawn


def _format_x_axis(ax, x_max: int) -> None:
    """Ticks in units of 1k = 1024 ("0", "8k", ...) for long contexts, at most ~9 ticks."""
    if x_max < 4 * K:
        return
    step = K * 2 ** max(0, math.ceil(math.log2(x_max / 8 / K)))
    ax.xaxis.set_major_locator(MultipleLocator(step))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _: "0" if x == 0 else f"{x / K:g}k"))
    ax.set_xlim(0, x_max)


def save_figure(fig: Figure, stem: Path | str) -> list[Path]:
    """Render ``<stem>.png`` (dpi 150) and ``<stem>.pdf`` in memory, then write each atomically."""
    paths = []
    for fmt in ("png", "pdf"):
        buffer = io.BytesIO()
        # No creation date in the PDF, so identical inputs give identical files.
        metadata = {"CreationDate": None} if fmt == "pdf" else None
        fig.savefig(buffer, format=fmt, dpi=150, bbox_inches="tight", metadata=metadata)
        paths.append(atomic_write_bytes(f"{stem}.{fmt}", buffer.getvalue()))
    return paths
