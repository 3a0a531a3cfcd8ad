"""What produced a result: package versions, git commit, machine. Stored in every result record."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from functools import lru_cache
from pathlib import Path

import evalsuite


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """Commit of the evalsuite source tree (with ``-dirty`` if it has local changes), or None.

    A copy shipped elsewhere (e.g. to a GPU machine, where ``.git`` may be missing or stale) can declare its commit
    in ``EVALSUITE_GIT_COMMIT``, which then wins.
    """
    root = Path(evalsuite.__file__).resolve().parent.parent
    if os.environ.get("EVALSUITE_GIT_COMMIT"):
        return os.environ["EVALSUITE_GIT_COMMIT"] + " (declared)"
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def versions() -> dict:
    import numpy
    import torch

    out = {"evalsuite": evalsuite.__version__, "python": platform.python_version(), "torch": torch.__version__}
    out["numpy"] = numpy.__version__
    try:
        import triton

        out["triton"] = triton.__version__
    except ImportError:
        out["triton"] = None
    return out


def device_name(device) -> str:
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def provenance(**extra) -> dict:
    """Base provenance (versions, git commit, host, time) merged with task-specific fields."""
    record = {
        **versions(),
        "git_commit": git_commit(),
        "host": platform.node(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    record.update(extra)
    return record
