"""The linear-op benchmark on CPU: chunked providers at tiny shapes, a fake fla for the peer plumbing, the
model-level decode-state memory, and the ``bench linear`` command."""

import functools
import json
import sys
import types

import pytest
import torch
from conftest import assert_one_line_error

from evalsuite.bench import decode as dec
from evalsuite.bench import linear, linear_ops, linear_report
from evalsuite.kernels.lightning import lightning_recurrent

TINY = dict(n_heads=2, head_dim=16, n_slots=8, tokens_per_call=256, decode_batches=(1, 2), warmup=0, rep=1,
            rounds=3, block_ms=1.0, verbose=False)  # fmt: skip
OPS_ONLY = ("fwd", "fwdbwd", "decode")


def _gsa_loop(q, k, v, s, g, scale=None, initial_state=None, output_final_state=False, **_):
    """GSA with an explicit write strength s (fla's argument list), token by token, float32."""
    B, T, H, dk = q.shape
    scale = dk**-0.5 if scale is None else scale
    if initial_state is None:
        hk = q.new_zeros(B, H, dk, g.shape[-1], dtype=torch.float32)
        hv = q.new_zeros(B, H, g.shape[-1], v.shape[-1], dtype=torch.float32)
    else:
        hk, hv = initial_state
    out = []
    for t in range(T):
        a, w = g[:, t].float().exp(), s[:, t].float()
        hk = hk * a[:, :, None, :] + k[:, t].float()[..., None] * w[:, :, None, :]
        hv = hv * a[..., None] + w[..., None] * v[:, t].float()[:, :, None, :]
        p = (scale * torch.einsum("bhk,bhkm->bhm", q[:, t].float(), hk)).softmax(-1)
        out.append(torch.einsum("bhm,bhmv->bhv", p, hv))
    return torch.stack(out, 1).to(v.dtype), ((hk, hv) if output_final_state else None)


def _simple_gla(q, k, v, g_gamma=None, scale=None, initial_state=None, output_final_state=False, **_):
    assert scale == 1.0
    return lightning_recurrent(q, k, v, -g_gamma, initial_state, output_final_state)


@pytest.fixture
def fake_fla(monkeypatch):
    """A stand-in ``fla`` package with fla 0.6.0's call signatures, computed by token loops."""
    gsa = types.SimpleNamespace(chunk_gsa=_gsa_loop, fused_recurrent_gsa=_gsa_loop)
    sgla = types.SimpleNamespace(chunk_simple_gla=_simple_gla, fused_recurrent_simple_gla=_simple_gla)
    for name, mod in {"fla": types.SimpleNamespace(__version__="fake"), "fla.ops": types.SimpleNamespace(),
                      "fla.ops.gsa": gsa, "fla.ops.simple_gla": sgla}.items():  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)


FLA_MODULES = ("fla", "fla.ops", "fla.ops.gsa", "fla.ops.simple_gla")


@pytest.fixture
def no_fla(monkeypatch):
    """fla absent whatever this machine has installed: its imports fail as for a package that is not there."""
    for name in FLA_MODULES:
        monkeypatch.setitem(sys.modules, name, None)


@pytest.fixture
def driverless_fla(monkeypatch):
    """An fla that imports but cannot launch a kernel, as fla 0.6.0 on a machine without a GPU: Triton finds no
    driver at the first call."""

    def no_driver(*args, **kwargs):
        raise RuntimeError("0 active drivers ([]). There should only be one.")

    gsa = types.SimpleNamespace(chunk_gsa=no_driver, fused_recurrent_gsa=no_driver)
    sgla = types.SimpleNamespace(chunk_simple_gla=no_driver, fused_recurrent_simple_gla=no_driver)
    for name, mod in zip(FLA_MODULES, (types.SimpleNamespace(__version__="0.6.0"), types.SimpleNamespace(), gsa, sgla),
                         strict=True):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)


def _ok(records, kind):
    return [r for r in records if r["kind"] == kind and r["status"] == "ok"]


def test_op_bench_writes_json_png_and_records(tmp_path, no_fla):
    records = linear.bench_linear(
        tmp_path, providers=linear_ops.CPU_PROVIDERS, modes=OPS_ONLY, seq_lens=(64, 128), parity_T=64, **TINY
    )
    doc = json.loads((tmp_path / linear.JSON_NAME).read_text())
    assert doc["records"] == json.loads(json.dumps(records, default=str))
    assert {"torch", "triton", "device", "git_commit", "fla"} <= set(doc["env"])
    assert doc["params"]["tokens_per_call"] == 256 and doc["params"]["seq_lens"] == [64, 128]
    assert (tmp_path / linear.PNG_NAME).stat().st_size > 10_000
    ops = [r for r in records if r["kind"] == "op"]
    assert len(ops) == 2 * 2 * 3  # modes x T x (gsa, lightning, sdpa)
    for r in ops:
        assert r["status"] == "ok", r
        assert r["B"] * r["T"] == 256 and r["ms_p20"] <= r["ms"] <= r["ms_p80"]
        assert r["tokens_per_s"] == pytest.approx(256 / (r["ms"] * 1e-3))
        assert "ratio_to_fla" not in r  # no fla here
    assert {(r["op"], r["provider"]) for r in ops} == {
        ("gsa", "gsa_chunked"), ("lightning", "lightning_chunked"), ("sdpa", "sdpa_causal"),
    }  # fmt: skip
    parity = [r for r in records if r["kind"] == "parity"]
    assert [r["status"] for r in parity] == ["unavailable: fla not installed"] * 2
    decode = _ok(records, "decode")
    assert {(r["provider"], r["batch"]) for r in decode} == {
        (p, b) for p in ("gsa_chunked", "lightning_chunked") for b in (1, 2)
    }
    gsa_state = next(r for r in decode if r["provider"] == "gsa_chunked" and r["batch"] == 2)["state_bytes"]
    assert gsa_state == 2 * 2 * (16 * 8 + 8 * 16) * 4
    summary = (tmp_path / "linear_bench.md").read_text()
    assert "T = 128" in summary and "Decode step latency" in summary


def test_fla_peers_ratios_and_parity(tmp_path, fake_fla, monkeypatch):
    """With an fla (here a fake one in fla's argument layout), ratios, parity and the fla decode ops appear."""
    monkeypatch.setattr(linear_report, "plot_linear_bench", lambda *a, **k: None)  # plotted in the test above
    providers = ("gsa_chunked", "fla_chunk_gsa", "lightning_chunked", "fla_simple_gla", "fla_recurrent_gsa",
                 "fla_recurrent_simple_gla")  # fmt: skip
    records = linear.bench_linear(
        tmp_path, providers=providers, modes=("fwd", "decode"), seq_lens=(64,), parity_T=64, **TINY
    )
    for op, ours in (("gsa", "gsa_chunked"), ("lightning", "lightning_chunked")):
        r = next(r for r in records if r["kind"] == "op" and r["provider"] == ours)
        assert r["ratio_to_fla_p20"] <= r["ratio_to_fla"] <= r["ratio_to_fla_p80"] and r["ratio_to_fla_pairs"] == 3
        p = next(r for r in records if r["kind"] == "parity" and r["op"] == op)
        assert p["status"] == "ok" and p["max_rel_err"] < 2e-2, p
        assert p["rel_err_dq"] < 2e-2 and p["rel_err_dv"] < 2e-2
        if op == "gsa":  # the chain rule through s = 1 - exp(g) is in fla's dlog_alpha
            assert p["rel_err_dlog_alpha"] < 2e-2
    assert {r["provider"] for r in _ok(records, "decode")} == {
        "gsa_chunked", "lightning_chunked", "fla_recurrent_gsa", "fla_recurrent_simple_gla"
    }  # fmt: skip
    summary = linear_report.format_summary(records, ref_T=64)
    assert "| gsa | fwd | gsa_chunked |" in summary and ("pass" in summary or "FAIL" in summary)


def test_fla_that_cannot_launch_is_recorded_not_fatal(tmp_path, driverless_fla, monkeypatch):
    """fla installed on a machine where its kernels cannot run: the run completes, our providers are timed, and
    each fla row records fla's own error (not "not installed", not a crash); no ratio to fla is made up."""
    monkeypatch.setattr(linear_report, "plot_linear_bench", lambda *a, **k: None)  # plotted in the first test
    providers = ("gsa_chunked", "fla_chunk_gsa", "lightning_chunked", "fla_simple_gla", "fla_recurrent_gsa")
    records = linear.bench_linear(
        tmp_path, providers=providers, modes=("fwd", "decode"), seq_lens=(64,), parity_T=64, **TINY
    )
    assert json.loads((tmp_path / linear.JSON_NAME).read_text())["env"]["fla"] == "0.6.0"
    no_driver = "error: RuntimeError: 0 active drivers"
    fla_rows = [r for r in records if r["provider"].startswith("fla_") or r["kind"] == "parity"]
    assert {r["kind"] for r in fla_rows} == {"op", "decode", "parity"}
    assert all(r["status"].startswith(no_driver) for r in fla_rows), fla_rows
    ours = [r for r in records if r["kind"] in ("op", "decode") and not r["provider"].startswith("fla_")]
    assert ours and all(r["status"] == "ok" and "ratio_to_fla" not in r for r in ours), ours


def test_constant_speed_target_for_both_ops():
    """tokens/s at the longest T against the shortest at a fixed B·T: >= 0.85 passes, for GSA as for Lightning; at a
    fixed B (the Lightning paper's Figure 4 sweep) T-proportional work is expected and the check is left out."""
    speeds = {("gsa", 65536): 8.4e6, ("lightning", 65536): 9.0e6}  # the short T runs at 1e7 tokens/s

    def records(batch=None):
        return [{"kind": "op", "op": op, "provider": f"{op}_triton", "mode": "fwd", "T": T, "ms": 1.0,
                 "B": batch or 65536 // T, "tokens_per_s": speeds.get((op, T), 1e7)}
                for op in ("gsa", "lightning") for T in (1024, 65536)]  # fmt: skip

    summary = linear_report.format_summary(records())
    assert "| gsa | gsa_triton | fwd | 1e+07 | 8.4e+06 | 0.84 | FAIL |" in summary
    assert "| lightning | lightning_triton | fwd | 1e+07 | 9e+06 | 0.90 | pass |" in summary
    assert "Constant speed" not in linear_report.format_summary(records(batch=1))
    assert "Time vs fla" not in summary  # no fla peer in these records


def test_fox_kv_cache_grows_linearly(tmp_path):
    records = dec.bench_state_memory(("fox-pro", "no-such-arch"), (64, 256), "tiny", prefill_chunk=128, device="cpu")
    fox = {r["context"]: r for r in records if r["arch"] == "fox-pro"}
    assert all(r["status"] == "ok" for r in fox.values()), fox
    assert [r["status"].startswith("error: UserError") for r in records if r["arch"] == "no-such-arch"] == [True] * 2
    for ctx, r in fox.items():
        assert r["state_kind"] == "kv-cache" and r["state_length"] == ctx + 1 and r["family"] == "fox"
        assert r["state_nbytes"] == r["batch"] * r["state_size"]["bytes"]
        assert r["overrides"] == {"vocab_size": 97, "hidden_size": 32, "num_layers": 2, "num_heads": 4}
    # per token: every layer keeps k and v rows (fp32 on CPU) and one fp32 log-forget per head
    per_token = 2 * (2 * 32 * 4 + 4 * 4)
    assert fox[256]["state_nbytes"] - fox[64]["state_nbytes"] == (256 - 64) * per_token


@pytest.mark.parametrize("arch", ["gsa", "tnl"])
def test_recurrent_state_is_flat(arch):
    from evalsuite.errors import UserError
    from evalsuite.models.registry import resolve_architecture

    try:
        resolve_architecture(arch)
    except UserError:
        pytest.skip(f"family {arch} is not registered")
    records = dec.bench_state_memory((arch,), (64, 256), "tiny", device="cpu")
    assert [r["status"] for r in records] == ["ok", "ok"], records
    assert records[0]["state_kind"] == records[1]["state_kind"] != "kv-cache"
    assert records[0]["state_nbytes"] == records[1]["state_nbytes"] > 0


def test_small_override_fits_heads():
    _, arch, cfg, applied = dec.model_config("fox-pro", "small")
    assert (arch, cfg.hidden_size, cfg.num_layers, cfg.num_heads) == ("fox-pro", 1024, 4, 16)
    assert applied == {"hidden_size": 1024, "num_layers": 4, "num_heads": 16}


def test_cli_bench_linear(tmp_path, run_cli, monkeypatch):
    tiny = dict(TINY, archs=("fox-pro",), contexts=(64,), model_overrides="tiny")
    monkeypatch.setattr(linear, "bench_linear", functools.partial(linear.bench_linear, **tiny))
    out = tmp_path / "bench"
    code, stdout, err = run_cli(
        ["bench", "linear", "--out", out, "--seq-lens", "64", "--ops", "lightning",
         "--providers", "lightning_chunked,sdpa_causal", "--modes", "fwd,decode,memory", "--parity-T", "0"],
        tmp_path,
    )  # fmt: skip
    assert code == 0, err
    assert "linear_bench.json" in stdout
    doc = json.loads((out / linear.JSON_NAME).read_text())
    kinds = [r["kind"] for r in doc["records"] if r["status"] == "ok"]
    assert kinds.count("op") == 2 and kinds.count("decode") == 2 and kinds.count("state_memory") == 1
    assert (out / linear.PNG_NAME).exists()
    assert doc["params"]["parity_T"] is None and "parity" not in kinds
    code, _, err = run_cli(["bench", "linear", "--out", out, "--providers", "fla_nope"], tmp_path)
    assert_one_line_error(code, err, "unknown --providers value(s) fla_nope")
    code, _, err = run_cli(["bench", "linear", "--out", out, "--parity-T", "-1"], tmp_path)
    assert_one_line_error(code, err, "--parity-T must be 0 (skip) or a length, got -1")


def test_cli_bench_profile_ops(tmp_path, run_cli):
    """``bench profile-ops`` on a CPU: every case's ops, their self times adding up to at most the case's total, the
    chunked GSA's batched products among them; ours (Triton) is recorded as unavailable off CUDA; bad names get one
    error line."""
    out = tmp_path / "prof"
    code, stdout, err = run_cli(
        ["bench", "profile-ops", "--out", out, "--seq-lens", "64", "--tokens", "128", "--calls", "2",
         "--providers", "gsa_chunked,lightning_chunked,gsa_triton"],
        tmp_path,
    )  # fmt: skip
    assert code == 0, err
    assert "profile_ops.txt" in stdout
    doc = json.loads((out / "profile_ops.json").read_text())
    assert doc["params"]["dtype"] == "float32" and doc["env"]["device"] == "cpu"
    by_case = {(r["provider"], r["mode"]): r for r in doc["records"]}
    assert set(by_case) == {
        (p, m) for p in ("gsa_chunked", "lightning_chunked", "gsa_triton") for m in ("fwd", "fwdbwd")
    }
    assert by_case["gsa_triton", "fwd"]["status"].startswith("unavailable")
    for provider in ("gsa_chunked", "lightning_chunked"):
        fwd, both = by_case[provider, "fwd"], by_case[provider, "fwdbwd"]
        assert fwd["status"] == both["status"] == "ok" and fwd["B"] == 2 and fwd["T"] == 64
        for rec in (fwd, both):
            assert 0 < sum(k["us_per_call"] for k in rec["kernels"]) <= rec["device_ms"] * 1e3 * 1.0001
    assert any(k["kernel"] == "aten::bmm" for k in by_case["gsa_chunked", "fwd"]["kernels"])
    assert "== gsa gsa_chunked fwdbwd T=64 B=2" in (out / "profile_ops.txt").read_text()
    code, _, err = run_cli(["bench", "profile-ops", "--out", out, "--providers", "fla_nope"], tmp_path)
    assert_one_line_error(code, err, "unknown op/provider/mode fla_nope")
