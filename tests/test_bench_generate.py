"""``evalsuite bench generate`` on a CPU at tiny shapes: files, records, the bandwidth bound, resume, errors."""

import json

import pytest
import torch
from conftest import assert_one_line_error

from evalsuite.bench import generate as bench
from evalsuite.errors import UserError
from evalsuite.generation.engine import StepTimer

TINY = dict(models=["fox-pro-tiny"], lengths=[128, 256], batches=[1, 2], new_tokens=16, copy_mib=8, warmup=False,
            verbose=False)  # fmt: skip


def test_bench_writes_records_table_and_plot_and_resumes(tmp_path):
    # 32 new tokens: the 16 steps between the two timed calls (~100 ms here) stand well above a busy machine's noise
    timed = {**TINY, "new_tokens": 32}
    records = bench.bench_generate(tmp_path, paths=["eager", "static", "graph"], **timed)
    for name in (bench.JSON_NAME, bench.MD_NAME, bench.PNG_NAME):
        assert (tmp_path / name).stat().st_size > 0
    doc = json.loads((tmp_path / bench.JSON_NAME).read_text())
    assert doc["env"]["device"] == "cpu" and doc["env"]["copy_bandwidth"]["bytes_per_s"] > 0
    assert doc["params"]["dtype"] == "float32" and len(doc["records"]) == len(records) == 12
    by = {(r["path"], r["length"], r["batch"]): r for r in records}
    assert all(by[("graph", L, B)]["status"] == "unavailable: needs CUDA" for L in (128, 256) for B in (1, 2))
    bw = doc["env"]["copy_bandwidth"]["bytes_per_s"]
    for path in ("eager", "static"):
        for L in (128, 256):
            for B in (1, 2):
                r = by[(path, L, B)]
                assert r["status"] == "ok" and r["tokens_made"] == 32 * B, r
                assert r["prefill_tokens_per_s"] > 0 and r["decode_tokens_per_s"] > 0
                # the bound: B tokens per (weight bytes + B * state bytes at L) / bandwidth
                assert r["state_bytes"] == 2 * (2 * L * 64 * 4 + 2 * 64 * 4 + L * 4 * 4)  # fox-pro-tiny, fp32
                assert r["bound_tokens_per_s"] == pytest.approx(B * bw / (r["weight_bytes"] + B * r["state_bytes"]))
                assert r["fraction_of_bound"] == pytest.approx(r["decode_tokens_per_s"] / r["bound_tokens_per_s"])
    adapter = bench.load_model("fox-pro-tiny", "cpu", "float32", "random")
    params = sum(p.numel() for p in adapter.model.parameters())
    assert by[("eager", 128, 1)]["weight_bytes"] == 4 * (params - 50257 * 64)  # untied: no input embedding
    table = (tmp_path / bench.MD_NAME).read_text()
    assert "## fox-pro-tiny" in table and "| eager | greedy | 128 | 1 |" in table and "unavailable: needs CUDA" in table

    # a rerun resumes: finished cells are kept as they were, new lengths are added
    again = bench.bench_generate(tmp_path, paths=["eager", "static", "graph"], **{**timed, "lengths": [128, 256, 64]})
    kept = {(r["path"], r["length"], r["batch"]): r for r in again}
    assert len(again) == 18 and all(kept[k]["total_s"] == r["total_s"] for k, r in by.items() if "total_s" in r)
    assert kept[("eager", 64, 2)]["status"] == "ok"
    with pytest.raises(UserError, match="holds a run with other settings .*new_tokens 32 there vs 18"):
        bench.bench_generate(tmp_path, **{**timed, "new_tokens": 18})


def test_cells_that_do_not_fit_are_skipped_not_run(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "free_bytes", lambda device: 2**20)  # 1 MiB free: an L = 512 cell needs ~2 MiB
    records = bench.bench_generate(tmp_path, paths=["eager"], **{**TINY, "lengths": [512]})
    assert {r["status"].split(":")[0] for r in records} == {"skipped"}
    assert "GiB free" in records[0]["status"] and "prefill_s" not in records[0]


def test_a_model_that_cannot_load_is_recorded(tmp_path):
    records = bench.bench_generate(tmp_path, paths=["eager"], **{**TINY, "models": ["no-such-card"]})
    assert len(records) == 4 and all(r["status"].startswith("error: ") for r in records)


def test_sampled_cells_are_their_own_cells(tmp_path):
    """``samplings``: a greedy and a sampled cell per (path, length, batch), each with its own record and table row;
    an earlier run's records, which name no sampling, resume as greedy ones."""
    tiny = {**TINY, "lengths": [64], "batches": [2], "new_tokens": 3}
    records = bench.bench_generate(tmp_path, paths=["eager"], samplings=["greedy", "sampled"], **tiny)
    assert sorted(r["sampling"] for r in records) == ["greedy", "sampled"]
    assert all(r["status"] == "ok" and r["tokens_made"] == 6 for r in records)
    table = (tmp_path / bench.MD_NAME).read_text()
    assert "| eager | greedy | 64 | 2 |" in table and "| eager | sampled | 64 | 2 |" in table
    assert bench._key({k: v for k, v in records[0].items() if k != "sampling"})[2] == "greedy"
    with pytest.raises(UserError, match="unknown sampling"):
        bench.bench_generate(tmp_path, samplings=["beam"], **tiny)


def test_copy_bandwidth_counts_read_and_write():
    out = bench.measure_copy_bandwidth(torch.device("cpu"), mib=4, reps=3)
    assert out["copy_mib"] == 4 and out["bytes_per_s"] == pytest.approx(2 * 4 * 2**20 / out["seconds"])


def test_cli_bench_generate(tmp_path, run_cli):
    args = ["bench", "generate", "--out", "b", "--model", "tnl-tiny", "--lengths", "64", "--batches", "1",
            "--new-tokens", "3", "--copy-mib", "4", "--no-warmup"]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    assert "generate_bench.json" in out and (tmp_path / "b" / bench.PNG_NAME).exists()
    bad_options = [(["--paths", "warp"], "unknown path(s) warp"), (["--lengths", "x"], "--lengths takes"),
                   (["--dtype", "int8"], "unknown --dtype 'int8'"), (["--new-tokens", "1"], "at least 2"),
                   (["--sampling", "beam"], "unknown sampling(s) beam")]  # fmt: skip
    for bad, message in bad_options:
        code, _, err = run_cli([*args[:3], "b2", *args[4:], *bad], tmp_path)
        assert_one_line_error(code, err, message)


def test_steps_are_also_timed_inside_the_call(tmp_path):
    """With more new tokens than the timer skips, a native model's cell carries the in-call step time too."""
    records = bench.bench_generate(tmp_path, paths=["static"], **{**TINY, "lengths": [64], "batches": [1],
                                                                   "new_tokens": 10})  # fmt: skip
    (r,) = records
    assert r["steps_in_call"] == 10 - StepTimer().skip and 0 < r["ms_per_step_in_call"] < 1e4
    in_call = 1e3 / r["ms_per_step_in_call"] / r["bound_tokens_per_s"]
    assert r["fraction_of_bound_in_call"] == pytest.approx(in_call)
    phases = r["phases_s"]  # each call by phase; the steps past the first ones only where there were any
    assert set(phases) == {"1", "5", "10"}
    assert set(phases["10"]) == {"setup", "prefill", "first_steps", "steps", "finish"}
    assert "steps" not in phases["1"] and all(v >= 0 for p in phases.values() for v in p.values())
    assert sum(phases["10"].values()) <= r["call_times_s"]["10"][-1] * 1.01  # the last repeat's phases
    assert "ms/step in call" in (tmp_path / bench.MD_NAME).read_text()


def test_each_call_is_repeated_and_timed_by_its_median(tmp_path):
    cell = {**TINY, "lengths": [64], "batches": [1], "new_tokens": 4}
    records = bench.bench_generate(tmp_path, paths=["static"], repeats=3, **cell)
    (r,) = records
    times = r["call_times_s"]
    assert r["repeats"] == 3 and set(times) == {"1", "2", "4"} and all(len(t) == 3 for t in times.values())
    assert (r["prefill_s"], r["half_s"], r["total_s"]) == tuple(sorted(times[k])[1] for k in ("1", "2", "4"))
    with pytest.raises(UserError, match="repeats"):
        bench.bench_generate(tmp_path / "x", repeats=0, **TINY)


def test_a_folder_holding_results_without_a_manifest_is_left_alone(tmp_path):
    """Its cells cannot be told apart from another run's: the run is refused rather than writing over them."""
    (tmp_path / bench.JSON_NAME).write_text('{"params": {}, "records": []}')
    with pytest.raises(UserError, match="holds run files but no run manifest"):
        bench.bench_generate(tmp_path, **TINY)
    assert [p.name for p in tmp_path.iterdir()] == [bench.JSON_NAME]


def test_a_decode_rate_the_two_calls_do_not_resolve_is_not_made_up():
    """The longer call no slower than the shorter one (noise): no rate, and why, instead of a rate from a clamped
    near-zero step time."""
    from evalsuite.bench.generate_cells import two_call_rates

    rates = two_call_rates(t1=0.5, tm=1.0, tn=2.0, m=8, n=16, batch=2)
    assert rates["ms_per_step"] == pytest.approx(125.0) and rates["decode_tokens_per_s"] == pytest.approx(16.0)
    assert rates["call_overhead_s"] == pytest.approx(1.0 - 0.5 - 7 * 0.125)
    unresolved = two_call_rates(t1=0.5, tm=1.0, tn=0.99, m=8, n=16, batch=2)
    assert "decode_tokens_per_s" not in unresolved and "not slower" in unresolved["decode_unresolved"]
