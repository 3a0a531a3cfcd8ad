"""Per-token loss plots in the style of the FoX paper's Figure 2.

Left panel: smoothed per-token loss L(i) against token index i. Right panel: cumulative perplexity
P(l) = exp(mean of L over the first l tokens) against context length l. A dashed vertical line marks
each model's training context length.

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
from matplotlib.ticker import FuncFormatter, MultipleLocator

from evalsuite.errors import UserError
from evalsuite.report.records import LOSS_CURVE_FILE, find_runs, load_loss_curve, load_run, run_labels
from evalsuite.runs.store import atomic_write_bytes

# The FoX paper's colours for its models (matched as card-name prefixes, so "fox-pro-tiny" gets C0).
PAPER_COLORS = {
    "fox-pro": 0,
    "transformer-pro": 1,
    "fox-llama": 2,
    "transformer-llama": 3,
    "mamba2": 4,
    "mamba-2": 4,
    "hgrn2": 8,
    "deltanet": 9,
}
N_COLORS = 10  # matplotlib's default cycle, "C0".."C9", is tab10
LINESTYLES = ("-", ":", "-.", (0, (5, 1)))  # repeats of one model (e.g. seeds) share a colour
K = 1024


@dataclass
class LossRun:
    """What the plot needs from one loss run directory."""

    run_dir: Path
    model: str
    train_length: int | None
    loss: np.ndarray


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


def model_colors(models: Sequence[str]) -> dict[str, str]:
    """A fixed model -> "C<k>" mapping.

    Known FoX-paper models keep the paper's colours; other models take the remaining slots in sorted
    name order, so a model's colour does not depend on the order runs are passed in.
    """
    colors: dict[str, str] = {}
    for model in set(models):
        slot = _paper_slot(model)
        if slot is not None:
            colors[model] = f"C{slot}"
    free = [k for k in range(N_COLORS) if f"C{k}" not in colors.values()] or list(range(N_COLORS))
    others = sorted(m for m in set(models) if m not in colors)
    for i, model in enumerate(others):
        colors[model] = f"C{free[i % len(free)]}"
    return colors


def _paper_slot(model: str) -> int | None:
    """The paper's colour slot for ``model`` by longest matching prefix (at a word boundary), if any."""
    name = model.lower()
    best = None
    for prefix, slot in PAPER_COLORS.items():
        boundary = len(name) == len(prefix) or (len(name) > len(prefix) and not name[len(prefix)].isalnum())
        if name.startswith(prefix) and boundary and (best is None or len(prefix) > len(best[0])):
            best = (prefix, slot)
    return None if best is None else best[1]


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
        labels: legend labels, one per run found (default: model name, plus run dir name on collisions).
        loss_ylim, ppl_ylim: y limits of the two panels (default: automatic).

    Returns:
        ``[png_path, pdf_path]``.
    """
    loaded = load_loss_runs(runs)
    if labels is None:
        labels = run_labels([r.model for r in loaded], [r.run_dir for r in loaded])
    elif len(labels) != len(loaded):
        raise UserError(f"got {len(labels)} labels for {len(loaded)} loss runs")
    start = max(int(start or 0), 0)

    fig = Figure(figsize=(6.4 * 2 + 2, 4.8))
    ax_loss, ax_ppl = fig.subplots(1, 2)
    colors = model_colors([r.model for r in loaded])
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
    for ax, xlabel, ylabel, ylim in (
        (ax_loss, "Token index $i$", "Loss $L(i)$", loss_ylim),
        (ax_ppl, "Context length $l$", "Perplexity $P(l)$", ppl_ylim),
    ):
        _draw_train_lengths(ax, loaded, colors, lo=start, hi=x_max)
        _format_x_axis(ax, x_max)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        if ylim is not None:
            ax.set_ylim(*ylim)

    handles, legend_labels = ax_loss.get_legend_handles_labels()
    fig.tight_layout()
    # Below both panels; bbox_inches="tight" on save grows the canvas to fit it.
    fig.legend(
        handles,
        legend_labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(4, len(handles)),
        frameon=False,
    )
    return save_figure(fig, out_path_stem)


def _draw_train_lengths(ax, runs: list[LossRun], colors: dict[str, str], lo: int, hi: int) -> None:
    """Dashed line at each distinct training length within [lo, hi].

    With one distinct length the line is black; with several, each line takes the colour of its model
    (black if models of different colours share that length).
    """
    by_length: dict[int, set[str]] = {}
    for run in runs:
        if run.train_length is not None:
            by_length.setdefault(run.train_length, set()).add(colors[run.model])
    for length, line_colors in sorted(by_length.items()):
        if not lo <= length <= hi:
            continue
        color = line_colors.pop() if len(by_length) > 1 and len(line_colors) == 1 else "black"
        ax.axvline(length, color=color, linestyle="--", linewidth=2.5 if color == "black" else 1.5)


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
