"""The GPU test of the decode paths (tests/gpu/test_generate.py) on a CPU: a sampled generate call is checked against
the same path's step-by-step run, whose logits are recorded per path, and a sampled float32 difference counts as a
failure unless those logits agreed (a near-tie)."""

from __future__ import annotations

import pytest
import torch
from gpu import generate_check as check

from evalsuite.cards import load_card


def test_sampled_records_carry_the_logit_gap_and_cpu_paths_agree():
    records = check.check_model(load_card("fox-pro-tiny"), "float32", [9, 4], new_tokens=6, device="cpu")
    sampled = [r for r in records if r["ending"] == "sampled" and r["path"] == "static"]
    assert len(sampled) == 1 and sampled[0]["equal_eager"] and sampled[0]["equal_stepped"]
    gaps = sampled[0]["logit_gap_eager"]
    assert len(gaps) == 2 and max(gaps) < 1e-4  # the same float32 math on one CPU, up to summation order
    assert all("logit_gap_eager" not in r for r in records if r["ending"] != "sampled")


def test_logit_gaps_stop_at_the_first_difference():
    ref = [torch.zeros(2, 5) for _ in range(4)]
    got = [torch.zeros(2, 5) for _ in range(4)]
    got[1][0, 2] = 1e-5  # row 0: a small gap before its difference at step 2
    got[3][0, 0] = 7.0  # after row 0 diverged: histories differ, not counted
    got[3][1, 1] = 0.5  # row 1 never differs: every step counts
    assert check.logit_gaps(ref, got, [2, None]) == pytest.approx([1e-5, 0.5])


def test_a_sampled_float32_difference_fails_unless_it_is_a_near_tie():
    base = {"dtype": "float32", "path": "graph", "ending": "sampled", "equal_eager": False, "equal_static": True}
    assert check.failures([{**base, "logit_gap_eager": [0.0, 2e-6]}]) == []
    assert len(check.failures([{**base, "logit_gap_eager": [0.0, 0.05]}])) == 1
    greedy = {**base, "ending": "free"}  # no logits recorded: a greedy difference always fails
    assert len(check.failures([greedy])) == 1
    assert check.failures([{**greedy, "dtype": "bfloat16"}]) == []
    # generate and the step-by-step run of one path must agree, in any dtype and on any path
    agreed = {**base, "path": "static", "dtype": "bfloat16", "equal_eager": False}
    assert check.failures([{**agreed, "equal_stepped": True}]) == []
    assert len(check.failures([{**agreed, "equal_stepped": False}])) == 1
