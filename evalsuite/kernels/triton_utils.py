"""Host-side helpers that every Triton kernel family under :mod:`evalsuite.kernels` shares.

Each family (``forgetting/`` today) keeps its kernels and launchers in its own package and takes from here:

* :func:`triton_installed` -- whether ``triton`` can be imported, without importing it. The dispatchers ask this
  on every call (every layer of every decoding step), so it is cached, and this module must stay importable on
  machines without triton: it never imports triton at module level, only inside the functions that need it.
* :func:`interpreting` -- whether kernels run under ``TRITON_INTERPRET=1`` (CPU tensors, the tests). There,
  launchers must not query the driver (no device exists), take fixed small block sizes (:func:`pick_config`)
  so that small test shapes still cover several blocks and a ragged tail, and skip autotuning (every config
  would be interpreted, slowly, for nothing).
* :func:`pick_config` -- that choice of block configuration: the family's interpreter config, or its tuned GPU
  config for the head dim. It reads the caller's table at call time, so benchmarks that retune a table in place
  change what the next launch uses.
* :func:`empty` -- the one allocator for kernel outputs. Launchers look it up on this module at call time
  (``triton_utils.empty(...)``), so tests can monkeypatch it to fill every output with NaN and catch any
  element a kernel forgets to write.
* TMA setup: :func:`has_tma` (compute capability >= 9, cached per device) and :func:`install_tma_allocator`
  (once per process: the global-memory scratch that tensor descriptors built inside kernels need). Neither is
  called under the interpreter, which emulates descriptors without a device.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Mapping
from typing import TypeVar

import torch

Config = TypeVar("Config")


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels run on CPU tensors, and no device may be queried."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_installed() -> bool:
    """Whether triton is importable (checked once, without importing it)."""
    return importlib.util.find_spec("triton") is not None


def pick_config(gpu_configs_by_head_dim: Mapping[int, Config], head_dim: int, interpret_config: Config) -> Config:
    """``interpret_config`` under the interpreter, else the tuned ``gpu_configs_by_head_dim[head_dim]``.

    Pass the table itself (not a copy): it is read on every launch, so tuning it in place takes effect.
    """
    return interpret_config if interpreting() else gpu_configs_by_head_dim[head_dim]


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Allocate a kernel output buffer (uninitialised). Tests replace this to poison outputs with NaN."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.cache
def has_tma(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` has the TMA unit (compute capability >= 9), asked once per device."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for tensor descriptors built inside kernels (the ``triton.set_allocator`` callback)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


@functools.cache
def install_tma_allocator() -> None:
    """Give triton the scratch allocator that in-kernel descriptors need (once per process; GPU only)."""
    import triton

    triton.set_allocator(_tma_scratch)
