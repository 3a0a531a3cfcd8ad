"""Host-side helpers that every Triton kernel family under :mod:`evalsuite.kernels` shares.

Each family (e.g. ``forgetting/``) keeps its kernels and launchers in its own package and takes from here:

* :func:`triton_installed` -- whether ``triton`` can be imported, without importing it. The dispatchers ask this
  on every call (every layer of every decoding step), so it is answered once at import, and this module must stay
  importable on machines without triton: it never imports triton at module level, only inside the functions that
  need it.
* :func:`interpreting` -- whether kernels run under ``TRITON_INTERPRET=1`` (CPU tensors, the tests). There,
  launchers must not query the driver (no device exists), take fixed small block sizes (:func:`pick_config`)
  so that small test shapes still cover several blocks and a ragged tail, and skip autotuning (every config
  would be interpreted, slowly, for nothing).
* :func:`pick_config` -- that choice of block configuration: the family's interpreter config, or its tuned GPU
  config for the head dim, from a table that nothing writes to (a caller with other settings passes them to the
  launcher instead).
* :func:`empty` -- the one allocator for kernel outputs. Launchers look it up on this module at call time
  (``triton_utils.empty(...)``), so tests can monkeypatch it to fill every output with NaN and catch any
  element a kernel forgets to write.
* :func:`pdl` -- whether a launch on a device uses programmatic dependent launch (compute capability >= 9, not
  under the interpreter, not turned off by ``EVALSUITE_PDL=0``: :func:`pdl_allowed`): the kernel then starts while
  the one before it finishes and waits for its writes inside
  (:func:`~evalsuite.kernels.jit_helpers.wait_for_previous_kernel`).
* TMA setup: :func:`has_tma` (compute capability >= 9, cached per device) and :func:`install_tma_allocator`
  (once per process: the global-memory scratch that tensor descriptors built inside kernels need). Neither is
  called under the interpreter, which emulates descriptors without a device.
* :func:`interpreter_bounds_check` -- a debug helper for interpreter tests: every load and store of the kernels
  launched inside it must address memory within one tensor argument of that launch, on every lane, masked-off
  lanes included. The interpreter itself reads and writes raw host memory and never faults, so an out-of-bounds
  index that makes a GPU raise "illegal memory access" passes there silently unless it is checked like this.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TypeVar

import torch

Config = TypeVar("Config")


def interpreting() -> bool:
    """True under ``TRITON_INTERPRET=1``: kernels run on CPU tensors, and no device may be queried."""
    return os.environ.get("TRITON_INTERPRET") == "1"


_TRITON_INSTALLED = importlib.util.find_spec("triton") is not None  # asked once, at import, without importing it


def triton_installed() -> bool:
    """Whether triton is importable. A module constant, not a cached call: torch.compile traces this (it runs inside
    compiled decoding and training steps) and breaks its graph on ``find_spec`` or a cache wrapper."""
    return _TRITON_INSTALLED


def pick_config(gpu_configs_by_head_dim: Mapping[int, Config], head_dim: int, interpret_config: Config) -> Config:
    """``interpret_config`` under the interpreter, else the tuned ``gpu_configs_by_head_dim[head_dim]``."""
    return interpret_config if interpreting() else gpu_configs_by_head_dim[head_dim]


def empty(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """Allocate a kernel output buffer (uninitialised). Tests replace this to poison outputs with NaN."""
    return torch.empty(shape, dtype=dtype, device=device)


@functools.cache
def has_tma(device_index: int) -> bool:
    """Whether CUDA device ``device_index`` has the TMA unit (compute capability >= 9), asked once per device."""
    return torch.cuda.get_device_capability(device_index)[0] >= 9


def pdl_allowed() -> bool:
    """Whether programmatic dependent launch may be used at all: yes unless ``EVALSUITE_PDL=0`` (to time or debug
    the step without it; read at every launch and compile)."""
    return os.environ.get("EVALSUITE_PDL", "1") != "0"


@torch.compiler.assume_constant_result  # the GEMV dispatcher asks inside compiled steps: a constant there
def pdl(device: torch.device) -> bool:
    """Whether kernels launched on ``device`` take programmatic dependent launch (``launch_pdl``, Hopper and newer):
    the GPU may start a kernel while the one before it in the stream is still running, so its launch latency and
    whatever it does before :func:`~evalsuite.kernels.jit_helpers.wait_for_previous_kernel` overlap that kernel's
    tail. A decode step is hundreds of kernels of a few microseconds each (results/decode/README.md). Never under
    the interpreter, which has no such launch, nor with :func:`pdl_allowed` false."""
    return device.type == "cuda" and not interpreting() and pdl_allowed() and has_tma(device.index or 0)


def _tma_scratch(size: int, alignment: int, stream) -> torch.Tensor:
    """Global memory for tensor descriptors built inside kernels (the ``triton.set_allocator`` callback)."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


_THREAD = threading.local()


def install_tma_allocator() -> None:
    """Give triton the scratch allocator that in-kernel descriptors need (GPU only). Triton keeps it in a context
    variable, so once per thread: cells may train in threads (evalsuite/training/pool.py)."""
    if not getattr(_THREAD, "tma_allocator", False):
        import triton

        triton.set_allocator(_tma_scratch)
        _THREAD.tma_allocator = True


class OutOfBounds(AssertionError):
    """A kernel under :func:`interpreter_bounds_check` addressed memory outside its tensor arguments."""


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """Byte range ``[lo, hi)`` spanned by the elements of a (strided) tensor view."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    lo = sum(min(0, (n - 1) * st) for n, st in zip(t.shape, t.stride(), strict=True))
    hi = sum(max(0, (n - 1) * st) for n, st in zip(t.shape, t.stride(), strict=True)) + 1
    return t.data_ptr() + lo * t.element_size(), t.data_ptr() + hi * t.element_size()


@contextlib.contextmanager
def interpreter_bounds_check(masked_lanes: bool = True) -> Iterator[None]:
    """Under ``TRITON_INTERPRET=1``: raise :class:`OutOfBounds` from the first load or store that leaves its buffer.

    Each launch inside the block registers the byte extent of every tensor argument (the view's elements, not its
    storage); each ``tl.load``/``tl.store`` must then fall wholly within one of them -- every lane, or with
    ``masked_lanes=False`` only the lanes its mask lets through (the bare out-of-bounds accesses). Checking
    masked-off lanes too holds a kernel to "no lane ever points outside its buffer", which also covers the loads a
    GPU compiler issues ahead of time for loop iterations that do not run. Patches the interpreter's internals
    (``triton.runtime.interpreter``) for the duration of the block; not thread-safe.
    """
    if not interpreting():
        raise RuntimeError("interpreter_bounds_check needs TRITON_INTERPRET=1")
    import numpy as np
    from triton.runtime import interpreter as interp

    real, init_args = interp._interpreter, interp.GridExecutor._init_args_hst
    launch: dict = {"kernel": "?", "extents": []}

    def init_args_checked(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        named = [*zip(self.arg_names, args_hst, strict=False), *kwargs_hst.items()]
        launch["kernel"] = getattr(self.fn, "__name__", "?")
        launch["extents"] = [(name, *_extent(t)) for name, t in named if isinstance(t, torch.Tensor)]
        return args_hst, kwargs_hst

    def check(kind, ptrs, mask, itemsize):
        flat = ptrs.ravel()
        on = np.broadcast_to(mask, ptrs.shape).ravel().astype(bool)
        sel = flat if masked_lanes else flat[on]
        if sel.size == 0:
            return
        lo, hi = int(sel.min()), int(sel.max()) + itemsize
        extents = launch["extents"]
        if any(a <= lo and hi <= b for _, a, b in extents):
            return
        inside = np.zeros(flat.shape, dtype=bool)
        for _, a, b in extents:
            inside |= (flat >= a) & (flat + itemsize <= b)
        outside = ~inside if masked_lanes else ~inside & on
        lane = int(np.argmax(outside)) if outside.any() else int(np.argmax(flat == lo))
        addr = int(flat[lane])
        name, a, b = min(extents, key=lambda e: min(abs(addr - e[1]), abs(addr - e[2])))
        what = "outside every argument" if outside.any() else "spanning two arguments"
        raise OutOfBounds(
            f"{launch['kernel']} program {tuple(interp.interpreter_builder.grid_idx)}: {kind} {what}, lane {lane}"
            f" ({'active' if on[lane] else 'masked off'}) at element {(addr - a) // itemsize} of {name!r}"
            f" (which has {(b - a) // itemsize})"
        )

    class Checked:
        def __getattr__(self, name):
            return getattr(real, name)

        def load(self, ptrs, mask, other, dtype):
            check("load", ptrs, mask, np.dtype(dtype).itemsize)
            return real.load(ptrs, mask, other, dtype)

        def store(self, ptrs, value, mask):
            check("store", ptrs, mask, value.dtype.itemsize)
            return real.store(ptrs, value, mask)

    interp._interpreter = Checked()
    interp.GridExecutor._init_args_hst = init_args_checked
    try:
        yield
    finally:
        interp._interpreter, interp.GridExecutor._init_args_hst = real, init_args
