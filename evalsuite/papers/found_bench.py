"""Our values of ``bench`` columns (docs/paper-tables.md), found in the benchmark files under a results folder.

:data:`BENCH_FINDERS` maps a bench op to its finder: ``finder(root, recipe, model)`` yields one ``(value, n, source,
mtime)`` per measurement of the column's cell for ``model`` under the folder ``root`` (``n``: the samples behind it,
``source``: the file, ``mtime``: its time); :func:`evalsuite.papers.found.find` keeps the best, as for runs.

``decode``:

* with ``offload`` (the GCA paper's Table 3): DRT over its Base LM, from ``evalsuite bench drt-memory``'s
  ``drt_memory.json`` ratios at the recipe's prompt length, new tokens and chunk-store placement: ms per decoded token
  (``time``) or the decode state's bytes on the device (``memory``; why that is the paper's "mem. cost":
  :mod:`evalsuite.bench.drt_memory`);
* without it (the GSA paper's Figure 4(c)): seconds of one whole generate call of ``new_tokens`` new tokens after a
  prompt of ``length`` tokens at batch 1, prefill included, from ``evalsuite bench generate``'s
  ``generate_bench.json`` (``call_times_s``: the median over the repeats; ``--call-tokens`` times the counts its
  standard calls lack); the fastest of the decode paths measured, which the source names.

``train_step`` (FoX Table 6, GSA Figure 4(a)-(b), GCA Table 4): from ``evalsuite bench train``'s ``train_bench.json``
(:mod:`evalsuite.bench.train_speed`), the model's record at the recipe's length (:func:`train_step_record`): tokens/s
(``throughput``) or the peak memory of a step in bytes (``memory``; the column's unit scales it).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterator
from pathlib import Path


def documents(root: Path, name: str) -> Iterator[tuple[dict, Path]]:
    """Every readable JSON object in a file called ``name`` under ``root``, with its path."""
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        if name in files:
            path = Path(folder) / name
            try:
                doc = json.loads(path.read_text())
            except (OSError, ValueError):  # a file being written: the next render reads it
                continue
            if isinstance(doc, dict):
                yield doc, path


def _drt_ratio(root: Path, recipe: dict, model: str):
    key = {"time": "time_per_token", "memory": "cache_memory"}.get(recipe["metric"])
    for doc, path in documents(root, "drt_memory.json"):
        if doc.get("model") != model or key is None:
            continue
        for r in doc.get("ratios", []):
            setting = (r.get("length"), r.get("new_tokens"), r.get("offload"))
            if setting == (recipe["length"], recipe["new_tokens"], recipe["offload"]) and r.get(key) is not None:
                yield float(r[key]), None, f"{path} (over {doc.get('base')})", path.stat().st_mtime


def _call_seconds(root: Path, recipe: dict, model: str):
    found = []
    for doc, path in documents(root, "generate_bench.json"):
        for r in doc.get("records", []):
            times = (r.get("call_times_s") or {}).get(str(recipe["new_tokens"]))
            cell = (r.get("length"), r.get("batch"), r.get("status")) == (recipe["length"], 1, "ok")
            if times and cell and model in (r.get("model"), r.get("name")):
                found.append((statistics.median(times), len(times), f"{path} ({r['path']} path)", path.stat().st_mtime))
    yield from sorted(found)[:1]  # the fastest path


def _decode(root: Path, recipe: dict, model: str):
    if not isinstance(recipe.get("length"), int) or not isinstance(recipe.get("new_tokens"), int):
        return iter(())  # a token count the paper does not state
    return (_drt_ratio if "offload" in recipe else _call_seconds)(Path(root), recipe, model)


# What a ``train_step`` recipe's metric reads from a record.
TRAIN_STEP_FIELDS = {"throughput": "tokens_per_s", "memory": "peak_memory_bytes"}


def train_step_record(root: Path, recipe: dict, model: str) -> dict | None:
    """``model``'s ``bench train`` record (with its ``file`` and ``mtime``) for a ``train_step`` recipe: at the
    recipe's length (any length where the paper states none), the most tokens a step, then the longest length, then
    the most rounds, then the newest file's."""
    found = []
    for doc, path in documents(Path(root), "train_bench.json"):
        for r in doc.get("records", []):
            if r.get("model") == model and r.get("status") == "ok" and recipe.get("length") in (None, r.get("length")):
                found.append({**r, "file": str(path), "mtime": path.stat().st_mtime})
    rank = lambda r: (r.get("tokens_per_step", 0), r.get("length", 0), r.get("rounds", 0), r["mtime"])  # noqa: E731
    return max(found, key=rank, default=None)


def _train_step(root: Path, recipe: dict, model: str):
    record = train_step_record(root, recipe, model)
    field = TRAIN_STEP_FIELDS.get(recipe["metric"])
    if record is not None and record.get(field) is not None:
        shape = f"{record['length']}x{record['batch']}"
        yield float(record[field]), record.get("rounds"), f"{record['file']} ({shape})", record["mtime"]


# One finder per bench op of docs/paper-tables.md that a command here measures.
BENCH_FINDERS = {"decode": _decode, "train_step": _train_step}
