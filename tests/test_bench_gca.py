"""The GCA benchmark on CPU: the peers compute our function, the record/table/plot plumbing, the parity check under
the Triton interpreter at a tiny shape, and the one-line error of ``bench gca`` without a GPU."""

import pytest
import torch
from conftest import GCA_KERNELS, assert_one_line_error, interpreted_kernel_modules

from evalsuite.bench import gca
from evalsuite.kernels.grouped_cross.reference import gca_reference

TINY = dict(chunk=16, n_retrieved=3, n_heads=2, head_dim=16)


@pytest.fixture
def interpreted():
    pytest.importorskip("triton")
    interpreted_kernel_modules("evalsuite.kernels.grouped_cross", GCA_KERNELS)


@pytest.mark.parametrize("softmax_one", [False, True])
def test_sdpa_peer_computes_gca(softmax_one):
    """Per-chunk SDPA (zero key/value row for Softmax_1) and the reference provider agree with gca_reference."""
    x = gca.make_inputs(2, 48, dtype=torch.float32, device="cpu", **TINY)
    want = gca_reference(x["q"], x["k"], x["v"], x["w"], softmax_one=softmax_one)
    for provider in ("sdpa_chunks", "gca_reference"):
        xs = gca.provider_leaves(provider, x, softmax_one, grad=True)
        got = gca.provider_call(provider, xs, softmax_one)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        got.sum().backward()
        assert all(t.grad is not None for t in xs.values())
    assert gca.gca_flops(1, 4096, "fwd") == 4.0 * 64 * 8 * 12 * 64 * 64 * 64


def test_records_table_and_plot(monkeypatch, tmp_path, interpreted):
    """bench_one's calls (timers faked: they need CUDA), ratios, the Markdown table and the PNG."""
    monkeypatch.setattr(gca, "peak_memory_mib", lambda fn, leaves: 1.0)
    fake_ms = {"gca_triton": 1.0, "gca_reference": 4.0, "sdpa_chunks": 2.0}
    records = []
    for provider in gca.PROVIDERS:

        def timed(fn, leaves, device, warmup, rep, provider=provider):
            fn()
            return fake_ms[provider], 0.9 * fake_ms[provider], 1.1 * fake_ms[provider]

        monkeypatch.setattr(gca, "time_ms", timed)
        for mode in gca.MODES:
            records.append(gca.bench_one(provider, mode, 1, 32, True, dtype=torch.float32, shape=TINY, device="cpu"))
    assert all(r["status"] == "ok" for r in records), records
    gca.add_ratios(records)
    ours = [r for r in records if r["provider"] == "gca_triton"]
    assert all(r["ratio_to_sdpa_chunks"] == 0.5 and r["ratio_to_gca_reference"] == 0.25 for r in ours)
    assert "emulation" in next(r for r in records if r["provider"] == "sdpa_chunks")
    records.append({**gca.check_parity(1, 32, dtype=torch.float32, device="cpu", shape=TINY)})
    parity = records[-1]
    assert max(v for k, v in parity.items() if k.startswith("rel_err_")) < 1e-5, parity
    table = gca.format_markdown(records)
    assert "| fwdbwd | on | 1 | 32 | 1.000 | 4.000 | 2.000 | 0.50x | 0.25x |" in table, table
    assert "o_sdpa" in table
    gca.plot_gca_bench(records, tmp_path / "gca.png", {"device": "cpu"})
    assert (tmp_path / "gca.png").stat().st_size > 10_000


def test_bench_gca_without_gpu_is_one_line(tmp_path, run_cli, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, _, err = run_cli(["bench", "gca", "--out", "b"], tmp_path)
    assert_one_line_error(code, err, "the GCA benchmark needs a CUDA GPU")
    code, _, err = run_cli(["bench", "gca", "--softmax-one", "maybe"], tmp_path)
    assert_one_line_error(code, err, "unknown --softmax-one value(s) maybe")
