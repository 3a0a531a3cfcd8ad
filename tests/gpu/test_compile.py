"""torch.compile on FoX's one-token decoding step (the ``compiled`` decode path): on CUDA the Triton decode kernel
reads the cache length on the device, so the 760M FoX (Pro)'s step compiles to one graph without a break (H100 run:
results/bench/h100/README.md and profile-step/ at commit 164742b)."""

import pytest

from gpu.compile_check import decode_step_breaks

pytestmark = pytest.mark.gpu


def test_fox_decode_step_compiles_whole():
    report = decode_step_breaks("fox-pro", "cuda", "bfloat16")
    assert report["graph_breaks"] == 0 and report["graphs"] == 1, [b["reason"][:200] for b in report["breaks"]]
