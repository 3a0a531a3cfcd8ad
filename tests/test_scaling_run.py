"""scripts/scaling_run.py (NIAH scaling over GPUs) on the CPU with gloo: a tiny NIAH grid plainly and under torchrun
with 1 and 2 ranks; scaling.json's fields, records equality, resume (finished runs keep their time, an unfinished one
is re-timed from scratch), one-line errors, and which fields the comparison ignores."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "scaling_run.py"
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
ARGS = ["--device", "cpu", "--model", "fox-pro-tiny", "--lengths", "256,512", "--samples", "2", "--batch-size", "1",
        "--max-new-tokens", "4", "--gpus", "2"]  # fmt: skip


def scaling_run(out: Path, *extra: str) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, SCRIPT, "--out", out, *ARGS, *extra], capture_output=True, text=True,
                          env=ENV, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("scaling_run", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    scaling_run(out)
    return out


def test_scaling_json_records_equal_and_fields(finished):
    report = json.loads((finished / "scaling.json").read_text())
    assert report["records_equal"] is True and report["mqar"] is None
    assert report["device"] == "cpu" and report["devices"] == ["cpu"] and "share" in report["note"]
    assert report["versions"]["torch"] and "triton" in report["versions"] and report["git_commit"]
    assert report["target_efficiency"] == 0.9
    niah = report["niah"]
    assert niah["config"]["lengths"] == [256, 512] and niah["config"]["depths"] == [0, 100]
    runs = {r["name"]: r for r in niah["runs"]}
    assert list(runs) == ["niah-plain", "niah-torchrun-1", "niah-torchrun-2"]  # N = 1 added to --gpus 2
    plain, one, two = runs.values()
    assert plain["kind"] == "plain" and "-m evalsuite niah" in plain["command"]
    assert "torch.distributed" not in plain["command"] and one["kind"] == "torchrun"
    assert "torch.distributed.run --standalone --nproc-per-node 2 -m evalsuite niah" in two["command"]
    for r in runs.values():
        assert r["records"] == 4 and r["wall_s"] > 0 and r["cells_per_min"] == pytest.approx(4 / (r["wall_s"] / 60))
        assert r["records_equal"] is True and r["differences"] == [] and not r["reused"]
        assert r["efficiency"] == pytest.approx(r["cells_per_min"] / (r["ranks"] * plain["cells_per_min"]))
        assert r["meets_target"] == (r["efficiency"] >= 0.9) and Path(r["run_dir"], "results.json").exists()
        assert 0 < r["execute_s"] < r["wall_s"] and r["startup_s"] == pytest.approx(r["wall_s"] - r["execute_s"])
        assert r["work_efficiency"] == pytest.approx(plain["execute_s"] / (r["ranks"] * r["execute_s"]))
    assert plain["speedup"] == 1 and two["units_per_rank"] == [2, 2] and two["balance_bound"] == 1
    assert set(two["provenance_fields_differing"]) <= {"created", "world_size", "execute_seconds"}
    md = (finished / "scaling.md").read_text()
    assert "| niah-torchrun-2 | 2 |" in md and "work efficiency" in md
    assert "share this machine's CPU cores" in md and two["command"] in md


def test_rerun_reuses_finished_runs_and_retimes_an_unfinished_one(finished):
    before = {r["name"]: r for r in json.loads((finished / "scaling.json").read_text())["niah"]["runs"]}
    # niah-torchrun-2 as a killed run leaves it: no timing, a rank file in its directory
    (finished / "logs" / "niah-torchrun-2.json").unlink()
    (finished / "runs" / "niah-torchrun-2" / "records.rank-1.jsonl").write_text('{"key": "x"}\n')
    scaling_run(finished)
    report = json.loads((finished / "scaling.json").read_text())
    after = {r["name"]: r for r in report["niah"]["runs"]}
    for name in ("niah-plain", "niah-torchrun-1"):
        assert after[name]["reused"] and after[name]["wall_s"] == before[name]["wall_s"]
    assert not after["niah-torchrun-2"]["reused"] and report["records_equal"]
    assert not (finished / "runs" / "niah-torchrun-2" / "records.rank-1.jsonl").exists()


def test_skip_niah_torchrun_1_leaves_that_run_out(finished):
    scaling_run(finished, "--skip-niah-torchrun-1")  # every run finished: reused, nothing trains again
    runs = json.loads((finished / "scaling.json").read_text())["niah"]["runs"]
    assert [r["name"] for r in runs] == ["niah-plain", "niah-torchrun-2"] and all(r["reused"] for r in runs)


def test_bad_gpus_and_a_changed_command_are_one_line_errors(script, finished, tmp_path, capsys):
    for bad in ("1,x", "0", ""):
        code = script.main(["--out", str(tmp_path), "--device", "cpu", "--gpus", bad])
        assert_one_line_error(code, capsys.readouterr().err, "--gpus takes comma-separated positive integers")
    changed = [*ARGS[:-1], "1"]
    changed[changed.index("--samples") + 1] = "3"  # another grid into the same folder
    code = script.main(["--out", str(finished), *changed])
    assert_one_line_error(code, capsys.readouterr().err, "was made by another command")


def test_comparison_ignores_time_fields_only(script, tmp_path):
    record = {"key": "c", "value": 0.5, "train_seconds": 1.0, "history": [{"step": 1, "seconds": 0.1}],
              "provenance": {"created": "t0", "device": "x"}}  # fmt: skip
    later = {"train_seconds": 2.0, "history": [{"step": 1, "seconds": 0.2}],
             "provenance": {"created": "t1", "device": "x"}}  # fmt: skip
    for name, changes in (("a", {}), ("b", later), ("c", {"value": 0.6})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "records.jsonl").write_text(json.dumps({**record, **changes}) + "\n")
        results = {"config": {}, "records": [], "summary": {}, "provenance": {"created": name}, "run_dir": name}
        (tmp_path / name / "results.json").write_text(json.dumps(results))
    assert script.compare(tmp_path / "a", tmp_path / "b")["records_equal"]
    differs = script.compare(tmp_path / "a", tmp_path / "c")
    assert not differs["records_equal"] and differs["differences"] == ["record c differs in value"]
