"""Read run directories into Python objects and one long pandas table.

A run directory holds ``results.json`` (written atomically when a run finishes) and/or ``records.jsonl``
(one JSON object per line, appended while a run is in progress). The loss task also writes
``loss_per_token.npz`` with the per-position loss curve.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from evalsuite.errors import UserError
from evalsuite.runs.store import RECORDS_FILE, RESULTS_FILE, read_jsonl

LOSS_CURVE_FILE = "loss_per_token.npz"

# Either file marks a directory as a run directory.
RUN_MARKERS = (RESULTS_FILE, RECORDS_FILE)

# Provenance fields worth a column; the rest stays in results.json.
PROVENANCE_KEYS = ("evalsuite", "git_commit", "checkpoint_sha256", "tokenizer", "device", "dtype", "seed")

STRING_COLUMNS = ("model", "task", "subtask", "metric", "config_hash", "run_dir")
COLUMNS = (
    "model",
    "task",
    "subtask",
    "length",
    "depth",
    "metric",
    "value",
    "n",
    "config_hash",
    "run_dir",
    "train_length",
    *(f"provenance.{key}" for key in PROVENANCE_KEYS),
)


def is_run_dir(path: Path) -> bool:
    """True if ``path`` is a directory holding ``results.json`` or ``records.jsonl``."""
    return path.is_dir() and any((path / name).is_file() for name in RUN_MARKERS)


def find_runs(paths: Iterable[Path | str]) -> list[Path]:
    """Expand ``paths`` into a sorted, de-duplicated list of run directories.

    Each path may be a run directory, a ``results.json``/``records.jsonl`` file inside one, or any
    directory that contains run directories at any depth. A run directory is not searched further.
    """
    found: dict[Path, None] = {}  # an ordered set
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise UserError(f"{path} does not exist")
        if path.is_file():
            if path.name not in RUN_MARKERS:
                raise UserError(f"{path} is not a run directory or a {' / '.join(RUN_MARKERS)} file")
            path = path.parent
        for run in _walk_runs(path):
            found.setdefault(run.resolve(), None)
    return sorted(found)


def _walk_runs(root: Path) -> Iterator[Path]:
    """Yield run directories under ``root`` (inclusive), without descending into a run directory."""
    if is_run_dir(root):
        yield root
        return
    for dirpath, dirnames, _ in os.walk(root):
        dirnames.sort()  # deterministic order
        keep = []
        for name in dirnames:
            sub = Path(dirpath) / name
            if is_run_dir(sub):
                yield sub
            elif not name.startswith("."):
                keep.append(name)
        dirnames[:] = keep  # prune: don't walk into run dirs or hidden dirs


def load_run(run_dir: Path | str) -> dict[str, Any]:
    """Return the parsed ``results.json`` of a finished run.

    Raises:
        UserError: the file is missing (run not finished?), unreadable, or not a JSON object.
    """
    path = Path(run_dir) / RESULTS_FILE
    if not path.is_file():
        raise UserError(f"{path} not found: is {Path(run_dir)} a finished run directory?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def load_loss_curve(run_dir: Path | str) -> tuple[np.ndarray, np.ndarray]:
    """Return ``(loss_per_token, count)`` from a loss run's ``loss_per_token.npz``.

    ``loss_per_token[i]`` is the mean NLL at 0-based position ``i`` (float64, shape ``[L]``) and
    ``count[i]`` the number of windows summed there (int64, shape ``[L]``).
    """
    path = Path(run_dir) / LOSS_CURVE_FILE
    if not path.is_file():
        raise UserError(f"{path} not found: is {Path(run_dir)} a finished loss run?")
    try:
        with np.load(path, allow_pickle=False) as npz:
            loss = np.asarray(npz["loss_per_token"], dtype=np.float64)
            count = np.asarray(npz["count"], dtype=np.int64)
    except KeyError as exc:
        raise UserError(f"{path} lacks the key {exc}; expected 'loss_per_token' and 'count'") from None
    except (OSError, ValueError, EOFError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None
    if loss.ndim != 1 or loss.shape != count.shape:
        raise UserError(f"{path}: expected 1-D 'loss_per_token' and 'count' of equal length")
    return loss, count


def card_architecture(results: dict[str, Any]) -> str | None:
    """The architecture of the model card a run used (from its provenance); None for a model without a card."""
    card = _as_dict(_as_dict(results.get("provenance")).get("card"))
    return card.get("architecture")


def length_unit(results: dict[str, Any]) -> str:
    """What a run's lengths and positions count: "bytes" when its tokenizer reads UTF-8 bytes, else "tokens"."""
    return "bytes" if _as_dict(results.get("provenance")).get("tokenizer") == "bytes" else "tokens"


def has_metric(entry: Any) -> bool:
    """True for a record with a ``metric`` and a ``value`` (NIAH cell lines with ``scores`` are not)."""
    return isinstance(entry, dict) and "metric" in entry and "value" in entry


def run_records(run_dir: Path) -> list[dict[str, Any]]:
    """Flat rows (see ``COLUMNS``) for every metric record of one run directory.

    Fields missing from a record fall back to the run's ``results.json`` (model, task, config_hash,
    provenance), when there is one.
    """
    results = load_run(run_dir) if (run_dir / RESULTS_FILE).is_file() else {}
    entries = [entry for entry in results.get("records") or [] if has_metric(entry)]
    if (run_dir / RECORDS_FILE).is_file():
        entries += [entry for entry in read_jsonl(run_dir / RECORDS_FILE) if has_metric(entry)]
    return [_flatten(entry, results, run_dir) for entry in entries]


def _flatten(entry: dict[str, Any], results: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One table row from a record, with run-level defaults and a few provenance columns."""
    row: dict[str, Any] = {}
    for column in ("model", "task", "subtask", "length", "depth", "metric", "value", "n", "config_hash"):
        row[column] = entry.get(column, results.get(column))
    row["run_dir"] = str(run_dir)
    row["train_length"] = entry.get("train_length", results.get("train_length"))
    provenance = {**_as_dict(results.get("provenance")), **_as_dict(entry.get("provenance"))}
    for key in PROVENANCE_KEYS:
        row[f"provenance.{key}"] = provenance.get(key)
    return row


def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def gather_records(paths: Iterable[Path | str]) -> pd.DataFrame:
    """Read every run under ``paths`` into one long table with the columns in ``COLUMNS``.

    Sources: ``results.json`` "records" and ``records.jsonl`` lines; entries without both a "metric" and
    a "value" are skipped. Missing strings become "", missing numbers NaN (``<NA>`` for the integer
    columns ``length``, ``n``, ``train_length``).
    """
    rows = [row for run in find_runs(paths) for row in run_records(run)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return _normalise_types(df)


def _normalise_types(df: pd.DataFrame) -> pd.DataFrame:
    """Give every column one predictable dtype so filters and pivots behave the same for every source."""
    for column in STRING_COLUMNS:
        df[column] = df[column].map(lambda v: "" if _is_missing(v) else str(v)).astype(object)
    for column in ("length", "n", "train_length"):
        df[column] = _to_int(df[column])
    for column in ("depth", "value"):
        df[column] = pd.to_numeric(df[column], errors="coerce").astype("float64")
    for key in PROVENANCE_KEYS:
        column = f"provenance.{key}"
        if key == "seed":
            continue  # keep seeds as given (an int, or a list/dict of seeds)
        df[column] = df[column].map(lambda v: "" if _is_missing(v) else str(v)).astype(object)
    return df


def _to_int(series: pd.Series) -> pd.Series:
    """Nullable integers; values that are not whole numbers keep a float dtype instead of being truncated."""
    numbers = pd.to_numeric(series, errors="coerce").astype("float64")
    whole = numbers.dropna()
    if (whole == np.floor(whole)).all():
        return numbers.astype("Int64")
    return numbers


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def run_labels(models: list[str], run_dirs: list[Path | str]) -> list[str]:
    """Legend/row labels: the model name, plus what tells its runs apart when a model appears more than once.

    The config values that differ between a model's runs (``data=books, length=4096``; read from each run's
    ``results.json``) are named; runs whose configs do not differ there fall back to the nearest part of their paths
    that differs (``a/drt-rows16/passkey`` next to ``a/drt/passkey``: ``drt-rows16``).
    """
    configs = [_run_config(run) for run in run_dirs]
    labels = []
    for i, (model, run) in enumerate(zip(models, run_dirs, strict=True)):
        peers = [j for j, m in enumerate(models) if m == model]
        if len(peers) == 1:
            labels.append(model)
            continue
        keys = sorted({k for j in peers for k in configs[j]})
        differ = [k for k in keys if len({_short(configs[j].get(k)) for j in peers}) > 1]
        parts = [f"{k}={_short(configs[i].get(k))}" for k in differ]
        labels.append(f"{model} ({', '.join(parts) if parts else _differing_part(run, [run_dirs[j] for j in peers])})")
    return labels


def _differing_part(run: Path | str, peers: list[Path | str]) -> str:
    """The last component of ``run``'s resolved path that is not the same in every peer's (its name if none)."""
    paths = [Path(p).resolve().parts for p in peers]
    own = Path(run).resolve().parts
    for back in range(1, len(own) + 1):
        if len({p[-back] if back <= len(p) else None for p in paths}) > 1:
            return own[-back]
    return Path(run).name


def _run_config(run_dir: Path | str) -> dict:
    """The run's config from its results.json (``{}`` when there is none or it cannot be read)."""
    try:
        config = load_run(run_dir).get("config")
    except UserError:
        return {}
    return config if isinstance(config, dict) else {}


def _short(value: Any) -> str:
    """A config value as a label shows it: paths by their last part, lists joined by commas."""
    if isinstance(value, list):
        return ",".join(_short(v) for v in value)
    if isinstance(value, str) and ("/" in value or "\\" in value):
        return Path(value).name
    return str(value)
