"""MQAR figures and tables from sweep records (``records.jsonl``, one line per trained cell).

* accuracy vs d_model, best over learning rates, one panel per (sequence length, kv pairs) setting and one
  line per model: Zoology's Figure 2 and the GSA paper's Figure 3(a);
* accuracy vs decoding-state size (log bytes): the recall-memory trade-off of the Zoology/Based plots. An
  attention model has no fixed state; its point is its KV cache at the sequence length (hollow markers);
* the best accuracy per model and d_model (CSV / Markdown / LaTeX), a long table with the best learning rate,
  state size, steps and training time of every point, and a table of every cell (the cost of the whole sweep);
* for sweeps with recipe variants or several seeds, the ablation table: per model, variant and width, the best
  accuracy over learning rates as mean / min / max over seeds, how many seeds solved the task and in how many steps;
* training curves of each point's best cell: test accuracy, training loss and, for FoX, the forget gates' mean
  memory time scale against the step (which models learn, how fast, and how open their gates are).

The best-over-learning-rate logic itself lives with the task (:mod:`evalsuite.tasks.mqar_summary`), which writes
the same numbers into ``results.json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

from evalsuite.errors import UserError
from evalsuite.report.plots import model_colors, save_figure
from evalsuite.report.records import find_runs
from evalsuite.report.tables import write_table
from evalsuite.runs.store import RECORDS_FILE, read_jsonl
from evalsuite.tasks.mqar_summary import POINT, best_cell_per_seed, best_over_lr, records_frame

__all__ = ["POINT", "ablation_table", "best_over_lr", "best_table", "load_mqar", "records_frame", "write_mqar_report"]

SETTING = ["length", "num_kv_pairs"]


def load_mqar(paths: Iterable[Path | str]) -> pd.DataFrame:
    """:func:`records_frame` of every run under ``paths``; a cell recorded twice (same config hash) keeps its
    last record."""
    paths = list(paths)
    frames = [records_frame(read_jsonl(run / RECORDS_FILE), run) for run in find_runs(paths)]
    frames = [f for f in frames if not f.empty]
    if not frames:
        raise UserError(f"no MQAR records found under: {', '.join(map(str, paths))}")
    df = pd.concat(frames, ignore_index=True).drop_duplicates("config_hash", keep="last")
    return df.reset_index(drop=True)


def best_table(best: pd.DataFrame) -> pd.DataFrame:
    """Wide table: one row per model, one column per (setting,) d_model, best accuracy over learning rates."""
    settings = best[SETTING].drop_duplicates()
    single = len(settings) == 1

    def column(row) -> str:
        d = f"d={row['d_model']}"
        return d if single else f"T={row['length']} kv={row['num_kv_pairs']} {d}"

    labelled = best.assign(column=best.apply(column, axis=1))
    order = list(dict.fromkeys(labelled.sort_values([*SETTING, "d_model"])["column"]))
    wide = labelled.pivot_table(index="model", columns="column", values="accuracy", aggfunc="max")
    wide = wide.reindex(columns=order)
    wide.columns.name = None
    return wide


def _setting_title(length: int, kv: int) -> str:
    return f"T = {length}, {kv} kv pairs"


def human_bytes(n: float, _pos=None) -> str:
    """``1536 -> "1.5 KiB"`` (axis labels)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} GiB"


def _model_styles(models: Iterable[str]) -> dict[str, tuple[str, str]]:
    """(colour, marker) per model. :func:`model_colors` gives a family's variants one colour (``fox-llama`` and
    ``fox-llama-timescale-init``), so every model after the first of its colour (sorted names) takes the next
    marker ("o", then "s", "^", "D"), which keeps the two apart in the plot and its legend."""
    colors = model_colors(list(models))
    styles, seen = {}, {}
    for model in sorted(colors):
        k = seen.get(colors[model], 0)
        seen[colors[model]] = k + 1
        styles[model] = (colors[model], "os^D"[k % 4])
    return styles


def _panels(best: pd.DataFrame, width: float = 4.2):
    settings = [tuple(s) for s in best[SETTING].drop_duplicates().sort_values(SETTING).itertuples(index=False)]
    fig = Figure(figsize=(width * len(settings) + 0.6, 3.6))
    axes = np.atleast_1d(fig.subplots(1, len(settings), sharey=True, squeeze=False)[0])
    return fig, list(zip(settings, axes, strict=True))


def _legend(fig: Figure, axes) -> None:
    """One legend below all panels, each label once."""
    handles, labels = {}, []
    for ax in axes:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in handles:
                handles[lab] = h
                labels.append(lab)
    fig.tight_layout()
    fig.legend(
        [handles[lab] for lab in labels],
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        frameon=False,
        ncol=min(len(labels), 2 * len(axes)),
    )


def plot_accuracy_vs_dmodel(best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """Zoology-style: x = d_model (log2), y = best accuracy over lr, one panel per setting. PNG + PDF."""
    fig, panels = _panels(best)
    styles = _model_styles(best["model"].unique())
    for (length, kv), ax in panels:
        rows = best[(best["length"] == length) & (best["num_kv_pairs"] == kv)]
        for model, g in rows.groupby("model", sort=True):
            g = g.sort_values("d_model")
            color, marker = styles[model]
            linestyle = "-" if marker == "o" else ":"  # a family's variant: its own marker and a dotted line
            ax.plot(g["d_model"], g["accuracy"], color=color, marker=marker, linestyle=linestyle, label=model)
        ds = sorted(rows["d_model"].unique())
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(ds))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([str(d) for d in ds])
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(_setting_title(length, kv))
        ax.set_xlabel("Model dimension")
        ax.grid(alpha=0.3)
    panels[0][1].set_ylabel("Accuracy (best over learning rates)")
    _legend(fig, [ax for _, ax in panels])
    return save_figure(fig, out_stem)


def plot_accuracy_vs_state(best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """x = decoding-state bytes (log), y = best accuracy, one panel per setting; points labelled by d_model.

    Filled markers: a fixed recurrent state. Hollow markers, dashed lines: the KV cache of an attention model at
    the sequence length (it keeps growing with length). Models without a known state are left out.
    """
    known = best[best["state_bytes"].notna()]
    if known.empty:
        raise UserError("no MQAR records with a state size to plot")
    fig, panels = _panels(known)
    styles = _model_styles(known["model"].unique())
    for (length, kv), ax in panels:
        rows = known[(known["length"] == length) & (known["num_kv_pairs"] == kv)]
        for model, g in rows.groupby("model", sort=True):
            g = g.sort_values("state_bytes")
            cache = (g["state_kind"] == "kv-cache").all()
            label = f"{model} (KV cache at T)" if cache else model
            style = dict(linestyle="--", markerfacecolor="white") if cache else dict(linestyle="-")
            color, marker = styles[model]
            ax.plot(g["state_bytes"], g["accuracy"], marker=marker, color=color, label=label, **style)
        # one d_model label per width, above its best point (models of one width have similar states)
        for d, g in rows.groupby("d_model"):
            top = g.loc[g["accuracy"].idxmax()]
            xy = (top["state_bytes"], top["accuracy"])
            ax.annotate(f"d={d}", xy, textcoords="offset points", xytext=(0, 6), ha="center", fontsize=7, color="0.3")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2))
        ax.xaxis.set_major_formatter(FuncFormatter(human_bytes))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda *_: ""))
        ax.tick_params(axis="x", labelrotation=30)  # byte labels a factor 2 apart would overlap
        ax.set_ylim(-0.02, 1.08)
        ax.set_title(_setting_title(length, kv))
        ax.set_xlabel("Decoding state (bytes)")
        ax.grid(alpha=0.3)
    panels[0][1].set_ylabel("Accuracy (best over learning rates)")
    _legend(fig, [ax for _, ax in panels])
    return save_figure(fig, out_stem)


def plot_training_curves(records: Iterable[dict], best: pd.DataFrame, out_stem: Path | str) -> list[Path]:
    """One column per (setting, d_model): test accuracy, training loss and the forget gates' time scale (mean over
    layers of ``-1 / mean log f``, log scale; models with data-dependent gates: FoX, GSA) against the optimizer
    step, for the best-lr cell of every model (``best``: :func:`best_over_lr`). PNG + PDF."""
    chosen = {(r["model"], r["length"], r["num_kv_pairs"], r["d_model"], r["lr"]) for _, r in best.iterrows()}
    cells = [r for r in records if (r.get("model"), r.get("length"), r.get("num_kv_pairs"), r.get("d_model"),
                                    r.get("lr")) in chosen and r.get("history")]  # fmt: skip
    if not cells:
        raise UserError("no MQAR records with a training history to plot")
    columns = sorted({(r["length"], r["num_kv_pairs"], r["d_model"]) for r in cells})
    has_gates = any(h.get("eval_forget_time_scale") for r in cells for h in r["history"])
    rows = 3 if has_gates else 2
    fig = Figure(figsize=(4.2 * len(columns) + 0.6, 2.8 * rows))
    axes = fig.subplots(rows, len(columns), squeeze=False, sharex="col")
    # one colour per model (variants of one family, e.g. two gate inits, must be told apart here)
    colors = {m: f"C{i % 10}" for i, m in enumerate(sorted({r["model"] for r in cells}))}
    for col, (length, kv, d) in enumerate(columns):
        ax_acc, ax_loss, ax_gate = axes[0][col], axes[1][col], axes[rows - 1][col]
        for r in sorted((r for r in cells if (r["length"], r["num_kv_pairs"], r["d_model"]) == (length, kv, d)),
                        key=lambda r: r["model"]):  # fmt: skip
            style = dict(color=colors[r["model"]], label=f"{r['model']} (lr {r['lr']:g})")
            evals = [h for h in r["history"] if "eval_accuracy" in h]
            ax_acc.plot([h["step"] for h in evals], [h["eval_accuracy"] for h in evals], marker=".", **style)
            ax_loss.plot([h["step"] for h in r["history"]], [h["loss"] for h in r["history"]], **style)
            gates = [(h["step"], np.mean(h["eval_forget_time_scale"])) for h in evals
                     if h.get("eval_forget_time_scale") and None not in h["eval_forget_time_scale"]]  # fmt: skip
            if gates and has_gates:
                ax_gate.plot(*zip(*gates, strict=True), marker=".", **style)
        ax_acc.set_title(f"{_setting_title(length, kv)}, d={d}")
        ax_acc.set_ylim(-0.02, 1.02)
        ax_loss.set_yscale("log")
        if has_gates:
            ax_gate.set_yscale("log")
        axes[rows - 1][col].set_xlabel("Optimizer step")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("Test accuracy")
    axes[1][0].set_ylabel("Training loss")
    if has_gates:
        axes[2][0].set_ylabel("Forget time scale (tokens)")
    _legend(fig, axes.flat)
    return save_figure(fig, out_stem)


def ablation_table(df: pd.DataFrame, solved_above: float = 0.99) -> pd.DataFrame:
    """Per (model, variant, setting, d_model): the best accuracy over learning rates of each training seed, as
    ``mean``, ``min``, ``max`` over seeds; ``solved`` ("k/n": seeds whose best cell exceeded ``solved_above``) and
    ``steps_to_solve`` (median over solved seeds of the best cell's steps; the sweep stops a cell early once solved).

    ``df``: a :func:`records_frame`; ``variant`` "base" for the base recipe."""
    key = ["model_name", "variant", *SETTING, "d_model"]
    per_seed = best_cell_per_seed(df.assign(variant=df["variant"].fillna("base").replace("", "base")), key)
    rows = []
    for values, g in per_seed.groupby(key, sort=False):
        solved = g[g["value"] > solved_above]
        rows.append({**dict(zip(key, values, strict=True)), "seeds": len(g), "mean": g["value"].mean(),
                     "min": g["value"].min(), "max": g["value"].max(), "solved": f"{len(solved)}/{len(g)}",
                     "steps_to_solve": solved["steps"].median() if len(solved) else None,
                     "best_lrs": ", ".join(f"{lr:g}" for lr in sorted(g["lr"].unique()))})  # fmt: skip
    out = pd.DataFrame(rows).rename(columns={"model_name": "model"})
    rank = {v: i for i, v in enumerate(["base", *sorted(set(out["variant"]) - {"base"})])}  # the base recipe first
    out = out.assign(rank=out["variant"].map(rank)).sort_values(["model", "rank", *SETTING, "d_model"], kind="stable")
    return out.drop(columns="rank").reset_index(drop=True)


def cells_table(df: pd.DataFrame) -> pd.DataFrame:
    """Every trained cell, one row each (``df``: a :func:`records_frame`): its setting, width, learning rate, seed
    and variant, accuracy, steps (to solve, where it stopped early), whether it diverged, and its training time."""
    columns = ["model", *SETTING, "d_model", "lr", "seed", "variant", "value", "steps", "stopped_early", "diverged",
               "train_seconds", "device"]  # fmt: skip
    out = df[columns].rename(columns={"value": "accuracy"})
    return out.sort_values(["model", *SETTING, "d_model", "lr", "seed"], kind="stable").reset_index(drop=True)


def write_mqar_report(paths: Iterable[Path | str], out_dir: Path | str) -> list[Path]:
    """All MQAR outputs for the runs under ``paths`` into ``out_dir``: ``best.{csv,md,tex}`` (wide),
    ``best_long.csv``, ``cells.csv`` (every cell), ``accuracy_vs_dmodel.{png,pdf}``, ``accuracy_vs_state.{png,pdf}``,
    ``training_curves.{png,pdf}`` and, for sweeps with variants or several seeds, ``ablation.{csv,md}``."""
    out_dir = Path(out_dir)
    paths = list(paths)
    frame = load_mqar(paths)
    best = best_over_lr(frame)
    written = write_table(best_table(best), out_dir / "best", floatfmt=".3f")
    seeds_per_cell = frame.groupby(["model", *SETTING, "d_model", "lr"])["seed"].nunique().max()
    if frame["variant"].notna().any() or seeds_per_cell > 1:
        written += write_table(ablation_table(frame), out_dir / "ablation", formats=("csv", "md"), floatfmt=".3f")
    written += write_table(best, out_dir / "best_long", formats=("csv",))
    written += write_table(cells_table(frame), out_dir / "cells", formats=("csv",))
    written += plot_accuracy_vs_dmodel(best, out_dir / "accuracy_vs_dmodel")
    if best["state_bytes"].notna().any():
        written += plot_accuracy_vs_state(best, out_dir / "accuracy_vs_state")
    records = [r for run in find_runs(paths) for r in read_jsonl(run / RECORDS_FILE)]
    if any(r.get("history") for r in records):
        written += plot_training_curves(records, best, out_dir / "training_curves")
    return written
