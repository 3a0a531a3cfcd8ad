"""One writer per run directory: an exclusive ``flock`` on ``<dir>/.lock``, held from before a run claims the
directory until its last write (:func:`evalsuite.runs.rundir.writing` takes it for every writer).

* **Refuse, not share.** A second run on a directory in use stops with one line naming the holder (pid, host, start,
  command). Sharing keys between independent processes would need what torchrun's ranks already have: one process
  that deals out the work, merges the records in run order and alone writes the aggregate; and some runs cannot be
  split by key at all (the loss task's running sums, a benchmark's timings on one device). ``torchrun
  --nproc-per-node N`` is the way to put several processes on one run.
* **flock.** The kernel drops the lock when its holder ends, however it ends (SIGKILL and the OOM killer included),
  so the file a killed run left is no lock: the next run takes it over at once, with no guess at whether a pid is
  alive (pids are reused, and one on another host cannot be asked). Locks are per open file, so a process holds at
  most one claim of a directory too. On NFS, Linux maps flock to the server's byte-range locks, so hosts sharing the
  directory exclude each other; a filesystem without locks gets a warning and an unlocked run.
* **The file** holds ``{pid, host, started, command}``, written by each holder, and is removed on release; a run
  that finds one with no holder says whose run ended without releasing it. A run that got the lock checks that the
  file it locked is still the one at the path (a releasing run removes it, and may do so between another's open and
  flock) and tries again if not.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import shlex
import socket
import sys
import time
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.runs.store import NO_ROOM, no_room

LOCK_FILE = ".lock"
NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)  # flock on a filesystem that has no locks
_TRIES = 20  # lock files replaced under us this many times running: give up rather than spin


class RunLock:
    """The lock of one run directory, held by this process from :meth:`acquire` until :meth:`release` (or the end
    of a ``with`` block). ``path``: the lock file."""

    def __init__(self, path: Path, fd: int | None):
        self.path, self._fd = Path(path), fd

    @classmethod
    def acquire(cls, directory: Path | str) -> RunLock:
        """Lock ``directory`` (created if missing) for this process; UserError naming the holder if another holds it."""
        directory = Path(directory)
        path = directory / LOCK_FILE
        for _ in range(_TRIES):
            directory.mkdir(parents=True, exist_ok=True)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            except FileNotFoundError:  # the directory went (a run abandoning it) between the mkdir and the open
                continue
            try:
                held = _flock(fd)
                if held is None:
                    os.close(fd)
                    print(f"evalsuite: warning: {path}: this filesystem has no file locks; make sure no other run "
                          "writes to this directory meanwhile", file=sys.stderr, flush=True)  # fmt: skip
                    return cls(path, None)
                if not held:
                    raise UserError(
                        f"{directory} is in use by another run ({_holder(fd)}); wait for it to end or stop it, or "
                        "choose another --out"
                    )
                if _same_file(fd, path):
                    _stamp(fd, path)
                    return cls(path, fd)
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise UserError(f"cannot lock {path}: other processes keep replacing it")

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and let the lock go; idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):  # removed before it is unlocked, so no one finds it unlocked and reuses it
                self.path.unlink()
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _flock(fd: int) -> bool | None:
    """Take the exclusive lock of ``fd`` without waiting: True, False when another holds it, None when the
    filesystem has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in NO_LOCKS:
            return None
        raise
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read(fd: int) -> dict | None:
    try:
        info = json.loads(os.pread(fd, 1 << 16, 0))
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _holder(fd: int, patience: float = 1.0) -> str:
    """Who holds the lock of ``fd``, from the file; a holder that has just taken it gets ``patience`` seconds to
    write its name."""
    deadline = time.monotonic() + patience
    while (info := _read(fd)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return _describe(info) if info else "a process that has not written its name yet"


def _describe(info: dict) -> str:
    """``pid 123 on host, started 2026-01-01T12:00:00+00:00: evalsuite niah ...`` from a lock file's content."""
    return f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: {info.get('command')}"


def _stamp(fd: int, path: Path) -> None:
    """Write this process's name into the lock file it holds; say so when it takes over a killed run's file."""
    stale = _read(fd)
    if stale is not None:
        print(f"note: {path.parent}: took over from a run that ended without releasing it ({_describe(stale)})",
              file=sys.stderr, flush=True)  # fmt: skip
    argv = sys.argv or ["python"]
    program = "python -m evalsuite" if Path(argv[0]).name == "__main__.py" else Path(argv[0]).name
    info = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([program, shlex.join(argv[1:])]).strip(),
    }
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError as e:
        if e.errno in NO_ROOM:
            raise no_room(path, e) from None
        raise
