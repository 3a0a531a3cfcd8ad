"""From MQAR cell records to results: best accuracy over learning rates, shared provenance, the accuracy check.

Zoology (arXiv:2312.04927) and the GSA paper (arXiv:2409.07146, Figure 3a) report, for each model, setting and
width, the best accuracy over a learning-rate sweep; :func:`best_over_lr` computes it, for the task's
``results.json`` (:mod:`evalsuite.tasks.mqar`) and for the figures and tables of :mod:`evalsuite.report.mqar`.

This module sits beside the ``evalsuite.tasks.mqar`` package rather than in it: importing the package registers
the task, which imports torch, and the report (``evalsuite plot mqar``) should not pay for that.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from evalsuite.errors import UserError

POINT = ["model", "length", "num_kv_pairs", "d_model"]
_FIELDS = (
    "model",
    "architecture",
    "length",
    "num_kv_pairs",
    "d_model",
    "lr",
    "value",
    "n",
    "state_kind",
    "state_bytes",
    "state_dtype",
    "steps",
    "stopped_early",
    "diverged",
    "train_seconds",
    "config_hash",
    "variant",
    "seed",
)


def cell_key(record: dict) -> str | None:
    """A cell record's key: ``key``, or ``config_hash`` in records written before keys existed (same value)."""
    return record.get("key", record.get("config_hash"))


def finished_keys(records: Iterable[dict]) -> set[str]:
    return {k for k in map(cell_key, records) if k is not None}


def latest_cells(records: Iterable[dict]) -> list[dict]:
    """The last record of each cell, in first-seen order (a cell retrained by hand replaces its earlier line)."""
    latest: dict[str | int, dict] = {}
    for i, r in enumerate(records):
        latest[cell_key(r) or i] = r
    return list(latest.values())


def records_frame(records: Iterable[dict], run_dir: Path | str = ""):
    """A pandas DataFrame, one row per trained cell (``task == "mqar"``, ``metric == "accuracy"``) of ``records``.

    Columns: ``_FIELDS`` plus ``model_name``, ``device`` (from provenance) and ``run_dir``; ``value`` is the query
    accuracy. A cell of a recipe variant is labelled ``"model [variant]"`` in ``model`` (``model_name``: the model),
    so tables and plots show it as a row of its own; ``seed`` is the cell's training seed (older records: their
    config's ``init_seed``).
    """
    import pandas as pd

    rows = []
    for r in records:
        if r.get("task") == "mqar" and r.get("metric") == "accuracy" and r.get("value") is not None:
            row = {k: r.get(k) for k in _FIELDS}
            row["model_name"] = row["model"]
            if row["variant"]:
                row["model"] = f"{row['model']} [{row['variant']}]"
            if row["seed"] is None:
                row["seed"] = (r.get("config") or {}).get("init_seed")
            row["device"] = (r.get("provenance") or {}).get("device")
            row["run_dir"] = str(run_dir)
            rows.append(row)
    df = pd.DataFrame(rows, columns=[*_FIELDS, "model_name", "device", "run_dir"])
    for column in ("length", "num_kv_pairs", "d_model"):
        df[column] = df[column].astype(int)
    df["value"] = df["value"].astype(float)
    df["lr"] = df["lr"].astype(float)
    for column in ("state_bytes", "steps", "train_seconds"):  # absent from some early records
        df[column] = pd.to_numeric(df[column], errors="coerce")
    return df


def best_cell_per_seed(df, point: list[str]):
    """The rows of ``df`` (a :func:`records_frame`) holding the best cell over learning rates for each value of the
    ``point`` columns and training seed; ties go to the smaller lr; a missing seed reads -1."""
    ordered = df.assign(seed=df["seed"].fillna(-1)).sort_values(["value", "lr"], ascending=[False, True], kind="stable")
    return ordered.groupby([*point, "seed"], sort=True).head(1)


def best_over_lr(df):
    """The best cell over learning rates for each (model, length, kv pairs, d_model) and training seed (ties go to
    the smaller lr), then the mean over seeds.

    ``df``: a :func:`records_frame`. Columns: ``POINT``, ``accuracy`` (mean over seeds of the best accuracy),
    ``accuracy_min`` and ``accuracy_max`` (over seeds), ``seeds``, ``n`` (test examples), ``lr`` (the best one, of
    the first seed), ``lrs`` (how many were tried), ``state_kind``, ``state_bytes``, ``steps`` and
    ``train_seconds`` (of the best cells, mean over seeds: steps to solve where the cell stopped early), ``device``.
    """
    per_seed = best_cell_per_seed(df, POINT)
    first = per_seed.sort_values([*POINT, "seed"], kind="stable").groupby(POINT, sort=True).head(1)
    first = first.set_index(POINT).drop(columns=["steps", "train_seconds"])
    spread = per_seed.groupby(POINT)["value"].agg(accuracy="mean", accuracy_min="min", accuracy_max="max", seeds="size")
    cost = per_seed.groupby(POINT)[["steps", "train_seconds"]].mean()
    tried = df.groupby(POINT)["lr"].nunique().rename("lrs")
    out = first.join([spread, cost, tried]).reset_index()
    columns = [*POINT, "accuracy", "n", "lr", "lrs", "state_kind", "state_bytes", "steps", "train_seconds", "device",
               "accuracy_min", "accuracy_max", "seeds"]  # fmt: skip
    return out[columns].sort_values(POINT, kind="stable").reset_index(drop=True)


def best_records(records: list[dict]) -> list[dict]:
    """Long-format records of the best accuracy over learning rates per (model, setting, d_model)."""
    import pandas as pd

    df = records_frame(records)
    if df.empty:
        return []
    out = []
    for row in best_over_lr(df).to_dict("records"):
        out.append(
            {
                "model": row["model"],
                "task": "mqar",
                "subtask": f"kv{row['num_kv_pairs']}/d{row['d_model']}/best-lr",
                "length": int(row["length"]),
                "metric": "accuracy_best_lr",
                "value": row["accuracy"],
                "n": None if pd.isna(row["n"]) else int(row["n"]),
                "d_model": int(row["d_model"]),
                "num_kv_pairs": int(row["num_kv_pairs"]),
                "lr": row["lr"],
                "lrs_tried": int(row["lrs"]),
                "state_kind": row["state_kind"],
                "state_bytes": None if math.isnan(row["state_bytes"]) else int(row["state_bytes"]),
            }
        )
    return out


def shared_provenance(records: list[dict]) -> dict:
    """Provenance fields with one value across all records (devices, versions, dtype, ...); several values of a
    field are listed, sorted, under the field's name."""
    values: dict[str, set] = {}
    for r in records:
        for key, value in (r.get("provenance") or {}).items():
            if key not in ("created", "host"):
                values.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    out = {}
    for key, found in sorted(values.items()):
        decoded = sorted((json.loads(v) for v in found), key=str)
        out[key] = decoded[0] if len(decoded) == 1 else decoded
    return out


def check_best(results: dict, threshold: float) -> None:
    """UserError unless every model's best cell is above ``threshold`` (the ``check_accuracy`` of a preset)."""
    best: dict[str, float] = {}
    for r in results["records"]:
        best[r["model"]] = max(best.get(r["model"], -math.inf), r["value"])
    low = {m: v for m, v in best.items() if v <= threshold}
    if low or not best:
        shown = ", ".join(f"{m} {v:.3f}" for m, v in low.items()) or "no finished cells"
        raise UserError(f"MQAR check failed: best accuracy must exceed {threshold} ({shown})")
