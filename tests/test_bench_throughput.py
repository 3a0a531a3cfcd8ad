"""``evalsuite bench throughput`` on a CPU: the batch search as a pure function, the short probe, and a whole run on
the tiny cards (records, ratios, table, resume, bad input)."""

import json
import math
import statistics

import pytest
import torch
from conftest import assert_one_line_error

from evalsuite.bench import throughput as bench
from evalsuite.bench.generate_cells import load_model
from evalsuite.errors import UserError


def _search(threshold: int, limit: int, tolerance: int = 1) -> tuple[int, list[int]]:
    """The search's answer when every batch up to ``threshold`` fits, and the batches it probed."""
    probed = []

    def fits(batch):
        probed.append(batch)
        return batch <= threshold

    return bench.largest_batch(fits, limit, tolerance), probed


@pytest.mark.parametrize("limit", [1, 5, 64, 4096])
def test_the_search_finds_the_exact_largest_batch_under_the_limit(limit):
    for threshold in (0, 1, 2, 3, 5, 7, 17, 63, 64, 65, 100, 1000, 4095, 4096, 5000):
        found, probed = _search(threshold, limit)
        assert found == min(threshold, limit), (threshold, limit, probed)
        assert max(probed) <= limit and len(set(probed)) == len(probed), probed
        assert len(probed) <= 2 * math.ceil(math.log2(limit)) + 2, probed
    assert _search(10**6, 4096)[1] == [2**i for i in range(13)]  # a state that never runs out: doubling to the limit
    assert _search(0, 4096)[1] == [1]


def test_a_coarser_tolerance_stops_the_bisection_early():
    for threshold in (3, 100, 1000, 3000):
        exact = _search(threshold, 4096)
        for tolerance in (2, 8, 64):
            found, probed = _search(threshold, 4096, tolerance)
            assert threshold - tolerance < found <= threshold and len(probed) <= len(exact[1]), (threshold, tolerance)
    assert _search(1000, 4096, 64)[0] == 960 and len(_search(1000, 4096, 64)[1]) == 14  # 11 doublings, 3 halvings
    with pytest.raises(ValueError, match="at least 1"):
        bench.largest_batch(lambda b: True, 0)


def test_out_of_memory_is_told_apart_from_other_errors():
    assert bench._out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert bench._out_of_memory(RuntimeError("CUDA error: operation failed due to a previous error during capture"))
    assert not bench._out_of_memory(ValueError("out of memory"))
    assert not bench._out_of_memory(RuntimeError("shape mismatch"))


@pytest.mark.parametrize("name", ["tnl-tiny", "transformer-llama-tiny"])
def test_a_short_probe_holds_the_whole_calls_state_and_stops_after_its_tokens(name, monkeypatch):
    """The probe's decode state is sized for L + N positions, as the whole call's is, and the call stops once it has
    made PROBE_TOKENS tokens (one LM-head pass per token: the prefill's and each step's)."""
    adapter = load_model(name, "cpu", "float32", "random")
    model, path = adapter.model, bench.resolve_path(adapter, "static")
    capacities, heads = [], []
    static_decoder, logits = model.static_decoder, model.logits
    monkeypatch.setattr(model, "static_decoder", lambda b, cap, start=None: capacities.append(cap) or
                        static_decoder(b, cap, start))  # fmt: skip
    monkeypatch.setattr(model, "logits", lambda h: heads.append(1) or logits(h))
    call = bench._Caller(adapter, path, length=24, new_tokens=12, seed=0)
    ids = call.ids(3)
    assert ids.shape == (3, 24) and int(ids.max()) < min(adapter.tokenizer.vocab_size, model.vocab_size)
    assert call(ids, bench.PROBE_TOKENS) is None
    assert capacities == [24 + 12] and len(heads) == bench.PROBE_TOKENS
    whole = call(ids)
    assert capacities == [36, 36] and len(heads) == bench.PROBE_TOKENS + 12
    assert [len(g.token_ids) for g in whole] == [12] * 3
    assert bench.resolve_path(adapter, "auto") == "eager"  # the CPU's path
    with pytest.raises(UserError, match="'graph' cannot run for .*needs CUDA"):
        bench.resolve_path(adapter, "graph")


TINY = dict(models=["transformer-llama-tiny", "tnl-tiny"], length=16, new_tokens=8, attempts=2, batch_limit=5,
            path="static", device="cpu", verbose=False)  # fmt: skip


def _check_record(r: dict, length: int, new_tokens: int) -> None:
    assert r["status"] == "ok" and r["path"] == "static" and r["probe"] == f"first {bench.PROBE_TOKENS} tokens"
    assert r["batch"] == 5 and r["at_limit"] and [p["batch"] for p in r["probes"]] == [1, 2, 4, 5]
    assert all(p["fits"] and p["seconds"] > 0 for p in r["probes"]) and r["search_s"] > 0
    B, seconds = r["batch"], r["seconds"]
    assert len(seconds) == 2 and r["tokens_made"] == B * new_tokens
    generated = [B * new_tokens / s for s in seconds]
    assert r["generated_tokens_per_s"] == pytest.approx(statistics.fmean(generated))
    assert r["generated_tokens_per_s_std"] == pytest.approx(statistics.stdev(generated))
    assert r["generated_tokens_per_s_median"] == pytest.approx(statistics.median(generated))
    assert r["total_tokens_per_s"] == pytest.approx(statistics.fmean(B * (length + new_tokens) / s for s in seconds))
    assert r["env"]["device"] == "cpu" and r["env"]["git_commit"] and r["env"]["torch"] == torch.__version__
    assert r["params"] > 0 and r["state_bytes"] > 0 and "peak_mem_mib" not in r  # device memory is CUDA's


def test_a_run_records_each_model_against_the_baseline_and_resumes(tmp_path):
    records = bench.bench_throughput(tmp_path, baseline="tnl-tiny", **TINY)
    assert [r["model"] for r in records] == TINY["models"]
    llama, tnl = records
    for r in records:
        _check_record(r, 16, 8)
    assert tnl["ratio_generated"] == 1.0 and tnl["ratio_total"] == 1.0
    assert llama["ratio_generated"] == pytest.approx(llama["generated_tokens_per_s"] / tnl["generated_tokens_per_s"])
    assert llama["baseline"] == "tnl-tiny" and llama["attempts"] == 2 and llama["length"] == 16
    lines = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [line["key"] for line in lines] == ["tnl-tiny", "transformer-llama-tiny"]  # the baseline first
    doc = json.loads((tmp_path / bench.JSON_NAME).read_text())
    assert doc["env"]["device"] == "cpu" and [r["model"] for r in doc["records"]] == TINY["models"]
    table = (tmp_path / bench.MD_NAME).read_text()
    assert "| transformer-llama-tiny |" in table and "| static | ≥5 |" in table and "× tnl-tiny" in table

    # a rerun skips the models it holds and measures a new one only
    again = bench.bench_throughput(tmp_path, baseline="tnl-tiny", **{**TINY, "models": [*TINY["models"], "gsa-tiny"]})
    assert [r["seconds"] for r in again[:2]] == [llama["seconds"], tnl["seconds"]]
    assert again[2]["model"] == "gsa-tiny" and again[2]["status"] == "ok" and "ratio_generated" in again[2]
    with pytest.raises(UserError, match="holds a run with other settings .*attempts 2 there vs 3"):
        bench.bench_throughput(tmp_path, baseline="tnl-tiny", **{**TINY, "attempts": 3})


def test_bad_input_is_one_line(run_cli, tmp_path):
    cmd = ["bench", "throughput", "--out", tmp_path / "out", "--device", "cpu", "--model", "tnl-tiny"]
    code, _, err = run_cli([*cmd, "--baseline", "gsa-tiny"], tmp_path)
    assert_one_line_error(code, err, "--baseline gsa-tiny is not one of the models (tnl-tiny)")
    code, _, err = run_cli([*cmd, "--path", "fast"], tmp_path)
    assert_one_line_error(code, err, "unknown --path 'fast'")
    code, _, err = run_cli([*cmd, "--model", "hf:/some/dir"], tmp_path)
    assert_one_line_error(code, err, "measures our own models (cards)")
    code, _, err = run_cli([*cmd, "--model", "no-such-card"], tmp_path)
    assert code == 2 and "no-such-card" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
