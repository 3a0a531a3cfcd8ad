"""Every Triton kernel must survive ``torch.compile``: Inductor re-emits a user kernel's source together with the
sources of the ``@triton.jit`` helpers it calls, each under the helper's own ``def`` name, and imports nothing
else (torch/_inductor/codegen/wrapper.py). A helper imported under another name (``in_range as _in_range``) or
reached through a module (``common.helper(...)``) is undefined there: ``NameError`` at compile time on the GPU
(the zoology-fig2 MQAR cells of Lightning Attention failed so, results/mqar/README.md). Checked here from the
kernels' bytecode, without a GPU."""

import importlib
import pkgutil
import types

import pytest

triton = pytest.importorskip("triton")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

# A kernel module imported under TRITON_INTERPRET=1 (other test files set it) holds InterpretedFunctions instead
KERNEL_TYPES = (JITFunction, InterpretedFunction)

import evalsuite.kernels  # noqa: E402


def _jit_functions():
    """(module name, name, kernel) of every jit function defined in evalsuite.kernels (autotuned ones too)."""
    for info in pkgutil.walk_packages(evalsuite.kernels.__path__, "evalsuite.kernels."):
        module = importlib.import_module(info.name)
        for name, obj in vars(module).items():
            for _ in range(3):  # Autotuner / Heuristics wrap the JITFunction in .fn
                if isinstance(obj, KERNEL_TYPES):
                    break
                obj = getattr(obj, "fn", None)
            if isinstance(obj, KERNEL_TYPES) and obj.fn.__module__ == module.__name__:
                yield module.__name__, name, obj


def test_kernels_are_found():
    names = {name for _, name, _ in _jit_functions()}
    assert {"in_range", "mm"} <= names and len(names) > 20, names


def test_jit_helpers_are_called_by_their_own_names():
    bad = []
    for module, name, fn in _jit_functions():
        for symbol in fn.fn.__code__.co_names:
            value = fn.fn.__globals__.get(symbol)
            if isinstance(value, KERNEL_TYPES) and value.fn.__name__ != symbol:
                bad.append(f"{module}.{name} calls {value.fn.__name__} as {symbol}")
            if isinstance(value, types.ModuleType) and not value.__name__.startswith("triton"):
                bad.append(f"{module}.{name} reaches into module {value.__name__} as {symbol}")
    assert not bad, bad
