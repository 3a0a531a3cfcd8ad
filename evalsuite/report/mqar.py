"""MQAR tables and figures from sweep records (``records.jsonl``, one line per trained cell).

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

The figures are drawn by :mod:`evalsuite.report.mqar_figures`. The best-over-learning-rate logic itself lives with
the task (:mod:`evalsuite.tasks.mqar_summary`), which writes the same numbers into ``results.json``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from evalsuite.errors import UserError
from evalsuite.report.mqar_figures import SETTING, plot_accuracy_vs_dmodel, plot_accuracy_vs_state, plot_training_curves
from evalsuite.report.records import find_runs
from evalsuite.report.tables import write_table
from evalsuite.runs.store import RECORDS_FILE, read_jsonl
from evalsuite.tasks.mqar_summary import POINT, best_cell_per_seed, best_over_lr, records_frame

__all__ = ["POINT", "ablation_table", "best_over_lr", "best_table", "load_mqar", "records_frame", "write_mqar_report"]


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
    # the figures match each model to its family by its records' architecture (a card of any name keeps its colour)
    architecture = frame.drop_duplicates("model").set_index("model")["architecture"]
    best = best.assign(architecture=best["model"].map(architecture))
    written += plot_accuracy_vs_dmodel(best, out_dir / "accuracy_vs_dmodel")
    if best["state_bytes"].notna().any():
        written += plot_accuracy_vs_state(best, out_dir / "accuracy_vs_state")
    records = [r for run in find_runs(paths) for r in read_jsonl(run / RECORDS_FILE)]
    if any(r.get("history") for r in records):
        written += plot_training_curves(records, best, out_dir / "training_curves")
    return written
