"""``evalsuite bench tune KERNEL``: the launch-config sweeps of our Triton kernels, and fla's autotuning warm-up.

Each kernel's module times candidate settings passed to the launchers as arguments (the shipped tables are read,
never written) and returns ``{"records": [...], "best": ...}``: every candidate's time and the fastest settings,
which :func:`run_tune` prints and writes, with the run's provenance, to ``OUT/tune_<kernel>.json``. To ship a
winner, put it in the kernel family's ``common.py``.
"""

from __future__ import annotations

import importlib
import inspect
import json
from pathlib import Path

from evalsuite.errors import UserError

# The sweeps that also run under the Triton interpreter on a CPU (tiny shapes, for their tests).
INTERPRETABLE = ("forgetting-decode", "forgetting-tma", "lightning")
# kernel -> (module, function) under evalsuite.bench.tune
KERNELS = {
    "forgetting": ("forgetting", "tune"),
    "forgetting-decode": ("forgetting", "tune_decode"),
    "forgetting-tma": ("forgetting_tma", "tune"),
    "gsa": ("gsa", "tune"),
    "lightning": ("lightning", "tune"),
    "gca": ("gca", "tune"),
    "fla": ("fla", "tune"),
}


def tuner(kernel: str):
    """The sweep function of ``kernel`` (a UserError naming the choices for any other)."""
    if kernel not in KERNELS:
        raise UserError(f"unknown kernel {kernel!r}; choose from {', '.join(KERNELS)}")
    module, name = KERNELS[kernel]
    return getattr(importlib.import_module(f"evalsuite.bench.tune.{module}"), name)


def run_tune(kernel: str, out=None, **options) -> dict:
    """Run ``kernel``'s sweep with ``options`` (only those it takes: a UserError names any other), print the best
    settings and, with ``out``, write everything to ``out/tune_<kernel>.json``. Returns the report."""
    import torch

    from evalsuite.bench.common import env_info
    from evalsuite.kernels.triton_utils import interpreting

    fn = tuner(kernel)
    accepted = inspect.signature(fn).parameters
    unknown = [k for k in options if k not in accepted]
    if unknown:
        raise UserError(f"bench tune {kernel} takes no {', '.join('--' + k.replace('_', '-') for k in unknown)}")
    if not torch.cuda.is_available() and not (kernel in INTERPRETABLE and interpreting()):
        raise UserError(f"bench tune {kernel} needs a CUDA GPU")
    report = {"kernel": kernel, "env": env_info(), "options": options, **fn(**options)}
    print(f"best {kernel}:", json.dumps(report["best"], default=str), flush=True)
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"tune_{kernel.replace('-', '_')}.json"
        path.write_text(json.dumps(report, indent=1, default=str) + "\n")
        report["path"] = str(path)
    return report
