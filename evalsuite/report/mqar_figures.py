"""The MQAR figures (:mod:`evalsuite.report.mqar` writes them with the tables): accuracy against width and against
decoding-state size, best over learning rates, one panel per (sequence length, kv pairs) setting (Zoology,
arXiv:2312.04927, Figure 2; the GSA paper, arXiv:2409.07146, Figure 3a), and the training curves of each point's
best cell. Every model keeps its colour and name of :mod:`evalsuite.report.palette`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter, NullLocator
from matplotlib.transforms import offset_copy

from evalsuite.errors import UserError
from evalsuite.report.palette import ModelStyle, legend_below, model_styles, separate, spread, value_linestyles
from evalsuite.report.plots import save_figure

SETTING = ["length", "num_kv_pairs"]


def _setting_title(length: int, kv: int) -> str:
    return f"T = {length}, {kv} kv pairs"


def human_bytes(n: float, _pos=None) -> str:
    """``1536 -> "1.5 KiB"`` (axis labels)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"


def _styles(frame: pd.DataFrame) -> dict[str, ModelStyle]:
    """:func:`model_styles` of the models of ``frame`` (a :func:`best_over_lr` or :func:`records_frame`), matched to
    their families by the records' ``architecture`` where the frame has that column, else by name."""
    architectures = {}
    if "architecture" in frame:
        architectures = {m: a for m, a in zip(frame["model"], frame["architecture"], strict=True) if isinstance(a, str)}
    return model_styles(frame["model"].unique(), architectures)


# Models of equal accuracy (several at 1.0, or at 0.0) stay visible: each model's line is moved DODGE points sideways
# by its place among the panel's models, and at each width accuracies within SEPARATE_TOLERANCE of each other are
# drawn SEPARATE_STEP apart.
SEPARATE_STEP, SEPARATE_TOLERANCE, DODGE = 0.01, 0.002, 3.0
SPREAD_NOTE = "(equal accuracies drawn slightly apart, so that each model shows)"


def _accuracy_axis(ax, drawn: Iterable[float]) -> None:
    """Limits holding 0, 1 and every drawn point with room for its marker (none clipped at the top), and a dotted
    line at 0.99, the accuracy above which a cell counts as solved."""
    drawn = list(drawn)
    ax.set_ylim(min([0.0, *drawn]) - 0.05, max([1.0, *drawn]) + 0.05)
    ax.axhline(0.99, color="0.5", linestyle=":", linewidth=0.8, zorder=0)


def _separated(rows: pd.DataFrame, x: str) -> pd.Series:
    """The accuracy of each row as drawn: rows of one ``x`` value whose accuracies are nearly equal moved apart
    (:func:`~evalsuite.report.palette.separate`), in model order where they tie."""
    drawn = rows["accuracy"].astype(float)
    for _, g in rows.sort_values("model", kind="stable").groupby(x, sort=False):
        drawn[g.index] = g["accuracy"].to_numpy() + separate(list(g["accuracy"]), SEPARATE_STEP, SEPARATE_TOLERANCE)
    return drawn


def _dodged(ax, k: int, n: int):
    """The data transform of ``ax`` moved sideways for the ``k``-th of ``n`` models (:data:`DODGE` points apart).
    Matplotlib's autoscaling skips artists drawn with another transform: the caller sets the limits."""
    return offset_copy(ax.transData, fig=ax.figure, x=spread(n, DODGE)[k], y=0.0, units="points")


def _panels(best: pd.DataFrame, width: float = 4.2):
    """A figure with one panel per setting; at least 6 inches wide, so that a legend below one panel has room."""
    settings = [tuple(s) for s in best[SETTING].drop_duplicates().sort_values(SETTING).itertuples(index=False)]
    fig = Figure(figsize=(max(6.0, width * len(settings) + 0.6), 4.2))
    axes = np.atleast_1d(fig.subplots(1, len(settings), sharey=True, squeeze=False)[0])
    return fig, list(zip(settings, axes, strict=True))


def _legend(fig: Figure, axes, title: str | None = None) -> None:
    """One legend below all panels, each label once, wrapped into as many columns as the figure's width holds."""
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    legend_below(fig, [handles[lab] for lab in labels], labels, title=title, title_fontsize=8)


def plot_accuracy_vs_dmodel(best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """Zoology-style: x = d_model (log2), y = best accuracy over lr, one panel per setting. PNG + PDF."""
    return save_figure(accuracy_vs_dmodel_figure(best), out_stem)


def accuracy_vs_dmodel_figure(best: pd.DataFrame) -> Figure:
    """The figure of :func:`plot_accuracy_vs_dmodel`: one line per model in its fixed colour (a family's variants:
    another marker and line style), shifted a little so that models of equal accuracy stay visible."""
    fig, panels = _panels(best)
    styles = _styles(best)
    drawn_all = []
    for (length, kv), ax in panels:
        rows = best[(best["length"] == length) & (best["num_kv_pairs"] == kv)]
        rows = rows.assign(drawn=_separated(rows, "d_model"))
        groups = list(rows.groupby("model", sort=True))
        for k, (model, g) in enumerate(groups):
            g, style = g.sort_values("d_model"), styles[model]
            ax.plot(g["d_model"], g["drawn"], color=style.color, marker=style.marker, linestyle=style.linestyle,
                    markersize=5, linewidth=1.3, label=style.label, transform=_dodged(ax, k, len(groups)))  # fmt: skip
        drawn_all += list(rows["drawn"])
        ds = sorted(rows["d_model"].unique())
        ax.set_xscale("log", base=2)
        ax.set_xlim(ds[0] / 2**0.3, ds[-1] * 2**0.3)
        ax.xaxis.set_major_locator(FixedLocator(ds))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(d) for d in ds])
        ax.set_title(_setting_title(length, kv))
        ax.set_xlabel("Model dimension")
        ax.grid(alpha=0.3)
    _accuracy_axis(panels[0][1], drawn_all)  # the panels share y
    panels[0][1].set_ylabel("Accuracy (best over learning rates)")
    _legend(fig, [ax for _, ax in panels], title=SPREAD_NOTE)
    return fig


def plot_accuracy_vs_state(best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """x = decoding-state bytes (log), y = best accuracy, one panel per setting; points labelled by d_model.

    Filled markers: a fixed recurrent state. Hollow markers, dashed lines: the KV cache of an attention model at
    the sequence length (it keeps growing with length). Models without a known state are left out.
    """
    return save_figure(accuracy_vs_state_figure(best), out_stem)


def accuracy_vs_state_figure(best: pd.DataFrame) -> Figure:
    """The figure of :func:`plot_accuracy_vs_state`."""
    known = best[best["state_bytes"].notna()]
    if known.empty:
        raise UserError("no MQAR records with a state size to plot")
    fig, panels = _panels(known)
    styles = _styles(known)
    drawn_all = []
    for (length, kv), ax in panels:
        rows = known[(known["length"] == length) & (known["num_kv_pairs"] == kv)]
        rows = rows.assign(drawn=_separated(rows, "state_bytes"))
        groups = list(rows.groupby("model", sort=True))
        for k, (model, g) in enumerate(groups):
            g, style = g.sort_values("state_bytes"), styles[model]
            cache = (g["state_kind"] == "kv-cache").all()
            label = f"{style.label} (KV cache)" if cache else style.label
            look = dict(linestyle="--", markerfacecolor="white") if cache else dict(linestyle=style.linestyle)
            ax.plot(g["state_bytes"], g["drawn"], marker=style.marker, markersize=5, linewidth=1.3, color=style.color,
                    label=label, transform=_dodged(ax, k, len(groups)), **look)  # fmt: skip
        drawn_all += list(rows["drawn"])
        # one d_model label per width, above its best point (the panel's top leaves room for it)
        for d, g in rows.groupby("d_model"):
            top = g.loc[g["drawn"].idxmax()]
            ax.annotate(f"d={d}", (top["state_bytes"], top["drawn"]), textcoords="offset points", xytext=(0, 6),
                        ha="center", va="bottom", fontsize=7, color="0.3")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlim(rows["state_bytes"].min() / 2**0.4, rows["state_bytes"].max() * 2**0.4)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.tick_params(axis="x", labelrotation=30)  # byte labels a factor 2 apart would overlap
        ax.set_title(_setting_title(length, kv))
        ax.set_xlabel("Decoding state (bytes; attention: its KV cache at T)")
        ax.grid(alpha=0.3)
    _accuracy_axis(panels[0][1], [*drawn_all, max(drawn_all) + 0.06])  # room for the d labels above the highest
    panels[0][1].set_ylabel("Accuracy (best over learning rates)")
    _legend(fig, [ax for _, ax in panels], title=SPREAD_NOTE)
    return fig


def plot_training_curves(records: Iterable[dict], best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """One column per (setting, d_model): test accuracy, training loss and the forget gates' time scale (mean over
    layers of ``-1 / mean log f``, log scale; models with data-dependent gates: FoX, GSA) against the optimizer
    step, for the best-lr cell of every model (``best``: :func:`best_over_lr`). PNG + PDF."""
    return save_figure(training_curves_figure(records, best), out_stem)


def training_curves_figure(records: Iterable[dict], best: pd.DataFrame) -> Figure:
    """The figure of :func:`plot_training_curves`: a block of rows (accuracy, loss, gates) per setting and a column
    per width; a model's colour and marker as in the other MQAR figures, its learning rate as the line style; the
    legend names each model once and each learning rate once."""
    chosen = {(r["model"], r["length"], r["num_kv_pairs"], r["d_model"], r["lr"]) for _, r in best.iterrows()}
    cells = [{**r, "model": _cell_model(r)} for r in records if r.get("history")]
    cells = [r for r in cells if (r["model"], r.get("length"), r.get("num_kv_pairs"), r.get("d_model"),
                                  r.get("lr")) in chosen]  # fmt: skip
    if not cells:
        raise UserError("no MQAR records with a training history to plot")
    settings = sorted({(r["length"], r["num_kv_pairs"]) for r in cells})
    widths = sorted({r["d_model"] for r in cells})
    has_gates = any(h.get("eval_forget_time_scale") for r in cells for h in r["history"])
    rows = 3 if has_gates else 2
    fig = Figure(figsize=(4.2 * len(widths) + 0.6, 2.8 * rows * len(settings)))
    axes = fig.subplots(rows * len(settings), len(widths), squeeze=False)
    styles = _styles(best)
    lr_styles = value_linestyles(r["lr"] for r in cells)
    for block, (length, kv) in enumerate(settings):
        for col, d in enumerate(widths):
            column = axes[block * rows : (block + 1) * rows, col]
            ran = [r for r in cells if (r["length"], r["num_kv_pairs"], r["d_model"]) == (length, kv, d)]
            if not ran:
                for ax in column:
                    ax.set_axis_off()
                continue
            _training_column(column, sorted(ran, key=lambda r: r["model"]), styles, lr_styles)
            column[0].set_title(f"{_setting_title(length, kv)}, d={d}")
        axes[block * rows][0].set_ylabel("Test accuracy")
        axes[block * rows + 1][0].set_ylabel("Training loss")
        if has_gates:
            axes[block * rows + 2][0].set_ylabel("Forget time scale (tokens)")
    used = sorted({r["model"] for r in cells})
    handles = [Line2D([], [], color=styles[m].color, marker=styles[m].marker, markersize=4) for m in used]
    handles += [Line2D([], [], color="0.3", linestyle=lr_styles[lr]) for lr in lr_styles]
    labels = [styles[m].label for m in used] + [f"lr {lr:.2g}" for lr in lr_styles]
    legend_below(fig, handles, labels)
    return fig


def _cell_model(record: dict) -> str:
    """The name a cell's model has in the tables and in ``best``: a recipe variant's cell is ``"model [variant]"``,
    as :func:`~evalsuite.tasks.mqar_summary.records_frame` names it."""
    return f"{record['model']} [{record['variant']}]" if record.get("variant") else record["model"]


def _training_column(axes, cells: list[dict], styles: dict[str, ModelStyle], lr_styles: dict) -> None:
    """One (setting, width) of the training curves: accuracy, loss and (with a third axes) the gates' time scale
    per step of each cell in ``cells``."""
    for r in cells:
        style = styles[r["model"]]
        look = dict(color=style.color, linestyle=lr_styles[r["lr"]])
        evals = [h for h in r["history"] if "eval_accuracy" in h]
        axes[0].plot([h["step"] for h in evals], [h["eval_accuracy"] for h in evals], marker=style.marker,
                     markersize=3, **look)  # fmt: skip
        axes[1].plot([h["step"] for h in r["history"]], [h["loss"] for h in r["history"]], **look)
        gates = [(h["step"], np.mean(h["eval_forget_time_scale"])) for h in evals
                 if h.get("eval_forget_time_scale") and None not in h["eval_forget_time_scale"]]  # fmt: skip
        if gates and len(axes) > 2:
            axes[2].plot(*zip(*gates, strict=True), marker=style.marker, markersize=3, **look)
    axes[0].set_ylim(-0.05, 1.05)  # markers at 0 and 1 whole
    for ax in axes[1:]:
        ax.set_yscale("log")
        ax.yaxis.set_minor_formatter(NullFormatter())  # a log axis spanning less than a decade labels its minor ticks
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("Optimizer step")
