"""Shared test helpers: the CLI run in this process; NaN-poisoned Triton kernel outputs; kernel modules rebuilt
for the Triton interpreter; relative error."""

import importlib
import math
import sys

import pytest


@pytest.fixture
def run_cli(monkeypatch, capsys):
    """``run_cli(args, cwd) -> (exit status, stdout, stderr)``: the console entry point, in this process."""
    from evalsuite import cli as cli_module

    def run(args, cwd):
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(sys, "argv", ["evalsuite", *map(str, args)])
        monkeypatch.setitem(cli_module._state, "debug", False)
        capsys.readouterr()
        try:
            cli_module.main()
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def assert_one_line_error(code: int, err: str, message: str) -> None:
    """Exit status 2 and exactly one stderr line, ``error: ...`` containing ``message``."""
    assert code == 2, err
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


KERNEL_GUARD = 512  # NaN elements on each side of every poisoned kernel output


@pytest.fixture
def poisoned_kernel_outputs(monkeypatch):
    """Every buffer a Triton kernel writes (``triton_utils.empty``) starts as NaN, between NaN guard bands of
    :data:`KERNEL_GUARD` elements: an element a kernel never writes, or a read past either end, shows up as NaN."""
    import torch

    from evalsuite.kernels import triton_utils

    def nan_empty(shape, dtype, device):
        n = math.prod(shape)
        flat = torch.full((n + 2 * KERNEL_GUARD,), float("nan"), dtype=dtype, device=device)
        return flat[KERNEL_GUARD : KERNEL_GUARD + n].view(shape)

    monkeypatch.setattr(triton_utils, "empty", nan_empty)


def interpreted_kernel_modules(package: str, kernels: dict) -> dict:
    """``{name: package.<name>}`` (a dotted name: that module) for every name of ``kernels`` (in dependency order,
    helpers first), built for the Triton interpreter. ``kernels[name]`` is a kernel of that module, or None for a
    module that only binds other modules' kernels. A module imported earlier without ``TRITON_INTERPRET=1`` holds
    compiled kernels (triton.jit reads the setting when decorating), so if any listed kernel is not interpreted,
    every module is reloaded."""
    modules = {name: importlib.import_module(name if "." in name else f"{package}.{name}") for name in kernels}
    if any(k and type(getattr(modules[n], k)).__name__ != "InterpretedFunction" for n, k in kernels.items()):
        modules = {name: importlib.reload(m) for name, m in modules.items()}
    return modules


def rel_err(out, ref) -> float:
    """``|out - ref| / |ref|`` (Frobenius, float64; the absolute error when ref is zero); out must be finite."""
    out, ref = out.double(), ref.double()
    assert out.isfinite().all(), "non-finite values (unwritten or overflowed)"
    den = ref.norm()
    return ((out - ref).norm() / den).item() if den > 0 else (out - ref).norm().item()
