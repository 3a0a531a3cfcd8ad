"""Aggregates over grid cells: the mean of each metric per cell, and means within / beyond the training length.

Used by the needle tests (NIAH, the DRT passkey) to turn per-answer lines into long-format records, and by the
reports to summarise them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def cell_means(rows: Sequence[dict], model: str, task: str = "niah") -> list[dict]:
    """Long-format records (model, task, subtask, length, depth, metric, value, n) from per-cell lines.

    ``value`` is the mean over a cell's samples of a metric; missing values (an unparseable judge reply, a
    failed judge call) are left out and ``n`` counts the rest.
    """
    groups: dict[tuple, dict[str, list[float]]] = {}
    for row in rows:
        key = (row["subtask"], row["length"], row.get("depth"))
        metrics = groups.setdefault(key, {})
        for metric, value in row.get("scores", {}).items():
            metrics.setdefault(metric, [])
            if value is not None:
                metrics[metric].append(float(value))
    out = []
    for (subtask, length, depth), metrics in groups.items():
        for metric, values in metrics.items():
            out.append(
                {
                    "model": model,
                    "task": task,
                    "subtask": subtask,
                    "length": length,
                    "depth": depth,
                    "metric": metric,
                    "value": float(np.mean(values)) if values else None,
                    "n": len(values),
                }
            )
    return out


def within_beyond(records: Sequence[dict], train_length: int | None) -> list[dict]:
    """Mean over cells within and beyond the training length, per (subtask, metric); cells weigh equally."""
    groups: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in records:
        if r.get("value") is not None:
            groups.setdefault((r["subtask"], r["metric"]), []).append((r["length"], r["value"]))
    out = []
    for (subtask, metric), cells in groups.items():
        inside = [v for length, v in cells if train_length is None or length <= train_length]
        beyond = [v for length, v in cells if train_length is not None and length > train_length]
        out.append(
            {
                "subtask": subtask,
                "metric": metric,
                "within": float(np.mean(inside)) if inside else None,
                "beyond": float(np.mean(beyond)) if beyond else None,
                "all": float(np.mean([v for _, v in cells])),
                "cells_within": len(inside),
                "cells_beyond": len(beyond),
                "train_length": train_length,
            }
        )
    return out
