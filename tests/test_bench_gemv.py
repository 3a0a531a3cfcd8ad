"""``evalsuite bench gemv`` (evalsuite/bench/gemv.py) on a CPU: the kernel interpreted at tiny maps, so only the
records' shape, the providers' numerics and the error lines are checked, not the times."""

import json

import pytest

pytest.importorskip("triton")

from evalsuite.bench.gemv import DECODE_MAPS, bench_gemv


def test_every_provider_is_timed_checked_and_compared_with_torch(tmp_path):
    records = bench_gemv(tmp_path, shapes=[(40, 64), (24, 96)], rows=(1, 3), configs=["16,32,4,1"], rounds=2,
                         calls=2, dtype="float32", verbose=False)  # fmt: skip
    providers = ["torch", "triton", "auto", "triton[16,32,4,1]"]
    assert [(r["M"], r["N"], r["provider"]) for r in records] == [
        (m, n, p) for m in (1, 3) for n in (40, 24) for p in providers
    ]
    for r in records:
        assert r["status"] == "ok" and r["us_per_call"] > 0 and r["gb_per_s"] > 0, r
        assert r["weight_bytes"] == r["N"] * r["K"] * 4 and r["calls_per_sample"] == 2
        assert r["vs_f64"]["rel"] < 1e-5 and r["vs_torch"]["rel"] < 1e-5  # float32: the kernel at tf32x3
        assert r["env"]["git_commit"]
        assert ("time_over_torch" in r) == (r["provider"] != "torch")
        if r["provider"] != "torch":
            assert r["time_over_torch_pairs"] == 2
    doc = json.loads((tmp_path / "gemv_bench.json").read_text())
    assert len(doc["records"]) == len(records)
    md = (tmp_path / "gemv_bench.md").read_text()
    assert "| 3 | 24x96 | 24 | 96 |" in md and "triton[16,32,4,1] / torch" in md


def test_the_kernel_is_unavailable_on_a_cpu_outside_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    records = bench_gemv(tmp_path, shapes=[(40, 64)], rows=(1,), rounds=1, calls=1, verbose=False)
    status = {r["provider"]: r["status"] for r in records}
    assert status["torch"] == status["auto"] == "ok" and status["triton"].startswith("unavailable")


def test_default_maps_are_the_decode_steps_maps():
    """Every default map is a weight a decode step of the card's model multiplies: a stacked map (PackedLinears), a
    linear layer outside the stacks, or the LM head (built on the meta device: shapes only)."""
    import torch

    from evalsuite.cards import load_card
    from evalsuite.training.train import build_model

    weights = set()
    for card in ("fox-pro", "gsa", "tnl"):
        with torch.device("meta"):
            model = build_model(load_card(card))
            model.pack_step()
        packs = [p for m in model.modules() if (p := getattr(m, "step_pack", None)) is not None]
        stacked = {id(lin) for p in packs for lin in p.linears.values()}
        weights |= {(card, *p.weight.shape) for p in packs}
        weights |= {(card, *m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)
                    and id(m) not in stacked}  # fmt: skip
        weights.add((card, model.cfg.vocab_size, model.cfg.hidden_size))
    assert {(name.split()[0], n, k) for name, n, k in DECODE_MAPS} == weights


@pytest.mark.parametrize("args, message", [
    (["--shapes", "40y64"], "--shapes takes NxK maps"),
    (["--shapes", "40x8"], "K >= 16"),
    (["--rows", "17"], "--rows must lie between 1 and 16"),
    (["--providers", "cublas"], "unknown provider(s) cublas"),
    (["--config", "16,32"], "a kernel config is BLOCK_N,BLOCK_K,WARPS,STAGES"),
    (["--dtype", "int8"], "--dtype must be one of"),
])  # fmt: skip
def test_bad_options_get_one_error_line(run_cli, tmp_path, args, message):
    code, out, err = run_cli(["bench", "gemv", "--out", tmp_path / "o", *args], tmp_path)
    assert code != 0 and message in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "o").exists()


def test_cli_writes_the_report(run_cli, tmp_path):
    args = ["bench", "gemv", "--shapes", "40x64", "--rows", "2", "--rounds", "1", "--calls", "1", "--providers",
            "torch,triton", "--device", "cpu", "--out", tmp_path / "o"]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0 and "wrote" in out, err
    records = json.loads((tmp_path / "o" / "gemv_bench.json").read_text())["records"]
    assert [(r["provider"], r["M"], r["status"]) for r in records] == [("torch", 2, "ok"), ("triton", 2, "ok")]
