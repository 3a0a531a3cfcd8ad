"""LongBench v1 data in the official layout (arXiv:2308.14508): ``<dir>/<task>.jsonl`` and, for LongBench-E,
``<dir>/<task>_e.jsonl``, optionally ``.xz``-compressed. One record per line::

    {"input": str, "context": str, "answers": [str, ...], "length": int, "all_classes": [str, ...] | null,
     "dataset": str, "language": str, "_id": str}

``length`` counts words (English, ``split()``) or characters (Chinese); LongBench-E buckets on it. Every record
is validated; a bad one is reported as ``file:line: reason`` and either skipped (the reason kept for the
run's summary) or fatal, per ``on_bad_record``.
"""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError

ON_BAD_RECORD = ("error", "skip")
# field -> accepted types; "all_classes" may be null, "dataset"/"language"/"_id" are optional
_REQUIRED = {
    "input": (str,),
    "context": (str,),
    "answers": (list,),
    "length": (int,),
    "all_classes": (list, type(None)),
}
_OPTIONAL = {"dataset": (str,), "language": (str,), "_id": (str,)}


@dataclass(frozen=True)
class LongBenchRecord:
    """One validated record; ``line`` is its 1-based line in ``file``."""

    task: str
    index: int
    line: int
    file: str
    input: str
    context: str
    answers: tuple[str, ...]
    length: int
    all_classes: tuple[str, ...] | None
    id: str | None

    def fields(self) -> dict:
        """What a prompt template may name (``{context}``, ``{input}``, ...)."""
        return {"input": self.input, "context": self.context, "length": self.length, "_id": self.id or ""}


def task_file(data_dir: Path, task: str, e: bool) -> Path:
    """``<task>.jsonl`` (or ``_e``), plain or ``.xz``; one clear error naming the file when it is missing."""
    name = f"{task}_e.jsonl" if e else f"{task}.jsonl"
    for candidate in (data_dir / name, data_dir / f"{name}.xz"):
        if candidate.is_file():
            return candidate
    raise UserError(f"LongBench task file {data_dir / name} not found (needed for task {task})")


def _check(row, line: int, where: str) -> str | None:
    """The reason a parsed line is not a valid record, or None."""
    if not isinstance(row, dict):
        return "not a JSON object"
    for field, types in _REQUIRED.items():
        if field not in row:
            return f"missing field '{field}'"
        if not isinstance(row[field], types) or isinstance(row[field], bool):
            return f"field '{field}' must be {' or '.join(t.__name__ for t in types)}, got {type(row[field]).__name__}"
    for field, types in _OPTIONAL.items():
        if field in row and not isinstance(row[field], types):
            return f"field '{field}' must be {types[0].__name__}, got {type(row[field]).__name__}"
    if not row["answers"] or not all(isinstance(a, str) for a in row["answers"]):
        return "field 'answers' must be a non-empty list of strings"
    if row["all_classes"] is not None and not all(isinstance(c, str) for c in row["all_classes"]):
        return "field 'all_classes' must be a list of strings or null"
    if row["length"] < 0:
        return "field 'length' must not be negative"
    return None


def read_task(
    data_dir: Path | str, task: str, *, e: bool = False, on_bad_record: str = "error"
) -> tuple[list[LongBenchRecord], list[str]]:
    """(valid records in file order, ``file:line: reason`` notes of skipped lines) of one task."""
    if on_bad_record not in ON_BAD_RECORD:
        raise UserError(f"--on-bad-record must be one of {', '.join(ON_BAD_RECORD)}, got {on_bad_record!r}")
    path = task_file(Path(data_dir), task, e)
    try:
        raw = lzma.open(path, "rb").read() if path.suffix == ".xz" else path.read_bytes()
        text = raw.decode("utf-8")
    except (OSError, lzma.LZMAError, UnicodeDecodeError) as err:
        raise UserError(f"cannot read {path}: {err}") from None
    records, bad = [], []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            reason = _check(row, number, str(path))
        except json.JSONDecodeError as err:
            reason = f"invalid JSON ({err.msg})"
        if reason is not None:
            note = f"{path}:{number}: {reason}"
            if on_bad_record == "error":
                raise UserError(f"{note} (--on-bad-record skip leaves such lines out)")
            bad.append(note)
            continue
        records.append(
            LongBenchRecord(
                task=task,
                index=len(records),
                line=number,
                file=str(path),
                input=row["input"],
                context=row["context"],
                answers=tuple(row["answers"]),
                length=row["length"],
                all_classes=None if row["all_classes"] is None else tuple(row["all_classes"]),
                id=row.get("_id"),
            )
        )
    return records, bad
