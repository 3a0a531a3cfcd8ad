"""Result files: atomic writes, JSONL records, config hashes.

A crash never leaves a half-written result: every whole-file write goes to a temporary file in the
same directory and is moved over the target with ``os.replace`` (atomic on POSIX). JSONL appends are
flushed and fsynced per record, and readers drop a torn last line.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError

# The two files every run directory holds (the report layer reads what the tasks write):
RESULTS_FILE = "results.json"  # written once, atomically, when a run finishes
RECORDS_FILE = "records.jsonl"  # one line per finished item, appended as items finish


def config_hash(config: dict) -> str:
    """12 hex digits identifying a config (canonical JSON, sorted keys)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def atomic_write_bytes(path: Path | str, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) so readers see the old file or the new one, never a mix."""
    path = Path(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as a line; durable before returning."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(record, default=str) + "\n")
        f.flush()
        os.fsync(f.fileno())


def read_jsonl(path: Path) -> list[dict]:
    """Records (JSON objects) of a JSONL file; a torn final line (crash mid-write) is ignored.

    A bad line anywhere else means the file is corrupt: UserError naming the line.
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1) if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    records = []
    for i, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # only the last line may be torn
                break
            raise UserError(f"{path}:{number}: corrupt record (not valid JSON)") from None
        if isinstance(row, dict):
            records.append(row)
    return records


def file_sha256(paths: list[Path]) -> str:
    """sha256 over the contents of several files, in the given order (streamed)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()
