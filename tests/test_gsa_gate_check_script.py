"""The GPU test of the GSA kernels under saturated gates (tests/gpu/test_gated_slot.py) runs its computation here
under the Triton interpreter at a small shape, so that it cannot rot between GPU runs."""

from gpu.gsa_checks import NAMES, gate_rows


def test_gate_check_on_cpu():
    rows = gate_rows(shape=(1, 40, 1, 32), regimes=("mild", "extreme"), device="cpu", overrides={"SUB": 8})
    assert [r["regime"] for r in rows] == ["mild", "extreme"]
    assert rows[1]["min_log_alpha"] < -100  # the extreme regime saturates the gates
    for row in rows:
        assert row["config"] == {"SUB": 8} and row["finite"]
        # bf16 inputs against a float64 recurrence
        assert max(row[k] for k in NAMES) < 3e-2, row
