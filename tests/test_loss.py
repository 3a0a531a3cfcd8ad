"""Per-token loss task: outputs, protocol details, errors, and resume after a real kill."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.data.synthetic import synthetic_text
from evalsuite.errors import UserError
from evalsuite.tasks.loss import LossConfig, eval_lengths, run_loss

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def adapter():
    return NativeAdapter(load_card("fox-pro-tiny"), device="cpu")


def write_docs(folder, n, words=400, seed=0):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"doc{i:03d}.txt").write_text(synthetic_text(words, seed + i))
    return folder


def test_outputs_and_protocol(adapter, tmp_path):
    data = write_docs(tmp_path / "docs", 3)
    (tmp_path / "docs" / "short.txt").write_text("far too short")
    res = run_loss(adapter, LossConfig(data=str(data), length=100), tmp_path / "run", progress=False)
    assert res["summary"]["documents"] == {"used": 3, "skipped_too_short": 1}
    z = np.load(tmp_path / "run" / "loss_per_token.npz")
    assert z["loss_per_token"].shape == (100,) and z["loss_per_token"].dtype == np.float64
    assert (z["count"] == 3).all()
    lengths = sorted({r["length"] for r in res["records"]})
    assert lengths == [1, 2, 4, 8, 16, 32, 64, 100] == eval_lengths(100)
    rec = {(r["length"], r["metric"]): r["value"] for r in res["records"]}
    assert rec[(64, "loss")] == pytest.approx(z["loss_per_token"][:64].mean())
    assert rec[(64, "perplexity")] == pytest.approx(math.exp(rec[(64, "loss")]))
    for key in ("git_commit", "torch", "checkpoint_sha256", "tokenizer", "card", "seed"):
        assert key in res["provenance"]
    assert res["train_length"] == 2048 and not (tmp_path / "run" / "state.npz").exists()

    # Position i is scored on x_i from [BOS, x_0 .. x_{i-1}]: recompute the first document by hand.
    tok = adapter.tokenizer
    x = tok.encode((data / "doc000.txt").read_text(), add_bos=False)[:100]
    model = adapter.model
    with torch.no_grad():
        logits = model.logits(model(torch.tensor([[tok.bos_id] + x[:-1]])))[0]
    nll0 = torch.nn.functional.cross_entropy(logits, torch.tensor(x), reduction="none").double().numpy()
    one = run_loss(adapter, LossConfig(data=str(data / "doc000.txt"), length=100), tmp_path / "one", progress=False)
    np.testing.assert_allclose(np.load(tmp_path / "one" / "loss_per_token.npz")["loss_per_token"], nll0, rtol=1e-6)
    assert one["config_hash"] != res["config_hash"]


def test_batching_roll_and_rerun(adapter, tmp_path):
    data = write_docs(tmp_path / "docs", 4)
    base = LossConfig(data=str(data), length=64)
    a = run_loss(adapter, base, tmp_path / "a", progress=False)
    run_loss(adapter, LossConfig(data=str(data), length=64, batch_size=3), tmp_path / "b", progress=False)
    la, lb = (np.load(tmp_path / d / "loss_per_token.npz")["loss_per_token"] for d in "ab")
    np.testing.assert_allclose(la, lb, rtol=1e-6)
    rolled = LossConfig(data=str(data), length=64, roll=True, seed=3)
    r1 = run_loss(adapter, rolled, tmp_path / "r1", progress=False)
    r2 = run_loss(adapter, rolled, tmp_path / "r2", progress=False)
    assert r1["records"] == r2["records"] and r1["records"] != a["records"]
    assert run_loss(adapter, base, tmp_path / "a", progress=False) == a  # a finished run is returned as is
    with pytest.raises(UserError, match="another configuration"):
        run_loss(adapter, rolled, tmp_path / "a", progress=False)


def test_max_docs_npy_and_jsonl(adapter, tmp_path):
    rng = np.random.default_rng(0)
    np.save(tmp_path / "tokens.npy", rng.integers(0, 50000, size=(5, 80)))
    res = run_loss(
        adapter, LossConfig(data=str(tmp_path / "tokens.npy"), length=80, max_docs=2), tmp_path / "n", progress=False
    )
    assert res["summary"]["documents"]["used"] == 2
    lines = [json.dumps({"text": synthetic_text(300, i)}) for i in range(2)]
    (tmp_path / "docs.jsonl").write_text("\n".join(lines) + "\n")
    res = run_loss(adapter, LossConfig(data=str(tmp_path / "docs.jsonl"), length=50), tmp_path / "j", progress=False)
    assert res["summary"]["documents"]["used"] == 2


def test_input_errors(adapter, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no documents"):
        run_loss(adapter, LossConfig(data=str(tmp_path / "empty"), length=64), tmp_path / "r", progress=False)
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9 au lait")
    with pytest.raises(UserError, match="not valid UTF-8"):
        run_loss(adapter, LossConfig(data=str(tmp_path / "bad.txt"), length=4), tmp_path / "r", progress=False)
    with pytest.raises(UserError, match="exceed"):
        run_loss(adapter, LossConfig(data="synthetic", length=20000), tmp_path / "r", progress=False)
    (tmp_path / "short.txt").write_text("tiny")
    with pytest.raises(UserError, match="no document has at least"):
        run_loss(adapter, LossConfig(data=str(tmp_path / "short.txt"), length=64), tmp_path / "r", progress=False)


def test_sums_accumulate_in_float64(adapter, tmp_path):
    """The per-position sums over many documents stay float64 (the rows scored, the running sums, the saved and
    restored state): 4,000 rows of NLL near ln 50257 sum to the exact (fsum) totals within 1e-12, where float32
    sums drift by about 1e-6 of the total."""
    from evalsuite.tasks.loss import _Batch, _nll, _State

    assert _nll(adapter, _Batch([np.arange(16, dtype=np.int64)], 1, 0)).dtype == np.float64
    rows = np.random.default_rng(0).normal(math.log(50257), 1.0, (4000, 8))
    state = _State(8)
    for start in range(0, len(rows), 100):
        chunk = rows[start : start + 100]
        state.add(chunk, _Batch([np.zeros(8, dtype=np.int64)] * len(chunk), start + len(chunk), 0))
    exact = np.array([math.fsum(column) for column in rows.T])
    assert state.sum.dtype == np.float64 and (state.count == 4000).all() and state.used == 4000
    np.testing.assert_allclose(state.sum, exact, rtol=1e-12, atol=0)
    state.save(tmp_path / "state.npz", "hash")
    restored = _State.load(tmp_path / "state.npz", 8, "hash")
    assert restored.sum.dtype == np.float64 and np.array_equal(restored.sum, state.sum)


def _cli(*args, **kw):
    return subprocess.Popen(
        [sys.executable, "-m", "evalsuite.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw
    )


def test_killed_run_resumes_to_identical_numbers(tmp_path):
    data = write_docs(tmp_path / "docs", 16, words=700)
    args = ["loss", "--model", "fox-pro-tiny", "--data", str(data), "--length", "512", "--device", "cpu"]
    ref = _cli(*args, "--out", str(tmp_path / "ref"))
    assert ref.wait(timeout=300) == 0, ref.stderr.read()

    proc = _cli(*args, "--out", str(tmp_path / "run"))
    state = tmp_path / "run" / "state.npz"
    deadline = time.time() + 120
    while time.time() < deadline:
        if state.exists():
            try:
                with np.load(state) as z:
                    if z["counters"][1] >= 4:
                        break
            except (OSError, ValueError, KeyError):
                pass  # between the atomic replace and our read; try again
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "run" / "results.json").exists(), "run finished before it could be killed"
    with np.load(state) as z:
        assert 4 <= z["counters"][1] < 16

    again = _cli(*args, "--out", str(tmp_path / "run"))
    assert again.wait(timeout=300) == 0, again.stderr.read()
    for name in ("loss_per_token", "count"):
        a = np.load(tmp_path / "ref" / "loss_per_token.npz")[name]
        b = np.load(tmp_path / "run" / "loss_per_token.npz")[name]
        assert np.array_equal(a, b), name
    ra, rb = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("ref", "run"))
    assert ra["records"] == rb["records"] and ra["config_hash"] == rb["config_hash"]


def test_the_default_length_is_the_tasks_on_every_path(tmp_path, run_cli):
    """`evalsuite run loss` and `evalsuite loss` take the window length from the task (65536, or the model's
    max_length when shorter), so they name the same run: the second returns the first's results as they are.
    The model: fox-pro-tiny's card with max_length 2048 (its own 16384 costs half a minute a window here)."""
    card = yaml.safe_load((ROOT / "models" / "fox-pro-tiny.yaml").read_text())
    (tmp_path / "fox-short.yaml").write_text(yaml.safe_dump({**card, "max_length": 2048}))
    base = ["--model", "fox-short.yaml", "--device", "cpu", "--out", "run"]
    code, _, err = run_cli(["run", "loss", *base, "--set", "max_docs=1"], tmp_path)
    assert code == 0, err
    first = json.loads((tmp_path / "run" / "results.json").read_text())
    assert first["config"]["length"] == first["max_length"] < 65536
    code, out, err = run_cli(["loss", *base, "--max-docs", "1"], tmp_path)
    assert code == 0, err
    assert f"1 windows of {first['max_length']} tokens" in out
    assert json.loads((tmp_path / "run" / "results.json").read_text()) == first
