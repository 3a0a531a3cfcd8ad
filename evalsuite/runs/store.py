"""Result files: atomic writes, JSONL records, config hashes.

A crash never leaves a half-written result: every whole-file write goes to a temporary file in the
same directory and is moved over the target with ``os.replace`` (atomic on POSIX), and gets the mode a
plain ``open()`` would give (``0o666 & ~umask``). JSONL appends are flushed and fsynced per record; readers
drop a torn last line, and the next append cuts it off first (so the new record starts on a line of its own).
A write that finds no room (a full disk, the file-size limit, the quota) is a UserError naming the file, and leaves
the file as it was (an atomic write) or with a torn last line that the next append repairs, so a run resumes once
there is room. A corrupt line elsewhere is an error naming it, with the way on: ``--repair`` sets such lines aside
(:func:`set_aside_corrupt`) and their items run again.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from evalsuite.errors import UserError

# The two files every run directory holds (the report layer reads what the tasks write):
RESULTS_FILE = "results.json"  # written once, atomically, when a run finishes
RECORDS_FILE = "records.jsonl"  # one line per finished item, appended as items finish
# A write refused for want of room: no space left (ENOSPC), past the file-size limit (EFBIG, RLIMIT_FSIZE), over the
# disk quota (EDQUOT).
NO_ROOM = frozenset(code for code in (errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", None)) if code is not None)
REPAIR_HINT = "rerun the command that wrote it with --repair to set corrupt lines aside and redo their items"


def no_room(path: Path | str, error: OSError) -> UserError:
    """The one line for a write to ``path`` that found no room (``error.errno`` in :data:`NO_ROOM`)."""
    code = errno.errorcode.get(error.errno, str(error.errno))
    return UserError(
        f"cannot write {path}: {os.strerror(error.errno)} ({code}); make room (free disk space, or raise the file-size "
        "limit or quota) and rerun the same command"
    )


def config_hash(config: dict) -> str:
    """12 hex digits identifying a config (canonical JSON, sorted keys)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows.

    Not cached: the umask can change while the process runs. Linux reports it in ``/proc/self/status``;
    elsewhere the only way is to set it and restore it, which briefly changes a process-wide setting (a
    restrictive 0o077 meanwhile, so a file another thread creates in that window is never too open).
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o077)
        os.umask(mask)
    return mask


def atomic_write_bytes(path: Path | str, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) so readers see the old file or the new one, never a mix.

    The file gets mode ``0o666 & ~umask``, as ``open(path, "w")`` would create it (``mkstemp`` makes 0600).
    """
    path = Path(path)
    data = data.encode("utf-8") if isinstance(data, str) else data
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as e:
        raise no_room(path, e) if e.errno in NO_ROOM else e from None
    try:
        with os.fdopen(fd, "wb") as f:
            mode = 0o666 & ~current_umask()
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), mode)
            else:  # pragma: no cover - Windows before Python 3.13
                os.chmod(tmp, mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.errno in NO_ROOM:
            raise no_room(path, e) from None
        raise
    return path


def atomic_write_json(path: Path, obj) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n").encode())


def atomic_save_npz(path: Path, **arrays: np.ndarray) -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue())


def append_jsonl(path: Path, record: dict) -> None:
    """Append one record as a line; durable before returning.

    A file that does not end with a newline (a crash cut the last write) is repaired first, see
    :func:`_repair_tail`, so the record never lands glued to a fragment.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=str) + "\n").encode("utf-8")
    try:
        with open(path, "a+b") as f:  # O_APPEND: every write goes to the end, whatever the read position
            line = _repair_tail(f, path) + line
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if e.errno in NO_ROOM:  # what got out is a torn last line: readers drop it, the next append cuts it off
            raise no_room(path, e) from None
        raise


_TAIL_BLOCK = 1 << 16


def _repair_tail(f, path: Path) -> bytes:
    """Make the open JSONL file ``f`` end at a line boundary; return the bytes to write before a new record.

    Cheap in the usual case (one byte read at the end). When the last line lacks its newline, it is read
    backwards in blocks only as far as the previous newline: a complete JSON object is kept (the returned
    ``b"\\n"`` ends it), anything else is a torn record and is truncated away with a warning.
    """
    end = f.seek(0, os.SEEK_END)
    if end == 0:
        return b""
    f.seek(end - 1)
    if f.read(1) == b"\n":
        return b""
    start, blocks = end, []  # the last line's bytes, last block first
    while start > 0:
        size = min(_TAIL_BLOCK, start)
        f.seek(start - size)
        block = f.read(size)
        cut = block.rfind(b"\n")
        if cut >= 0:
            blocks.append(block[cut + 1 :])
            start = start - size + cut + 1
            break
        blocks.append(block)
        start -= size
    tail = b"".join(reversed(blocks))
    try:
        complete = isinstance(json.loads(tail.decode("utf-8")), dict)
    except (UnicodeDecodeError, json.JSONDecodeError):
        complete = False
    if complete:
        return b"\n"
    f.truncate(start)
    # A plain line on stderr rather than warnings.warn: it is exactly one line and always shown, whereas the
    # warnings machinery adds a source line, hides repeats of a message under the default filter, and under
    # -W error would turn a repair that already happened into a crash before the record is written. The CLI
    # reports on stderr anyway (a rich progress bar, if one is live, prints the line above itself).
    print(
        f"evalsuite: warning: {path}: dropped a torn last record ({end - start} bytes, no newline: a write was "
        "cut off); appending after the last complete line",
        file=sys.stderr,
        flush=True,
    )
    return b""


def read_jsonl(path: Path) -> list[dict]:
    """Records (JSON objects) of a JSONL file; a torn final line (crash mid-write) is ignored, a complete one
    that only lacks its newline is kept.

    A bad line anywhere else means the file is corrupt: UserError naming the line.
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        lines = [(n, line) for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1) if line.strip()]
    except OSError as e:
        raise UserError(f"cannot read {path}: {e}") from None
    except UnicodeDecodeError as e:
        raise UserError(f"cannot read {path}: {e}; {REPAIR_HINT}") from None
    records = []
    for i, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # only the last line may be torn
                break
            raise UserError(f"{path}:{number}: corrupt record (not valid JSON); {REPAIR_HINT}") from None
        if isinstance(row, dict):
            records.append(row)
    return records


def set_aside_corrupt(path: Path, aside: Path) -> list[int]:
    """Rewrite the JSONL file ``path`` (atomically) without its lines that are not valid JSON, a torn last line
    included, appending them to ``aside`` as they were; returns their line numbers (none: ``path`` is untouched)."""
    path = Path(path)
    if not path.exists():
        return []
    kept, bad = [], []
    for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if line.strip():
            try:
                json.loads(line)
                kept.append(line)
            except (UnicodeDecodeError, json.JSONDecodeError):
                bad.append((number, line))
    if bad:
        try:
            with open(aside, "ab") as f:
                f.write(b"".join(line + b"\n" for _, line in bad))
        except OSError as e:
            raise no_room(aside, e) if e.errno in NO_ROOM else e from None
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
    return [number for number, _ in bad]


def read_json_file(path: Path | str, what: str = "file") -> dict:
    """A JSON object from ``path``; a corrupt or non-object file is a UserError naming it."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {what} {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise UserError(f"{what} {path} is corrupt (invalid JSON at line {e.lineno}: {e.msg})") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {path} must hold a JSON object")
    return data


def file_sha256(paths: list[Path]) -> str:
    """sha256 over the contents of several files, in the given order (streamed)."""
    h = hashlib.sha256()
    for p in paths:
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()
