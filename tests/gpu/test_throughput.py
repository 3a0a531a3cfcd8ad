"""``evalsuite bench throughput`` on a GPU: a short probe's peak device memory is the whole call's (the claim its
batch search rests on, evalsuite/bench/throughput.py), on the graph and static paths, and a run's records carry both
peaks. The 760M FoX (Pro) stands for the KV-cache models (the tiny FoX cards' heads are too small for its kernels)."""

import pytest

from evalsuite.bench import throughput as bench
from evalsuite.bench.generate_cells import load_model

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("path", ["graph", "static"])
@pytest.mark.parametrize("name", ["tnl-tiny", "gsa-tiny", "fox-pro"])
def test_a_short_probe_peaks_where_the_whole_call_does(name, path):
    adapter = load_model(name, "cuda", "bfloat16", "random")
    call = bench._Caller(adapter, bench.resolve_path(adapter, path), length=512, new_tokens=256, seed=0)
    short = bench._probe(call, 8, True, adapter.device)
    whole = bench._probe(call, 8, False, adapter.device)
    assert short["fits"] and whole["fits"]
    assert abs(short["peak_mib"] - whole["peak_mib"]) <= 1, (short, whole)


def test_a_run_on_the_gpu_records_the_peaks(tmp_path):
    records = bench.bench_throughput(tmp_path, models=["tnl-tiny", "gsa-tiny"], length=128, new_tokens=32,
                                     attempts=2, batch_limit=64, verbose=False)  # fmt: skip
    for r in records:
        assert r["status"] == "ok" and r["path"] == "graph" and r["batch"] == 64, r
        assert r["tokens_made"] == 64 * 32 and abs(r["peak_mem_mib"] - r["probe_peak_mib"]) <= 1, r
