"""The speed figures that print no numbers (Lightning Figure 1(a), GCA Figure 3(a)): their claims read off `bench
train` records, and `paper render` drawing them from a real `bench train` run on the CPU at tiny shapes."""

import json

import pytest

from evalsuite.bench import train_speed
from evalsuite.papers import speed_claims, speed_figures

TOKENS = 131072


def _train(model, arch, tokens_per_s, lengths=(1024, 8192, 131072), tokens=TOKENS):
    """ok ``train_step`` records of one model: tokens/s ``tokens_per_s(length)`` at ``tokens`` tokens a step."""
    out = []
    for n in lengths:
        tps = tokens_per_s(n)
        out.append({"op": "train_step", "status": "ok", "model": model, "architecture": arch, "length": n,
                    "batch": max(1, tokens // n), "tokens_per_step": tokens, "tokens_per_s": tps,
                    "ms_per_step": tokens / tps * 1e3})  # fmt: skip
    return out


def test_figure1_claims_read_tnl_flat_and_llama_declining():
    records = _train("tnl", "tnl", lambda n: 30e3 - n / 1e3) + _train("llama", "transformer-llama", lambda n: 4e7 / n)
    checks = speed_claims.lightning_figure1(records)
    assert [c["agrees"] for c in checks] == [True, True]
    assert "(tnl)" in checks[0]["claim"] and "(llama)" in checks[1]["claim"]
    assert checks[0]["ours"].startswith("30.0k tokens/s at 1K, 29.9k at 128K (1.00×")
    slow = _train("tnl", "tnl", lambda n: 4e7 / n) + _train("llama", "transformer-llama", lambda n: 30e3)
    assert [c["agrees"] for c in speed_claims.lightning_figure1(slow)] == [False, False]
    mixed = _train("tnl", "tnl", lambda n: 3e4, lengths=(1024,)) + _train("tnl", "tnl", lambda n: 3e4, (2048,), 4096)
    assert "tokens per step differ" in speed_claims.lightning_figure1(mixed)[0]["ours"]
    assert speed_claims.lightning_figure1([])[0]["agrees"] is None


def test_figure3a_claim_reads_the_growth_of_time_per_sequence():
    linear = _train("drt", "drt", lambda n: 5e4)  # constant tokens/s: time per sequence grows as the length
    (check,) = speed_claims.gca_figure3a(linear)
    assert check["agrees"] is True and check["ours"].endswith("log-log slope 1.00")
    (check,) = speed_claims.gca_figure3a(_train("drt", "drt", lambda n: 1e9 / n))  # quadratic
    assert check["agrees"] is False and check["ours"].endswith("log-log slope 2.00")
    assert speed_claims.gca_figure3a(_train("x", "tnl", lambda n: 1.0))[0]["agrees"] is None


def _throughput(model, arch, tps, batch):
    return {"status": "ok", "model": model, "architecture": arch, "generated_tokens_per_s": tps, "batch": batch,
            "at_limit": batch == 4096}  # fmt: skip


def test_figure5_claim_reads_tnl_over_each_transformer():
    records = [_throughput("llama", "transformer-llama", 900.0, 150), _throughput("tnl", "tnl", 8100.0, 4096)]
    (check,) = speed_claims.lightning_figure5(records)
    assert check["agrees"] is True and "(tnl / llama)" in check["claim"]
    assert check["ours"] == ("tnl 8,100 generated tokens/s at batch ≥4096, llama 900 at batch 150: 9.00× (the "
                             "paper's largest ratio: 11×)")  # fmt: skip
    records[1]["generated_tokens_per_s"] = 450.0
    assert speed_claims.lightning_figure5(records)[0]["agrees"] is False
    assert speed_claims.lightning_figure5(records[:1])[0]["agrees"] is None


def _norm(sweep, n, d, mode, ratio):
    return {
        "op": "srmsnorm",
        "provider": "torch",
        "sweep": sweep,
        "T": n,
        "D": d,
        "mode": mode,
        "ratio_to_triton": ratio,
    }


def test_figure7_claims_read_pytorch_over_ours():
    records = [_norm("seq", n, 3072, m, 2.0) for n in (1024, 4096) for m in ("fwd", "bwd")]
    records += [_norm("dim", 4096, d, m, d / 1024) for d in (2048, 8192) for m in ("fwd", "bwd")]
    checks = speed_claims.lightning_figure7(records)
    assert [c["agrees"] for c in checks] == [True, True, True, True]
    assert checks[1]["ours"] == "fwd: PyTorch / Triton 2.00-8.00× over 4 points; faster at 4 of them"
    assert checks[3]["ours"] == "fwd: PyTorch / Triton median 2.00× over d = 2048-2048, 8.00× over d = 8192-8192"
    records[0]["ratio_to_triton"] = 0.9  # slower at one point; and no gain with the dim
    records[-1]["ratio_to_triton"] = records[-2]["ratio_to_triton"] = 1.5  # d = 8192 below d = 2048's 2.0
    assert [c["agrees"] for c in speed_claims.lightning_figure7(records)] == [True, False, False, False]
    assert speed_claims.lightning_figure7([])[0]["agrees"] is None


def test_bench_srmsnorm_and_figure7_render_on_the_interpreter(run_cli, tmp_path):
    """A real run at tiny widths on a CPU (the Triton kernels interpreted), rendered; its numbers are the
    interpreter's, so only the records' shape and the render's lines are checked."""
    bench = ["bench", "srmsnorm", "--seq-lens", "8", "--dims", "16,40", "--rounds", "2", "--providers",
             "triton,torch", "--device", "cpu", "--out", tmp_path / "results" / "s"]  # fmt: skip
    code, out, err = run_cli(bench, tmp_path)
    assert code == 0 and "wrote" in out, err
    doc = json.loads((tmp_path / "results" / "s" / "srmsnorm_bench.json").read_text())
    points = {(r["sweep"], r["T"], r["D"], r["mode"]) for r in doc["records"]}
    assert points == {(s, n, d, m) for s, n, d in [("seq", 8, 3072), ("dim", 4096, 16), ("dim", 4096, 40)]
                      for m in ("fwd", "bwd")}  # fmt: skip
    torch_rows = [r for r in doc["records"] if r["provider"] == "torch"]
    assert all(r["status"] == "ok" and r["ratio_to_triton_pairs"] == 2 and r["env"]["git_commit"] for r in torch_rows)
    code, md, err = run_cli(["paper", "render", "lightning:figure7", "--results", "results", "--out", "o"], tmp_path)
    assert code == 0, err
    assert 'claim "notable improvements in processing speed for larger dimensions (fwd)": ours fwd: PyTorch' in md
    assert (tmp_path / "o" / "lightning-figure7.png").stat().st_size > 10_000
    code, _, err = run_cli([*bench[:-2], "--providers", "cuda", "--out", "x"], tmp_path)
    assert code == 2 and "unknown provider or mode cuda" in err


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """A real `bench train` of tnl-tiny against transformer-llama-tiny on SDPA at two lengths of 128 tokens a step,
    under a results folder."""
    root = tmp_path_factory.mktemp("results")
    train_speed.bench_train(root / "bench" / "fig1", models=["transformer-llama-tiny@sdpa", "tnl-tiny"],
                            shapes=[(32, 4), (128, 1)], rounds=2, checkpoint=True, verbose=False)  # fmt: skip
    return root


def test_render_checks_and_draws_figure1_from_a_real_run(run_cli, tiny_run, tmp_path):
    code, md, err = run_cli(["paper", "render", "lightning:figure1", "--results", tiny_run, "--out", tmp_path / "o"],
                            tmp_path)  # fmt: skip
    assert code == 0, err
    assert "measured by: evalsuite bench train --model transformer-llama-385m@sdpa,tnl" in md
    assert f"our records: {tiny_run / 'bench' / 'fig1' / 'train_bench.json'}" in md
    assert 'claim "the TGS (tokens per GPU per second) for TNL remains consistently high (tnl-tiny)": ours ' in md
    assert "(transformer-llama-tiny@sdpa)" in md
    assert (tmp_path / "o" / "lightning-figure1.png").stat().st_size > 10_000
    code, listed, err = run_cli(["paper", "list", "--results", tiny_run], tmp_path)
    assert f"| bench records: {tiny_run / 'bench' / 'fig1' / 'train_bench.json'} |" in listed, err
    assert "| lightning:figure5 |" in listed and "| gpu | 0×0 | - | none |" in listed
    records, _ = speed_figures.figure_records("lightning:figure1", tiny_run)
    assert {r["attention"] for r in records} == {"sdpa", "auto"} and all(r["checkpoint"] for r in records)


def test_render_draws_figure5_from_a_real_throughput_run(run_cli, tmp_path):
    from evalsuite.bench import throughput

    models = ["transformer-llama-tiny", "tnl-tiny"]
    throughput.bench_throughput(tmp_path / "results" / "fig5", models=models, device="cpu", length=16, new_tokens=4,
                                batch_limit=2, attempts=1, verbose=False)  # fmt: skip
    code, md, err = run_cli(["paper", "render", "lightning:figure5", "--results", "results", "--out", "o"], tmp_path)
    assert code == 0, err
    assert "measured by: evalsuite bench throughput --model transformer-llama-7b,tnl-7b" in md
    assert '(tnl-tiny / transformer-llama-tiny)": ours tnl-tiny ' in md and "at batch ≥2" in md
    assert (tmp_path / "o" / "lightning-figure5.png").stat().st_size > 10_000


def test_render_without_records_names_the_command(run_cli, tmp_path):
    (tmp_path / "results").mkdir()
    code, md, err = run_cli(["paper", "render", "gca:figure3a", "--results", "results"], tmp_path)
    assert code == 0, err
    assert "measured by: evalsuite bench train --model drt-base-lm,drt" in md
    assert "no records of that command under results yet" in md
    bad = tmp_path / "results" / "x" / "train_bench.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"records": _train("drt", "drt", lambda n: 5e4)}))
    code, md, err = run_cli(["paper", "render", "gca:figure3a", "--results", "results"], tmp_path)
    assert "log-log slope 1.00: agrees" in md, err
