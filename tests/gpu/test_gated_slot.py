"""Gated Slot Attention kernels on a GPU at the MQAR d = 512 cell's head dim (D = 128; B = 2, T = 256, H = 2 keep the
float64 token loop short), against a float64 recurrence: exact under saturated gates, and at large slot scores exact
in float32 while bf16 stays at the floor of one bf16 rounding of the scores. Committed H100 numbers at B = 4, T = 512,
H = 4: results/linear-kernels/gsa/ (every error at most 6.4e-3), results/linear-kernels/gsa-score-scale/h100.jsonl."""

import pytest

from gpu.gsa_checks import NAMES, gate_rows, score_scale_rows

pytestmark = pytest.mark.gpu
GRADS = ("dq", "dk", "dlog_alpha")
SHAPE = (2, 256, 2, 128)


def test_saturated_gates_stay_exact():
    rows = gate_rows(SHAPE)
    assert [r["regime"] for r in rows] == ["mild", "strong", "saturated", "extreme"]
    assert rows[-1]["min_log_alpha"] < -100
    for row in rows:
        assert row["finite"] and max(row[k] for k in NAMES) < 1e-2, row


def test_error_against_the_score_scale():
    rows = {(r["scale"], r["variant"]): r for r in score_scale_rows(SHAPE, scales=(1.0, 30.0))}
    for scale in (1.0, 30.0):
        assert max(rows[scale, "kernel-fp32"][k] for k in ("o", *GRADS)) < 1e-3
    floor_1, floor_30 = (max(rows[s, "floor-bf16-scores"][k] for k in GRADS) for s in (1.0, 30.0))
    kernel_1, kernel_30 = (max(rows[s, "kernel-bf16"][k] for k in GRADS) for s in (1.0, 30.0))
    assert kernel_1 < 1e-2 and floor_30 > 10 * floor_1
    assert kernel_30 < 5 * (floor_30 + kernel_1)
