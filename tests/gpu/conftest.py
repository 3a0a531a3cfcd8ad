"""The GPU tests (``pytest -m gpu tests/gpu`` on a CUDA machine): the kernels compiled for the GPU, at real shapes.

Every test here carries the ``gpu`` marker. They are skipped where no CUDA device is visible, and in a session that
runs the kernels under the Triton interpreter (the CPU tests' setting, tests/conftest.py: any run not selecting
``-m gpu``). Tests comparing with fla skip where fla does not import.
"""

import os
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        reason = "no CUDA device"
    elif os.environ.get("TRITON_INTERPRET") == "1":
        reason = "the kernels run under the Triton interpreter in this session: run pytest -m gpu tests/gpu"
    else:
        return
    for item in items:
        if HERE in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=reason))
