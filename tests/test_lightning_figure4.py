"""The Lightning paper's Figure 4 (arXiv:2405.17381 §5.1): the claims read off bench records, and the figure drawn
by `paper render` from a `bench linear` run made on the CPU at tiny lengths."""

import functools

import pytest
from conftest import assert_one_line_error

from evalsuite.bench import linear
from evalsuite.bench.lightning_claims import check_claims, loglog_slope
from evalsuite.papers.figures import bench_records

TS = (1024, 2048, 4096, 8192, 16384)


def _records(provider, op, grow, oom_from=None, mem=1.0, batch=lambda T: 1):
    """fwd and bwd records of one provider: ``ms = grow(T)``, out of memory from ``oom_from``, memory ``mem * T``."""
    out = []
    for mode in ("fwd", "bwd"):
        for T in TS:
            rec = {"kind": "op", "op": op, "provider": provider, "mode": mode, "T": T, "B": batch(T), "H": 16, "D": 64}
            if oom_from is not None and T >= oom_from:
                out.append({**rec, "status": "oom"})
            else:
                out.append({**rec, "status": "ok", "ms": grow(T), "peak_mem_mib": mem * T, "saved_mib": mem * T})
    return out


def _paper_like(lightning_grow=lambda T: 1e-3 * T):
    vanilla = _records("lightning_vanilla", "lightning", lambda T: 1e-5 * T * T + 0.01, oom_from=8192, mem=50.0)
    flash = _records("sdpa_flash", "sdpa", lambda T: 1e-6 * T * T, mem=2.0)
    return _records("lightning_triton", "lightning", lightning_grow, mem=1.0) + flash + vanilla


def test_slope_is_fitted_over_the_longer_half():
    assert loglog_slope([(T, 5.0 + 1e-3 * T * T) for T in TS])[0] == pytest.approx(2.0, abs=0.05)
    assert loglog_slope([(T, 0.02) for T in TS[:2]] + [(T, 1e-5 * T) for T in TS[2:]])[1:] == (4096, 16384)
    assert loglog_slope([(1024, 1.0)]) is None


def test_the_claims_agree_with_curves_of_the_papers_shape():
    verdicts = [c["agrees"] for c in check_claims(_paper_like())]
    assert verdicts == [True, True, True, True, True]
    vanilla = check_claims(_paper_like())[3]["ours"]
    assert "out of memory from T = 8192 (ran up to 4096)" in vanilla


def test_the_claims_disagree_with_curves_of_another_shape():
    quadratic = _paper_like(lightning_grow=lambda T: 1e-6 * T * T)
    assert [c["agrees"] for c in check_claims(quadratic)][0] is False
    no_oom = [r for r in _paper_like() if not (r["provider"] == "lightning_vanilla" and r["status"] == "oom")]
    assert check_claims(no_oom)[3]["agrees"] is False
    heavy = [{**r, "peak_mem_mib": r["peak_mem_mib"] * 10} if r["provider"] == "lightning_triton" else r
             for r in _paper_like()]  # fmt: skip
    assert check_claims(heavy)[4]["agrees"] is False


def test_growth_is_not_judged_at_fixed_tokens_per_call():
    records = _records("lightning_triton", "lightning", lambda T: 1.0, batch=lambda T: 65536 // T)
    growth = check_claims(records)[0]
    assert growth["agrees"] is None and "--batch" in growth["ours"]


@pytest.fixture
def tiny_linear(monkeypatch):
    tiny = dict(n_heads=2, head_dim=16, parity_T=None, block_ms=1.0, warmup=0, verbose=False)
    monkeypatch.setattr(linear, "bench_linear", functools.partial(linear.bench_linear, **tiny))


def test_figure4_rendered_from_a_cpu_bench_run(tmp_path, run_cli, tiny_linear):
    results = tmp_path / "results"
    code, stdout, err = run_cli(
        ["bench", "linear", "--out", results / "fig4", "--ops", "lightning", "--modes", "fwd,bwd", "--batch", "2",
         "--providers", "lightning_chunked,lightning_vanilla,sdpa_flash", "--seq-lens", "32,64", "--rounds", "2"],
        tmp_path,
    )  # fmt: skip
    assert code == 0, err
    summary = (results / "fig4" / "linear_bench.md").read_text()
    assert "Figure 4 (§5.1)" in summary and "Series: Lightning = `lightning_chunked`" in summary
    timed = bench_records(results, ops=["lightning", "sdpa"])
    assert {(r["provider"], r["mode"], r["B"]) for r in timed} == {
        (p, m, 2) for p in ("lightning_chunked", "lightning_vanilla", "sdpa_flash") for m in ("fwd", "bwd")
    }  # fmt: skip
    code, stdout, err = run_cli(["paper", "render", "lightning:figure4", "--results", results, "--out", "figs"],
                                tmp_path)  # fmt: skip
    assert code == 0, err
    assert "measured by: evalsuite bench linear --ops lightning" in stdout
    assert stdout.count('claim (§5.1) "') == 5 and "fwd slope" in stdout
    assert (tmp_path / "figs" / "lightning-figure4.png").stat().st_size > 20_000


def test_figure4_without_records_says_what_to_run(tmp_path, run_cli):
    code, stdout, err = run_cli(["paper", "render", "lightning:figure4", "--results", tmp_path, "--out", "figs"],
                                tmp_path)  # fmt: skip
    assert code == 0 and "no records of that command" in stdout
    assert "figure not drawn: no Lightning Figure 4 records" in err


def test_bad_rounds_and_batch_are_one_line_errors(tmp_path, run_cli):
    code, _, err = run_cli(["bench", "linear", "--out", tmp_path, "--rounds", "0"], tmp_path)
    assert_one_line_error(code, err, "--rounds must be at least 1")
    code, _, err = run_cli(["bench", "linear", "--out", tmp_path, "--batch", "0"], tmp_path)
    assert_one_line_error(code, err, "--batch must be at least 1")
