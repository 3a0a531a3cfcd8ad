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


@pytest.fixture(scope="module")
def gsa_paper_cell():
    """The ``gsa-paper`` MQAR preset's first cell on the GPU: (sweep, seq_len, batch, x, y, loss_fn), four batches of
    training data in x, y ``[4 * batch, seq_len]``."""
    import functools

    import torch

    from evalsuite.data.mqar import mqar_data
    from evalsuite.tasks.mqar.sweep import data_config, load_preset
    from evalsuite.training.train import IGNORE_INDEX, gathered_cross_entropy

    sweep = load_preset("gsa-paper")
    seq_len, kv = sweep.settings()[0]
    batch = sweep.batch_for(seq_len)
    data = mqar_data({**data_config(sweep, seq_len, kv), "num_train": 4 * batch, "num_test": 1})
    x, y = (torch.from_numpy(a).cuda() for a in data["train"])
    loss_fn = functools.partial(gathered_cross_entropy, labels_per_row=int((y != IGNORE_INDEX).sum(1).max()))
    return sweep, seq_len, batch, x, y, loss_fn
