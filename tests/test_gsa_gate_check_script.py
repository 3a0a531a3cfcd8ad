"""scripts/gpu_gsa_gate_check.py, the GPU check of the GSA kernels under saturated gates, runs here under the Triton
interpreter at a small shape, so that it cannot rot between GPU runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gate_check_script_on_cpu(tmp_path):
    out = tmp_path / "check.jsonl"
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    args = ["--out", str(out), "--label", "cpu", "--shape", "1,40,1,32", "--device", "cpu"]
    args += ["--regimes", "mild,extreme", "--config", '{"SUB": 8}']
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_gsa_gate_check.py"), *args], env=env, check=True,
                   capture_output=True, timeout=600)  # fmt: skip
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["regime"] for r in rows] == ["mild", "extreme"]
    assert rows[1]["min_log_alpha"] < -100  # the extreme regime saturates the gates
    for row in rows:
        assert row["config"] == {"SUB": 8} and row["finite"]
        # bf16 inputs against a float64 recurrence
        assert max(row[k] for k in ("o", "dq", "dk", "dv", "dlog_alpha")) < 3e-2, row
