"""The GPU test of the GSA kernels' error against the slot-score scale (tests/gpu/test_gated_slot.py,
results/linear-kernels/gsa-score-scale/) runs its computation here under the Triton interpreter at a small shape:
the float32 kernels stay exact at large scores, and the bf16 kernels' gradient error sits at the order of one bf16
rounding of the scores."""

from gpu.gsa_checks import score_scale_rows

GRADS = ("dq", "dk", "dlog_alpha")


def test_score_scale_on_cpu():
    rows = {(r["scale"], r["variant"]): r for r in score_scale_rows(shape=(1, 48, 1, 16), scales=(1, 30), device="cpu")}
    assert len(rows) == 6
    for scale in (1.0, 30.0):
        assert max(rows[scale, "kernel-fp32"][k] for k in ("o", *GRADS)) < 1e-3
    # one bf16 rounding of the scores costs far more at 30x than at 1x; the bf16 kernels' error at 30x is of the
    # order of that floor plus their own error at 1x (the interpreter's bf16 rounds more than a GPU: 1.7e-2 vs 3.8e-3)
    floor_1, floor_30 = (max(rows[s, "floor-bf16-scores"][k] for k in GRADS) for s in (1.0, 30.0))
    kernel_1, kernel_30 = (max(rows[s, "kernel-bf16"][k] for k in GRADS) for s in (1.0, 30.0))
    assert floor_30 > 10 * floor_1
    assert kernel_30 < 5 * (floor_30 + kernel_1)
