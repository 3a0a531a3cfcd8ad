"""Device and dtype resolution (the ``--device`` / ``--dtype`` options) and the cache folder, shared by adapters and
training."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from evalsuite.errors import UserError

CACHE_ENV = "EVALSUITE_CACHE_DIR"


def cache_root() -> Path:
    """Where the suite keeps what it can rebuild (API replies, token streams): ``$EVALSUITE_CACHE_DIR``, else
    ``~/.cache/evalsuite``."""
    return Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "evalsuite"))


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str | torch.device) -> torch.device:
    """``auto`` (CUDA when available, else CPU), ``cpu``, ``cuda`` or ``cuda:N``; CUDA must exist if asked for.

    Under torchrun, ``auto`` and ``cuda`` mean this rank's GPU, ``cuda:LOCAL_RANK`` (:mod:`evalsuite.runs.distributed`).
    """
    from evalsuite.runs.distributed import local_device

    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return local_device(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise UserError(f"unknown device {device!r}; use auto, cpu, cuda or cuda:N") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device cuda was asked for but no CUDA GPU is available")
    return local_device(dev)


def resolve_dtype(dtype: str) -> torch.dtype:
    """``float32``, ``bfloat16`` or ``float16``."""
    if dtype not in DTYPES:
        raise UserError(f"unknown dtype {dtype!r}; use {', '.join(DTYPES)}")
    return DTYPES[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
