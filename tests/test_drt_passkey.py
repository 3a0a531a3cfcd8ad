"""The DRT token-level multi-hop passkey (arXiv:2410.01651 §4.3): sample layout, teacher-forced scoring, runs."""

import json

import numpy as np
import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.data.passkey import drt_sample, passkey_sample
from evalsuite.errors import UserError
from evalsuite.tasks.drt_passkey import DrtConfig, drt_scores, run_drt_passkey
from evalsuite.tokenizers import get_tokenizer


@pytest.fixture(scope="module")
def adapter():
    return NativeAdapter(load_card("fox-pro-tiny"), device="cpu")


def _window(n, seed=1):
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50000, size=n)]


def test_drt_sample_layout():
    tok = get_tokenizer("gpt2")
    enc = lambda s: tok.encode(s, add_bos=False)  # noqa: E731
    assert len(enc("is")) == 1 and len(enc(",")) == 1
    L = 512
    s = drt_sample(_window(L), tok, np.random.default_rng(0))
    v = s.values
    assert len(v) == 6 and all(len(x) == 5 for x in v)
    assert s.answer_len == 11 and len(s.input_ids) == L - 64 + 11 + 1  # up to DRT's final_pos, inclusive
    assert s.input_ids[L - 64] == enc("is")[0]  # "is" starts the last 64-token chunk
    assert s.input_ids[s.answer_start :] == v[1] + enc(",") + v[2]
    query = enc("|The path from") + v[0] + enc("is")
    assert s.input_ids[s.query_start : s.answer_start] == query
    expected = [(0, 1), (1, 2), (3, 4), (4, 5)]  # chain hops, then the distractor chain
    for start, (a, b) in zip(s.needle_starts, expected, strict=True):
        needle = enc("|DEF") + v[a] + enc("->") + v[b] + enc("|")
        assert s.input_ids[start : start + len(needle)] == needle
        assert start + len(needle) <= s.query_start
    # BOS stays first when the tokenizer adds one.
    bos = drt_sample([50256] + _window(L - 1), tok, np.random.default_rng(0), keep_prefix=1)
    assert bos.input_ids[0] == 50256 and min(bos.needle_starts) >= 1
    with pytest.raises(UserError, match="multiple of the chunk"):
        drt_sample(_window(500), tok, np.random.default_rng(0))


class _Oracle:
    """An adapter whose greedy prediction is the true next token of the samples, except where told otherwise."""

    def __init__(self, samples, wrong_positions=()):
        self.full = torch.tensor([s.input_ids for s in samples])
        self.wrong = set(wrong_positions)

    def token_argmax(self, ids):
        assert torch.equal(ids, self.full[:, :-1])  # teacher forcing: the inputs stop before the last answer token
        pred = self.full[:, 1:].clone()
        for t in self.wrong:
            pred[:, t] = -1
        return pred


def test_drt_teacher_forced_scores():
    tok = get_tokenizer("gpt2")
    samples = [drt_sample(_window(256, i), tok, np.random.default_rng(i)) for i in range(2)]
    last = len(samples[0].input_ids) - 2  # the input position that predicts the last answer token
    right = drt_scores(_Oracle(samples), samples)
    assert [r["accuracy"] for r in right] == [1, 1] and right[0]["answer_exact"] == 1
    last_wrong = drt_scores(_Oracle(samples, [last]), samples)[0]
    assert last_wrong["accuracy"] == 0 and last_wrong["answer_token_acc"] == pytest.approx(10 / 11)
    first_wrong = drt_scores(_Oracle(samples, [samples[0].answer_start - 1]), samples)[0]
    assert first_wrong["accuracy"] == 1 and first_wrong["answer_exact"] == 0  # DRT's rule checks only the last


def test_token_argmax_matches_logits(adapter):
    ids = torch.tensor([_window(40, 3)])
    with torch.no_grad():
        logits = adapter.model.logits(adapter.model(ids))
    assert torch.equal(adapter.token_argmax(ids), logits.argmax(-1))


def test_drt_run(adapter, tmp_path):
    config = DrtConfig(lengths=[256, 512], samples=3)
    res = run_drt_passkey(adapter, config, tmp_path / "drt", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "drt" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["subtask"] for r in rows} == {"2hop-drt"}
    assert all(len(r["prediction"]) == len(r["answer"]) == 11 for r in rows)
    assert {r["metric"] for r in res["records"]} == {"accuracy", "answer_token_acc", "answer_exact"}
    assert all(r["n"] == 3 and r["depth"] is None for r in res["records"])
    assert res["summary"]["label"] == "2hop-drt" and res["task"] == "drt-passkey"
    assert res["config"]["lengths"] == [256, 512] and res["config"]["samples"] == 3
    again = run_drt_passkey(adapter, config, tmp_path / "drt", progress=False)
    assert (
        again["records"] == res["records"] and len((tmp_path / "drt" / "records.jsonl").read_text().splitlines()) == 6
    )


def test_passkey_sample_layout():
    """DRT §4.2 (the released PasskeyRetrieval layout): needle two chunks clear of the end, "is" starting the last
    64-token chunk, the key right after it; DRT scores the first key token."""
    tok = get_tokenizer("gpt2")
    enc = lambda s: tok.encode(s, add_bos=False)  # noqa: E731
    L = 512
    s = passkey_sample(_window(L), tok, np.random.default_rng(0))
    (key,) = s.values
    needle = enc("|") + enc("The passkey is:") + key + enc("|")
    question = enc("|What is the passkey? The passkey is")
    assert len(key) == 5 and s.scored == 0 and s.answer_len == 5
    (at,) = s.needle_starts
    assert s.input_ids[at : at + len(needle)] == needle and at + len(needle) <= L - 2 * 64
    assert s.input_ids[s.query_start : s.answer_start] == question
    assert s.answer_start == L - 64 + 1 and s.input_ids[L - 64] == question[-1] == enc(" is")[0]
    assert s.input_ids[s.answer_start :] == key and len(s.input_ids) == L - 64 + 1 + 5
    samples = [passkey_sample(_window(L, i), tok, np.random.default_rng(i)) for i in range(2)]
    second_wrong = drt_scores(_Oracle(samples, [samples[0].answer_start]), samples)[0]
    assert second_wrong["accuracy"] == 1 and second_wrong["answer_exact"] == 0  # DRT's rule checks the first token
    first_wrong = drt_scores(_Oracle(samples, [samples[0].answer_start - 1]), samples)[0]
    assert first_wrong["accuracy"] == 0
    with pytest.raises(UserError, match="multiple of the chunk"):
        passkey_sample(_window(500), tok, np.random.default_rng(0))


def test_passkey_run(adapter, tmp_path):
    res = run_drt_passkey(adapter, DrtConfig(lengths=[256], samples=2, kind="passkey"), tmp_path / "pk", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "pk" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["subtask"] for r in rows} == {"passkey-drt"} and res["config"]["kind"] == "passkey"
    assert all(len(r["prediction"]) == 5 for r in rows) and res["summary"]["label"] == "passkey-drt"
    assert "kind" not in run_drt_passkey(adapter, DrtConfig(lengths=[256], samples=1), tmp_path / "2h", False)["config"]
    with pytest.raises(UserError, match="unknown DRT test"):
        run_drt_passkey(adapter, DrtConfig(lengths=[256], samples=1, kind="3hop"), tmp_path / "x", False)


def test_passkey_command(tmp_path, run_cli):
    args = ["passkey", "--model", "fox-pro-tiny", "--device", "cpu", "--kind", "passkey", "--lengths", "256",
            "--samples", "2", "--out", "pk"]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    rows = [json.loads(x) for x in (tmp_path / "pk" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and {r["subtask"] for r in rows} == {"passkey-drt"} and "NIAH passkey-drt" in out
