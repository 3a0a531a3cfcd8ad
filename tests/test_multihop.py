"""2-hop NIAH: the text-level chained facts with a 1-hop control, and the DRT token-level multi-hop passkey."""

import json

import numpy as np
import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.data.haystack import load_haystack
from evalsuite.errors import UserError
from evalsuite.metrics.match import match_answer, normalize
from evalsuite.tasks import multihop
from evalsuite.tasks.niah import QUIZ, NiahConfig, run_niah, two_hop_prompts
from evalsuite.tokenizers import get_tokenizer


@pytest.fixture(scope="module")
def adapter():
    return NativeAdapter(load_card("fox-pro-tiny"), device="cpu")


def test_two_hop_item_is_seeded_and_unambiguous():
    a = multihop.two_hop_item(2000, 50, 0, seed=0)
    assert a == multihop.two_hop_item(2000, 50, 0, seed=0) and a != multihop.two_hop_item(2000, 50, 1, seed=0)
    t, d = a.target, a.distractor
    for x, y in ((t.person, d.person), (t.town, d.town)):
        assert x != y
    assert not set(t.activity.split()) & set(d.activity.split()) - {"the"}  # no shared answer word
    assert a.depth == 50 and 0 <= a.hop1_depth <= 100 and all(0 <= x <= 100 for x in a.distractor_depths)
    assert a.question(2).endswith(f"the town where {t.person} lives is") and t.town not in a.question(2)
    assert a.question(1).endswith(f"Answer: The best thing to do in {t.town} is")
    assert a.judge_question(2) == f"What is the best thing to do in the town where {t.person} lives?"
    assert t.activity in a.judge_reference(2) and t.town in a.judge_reference(2)


def test_two_hop_prompts_hide_both_chains_and_share_context():
    tok = get_tokenizer("gpt2-json")
    haystack = load_haystack("synthetic", tok, 1500)
    item = multihop.TwoHopItem(
        multihop.Chain("Ilse Szabo", "Velmora", "feed the striped goats"),
        multihop.Chain("Kaveh Ferreira", "Oskarvik", "climb the amber windmills"),
        depth=80,
        hop1_depth=20,
        distractor_depths=(50, 0),
    )
    prompts = two_hop_prompts(haystack, tok, 1500, item)
    context = prompts[2][: -len(QUIZ + item.question(2))]
    assert prompts[1] == context + QUIZ + item.question(1)  # the 1-hop control: same context
    where = [context.index(text) for text, _ in item.needles()]
    assert where[3] < where[0] < where[2] < where[1]  # depths 0 < 20 < 50 < 80
    assert len(tok.encode(prompts[2])) <= 1500


def test_match_rule():
    key = ("feed the striped goats",)
    wrong = (("climb the amber windmills",),)
    assert match_answer(" Feed the STRIPED goats! Then rest.", key, wrong).match == 1
    assert match_answer("feed the striped goat", key).match == 0  # whole words only
    late = match_answer("climb the amber windmills, or feed the striped goats", key, wrong)
    assert late.match == 0 and late.score == 1 and late.recall == 1.0  # a distractor stated first is wrong
    sf = ("eat a sandwich", "dolores park")
    assert match_answer("eat a sandwich and sit in Dolores-Park on a sunny day", sf).score == 10
    assert match_answer("sit in Dolores Park", sf).recall == pytest.approx(2 / 5)
    assert normalize("Café\u00a0NOIR—x") == "café noir x"


def test_two_hop_text_run(adapter, tmp_path):
    config = NiahConfig(mode="2hop", lengths=[600, 900], depths=[0, 100], samples=2, max_new_tokens=6)
    res = run_niah(adapter, config, tmp_path / "run", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 2 * 2 * 2 * 2  # lengths x depths x samples x (2hop, 1hop)
    assert {r["subtask"] for r in rows} == {"2hop", "1hop"}
    two = next(r for r in rows if r["subtask"] == "2hop")
    assert set(two["scores"]) == {"match", "score", "recall", "bridge_stated"}
    assert two["item"]["target"]["activity"] in two["judge_reference"]
    by_cell = {(r["subtask"], r["length"], r["depth"]): r["n"] for r in res["records"] if r["metric"] == "match"}
    assert set(by_cell.values()) == {2} and len(by_cell) == 8  # two samples per cell
    assert {s["subtask"] for s in res["summary"]} == {"2hop", "1hop"}
    assert res["label"] == "2hop"


def _window(n, seed=1):
    return [int(x) for x in np.random.default_rng(seed).integers(0, 50000, size=n)]


def test_drt_sample_layout():
    tok = get_tokenizer("gpt2")
    enc = lambda s: tok.encode(s, add_bos=False)  # noqa: E731
    assert len(enc("is")) == 1 and len(enc(",")) == 1
    L = 512
    s = multihop.drt_sample(_window(L), tok, np.random.default_rng(0))
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
    bos = multihop.drt_sample([50256] + _window(L - 1), tok, np.random.default_rng(0), keep_prefix=1)
    assert bos.input_ids[0] == 50256 and min(bos.needle_starts) >= 1
    with pytest.raises(UserError, match="multiple of the chunk"):
        multihop.drt_sample(_window(500), tok, np.random.default_rng(0))


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
    samples = [multihop.drt_sample(_window(256, i), tok, np.random.default_rng(i)) for i in range(2)]
    last = len(samples[0].input_ids) - 2  # the input position that predicts the last answer token
    right = multihop.drt_scores(_Oracle(samples), samples)
    assert [r["accuracy"] for r in right] == [1, 1] and right[0]["answer_exact"] == 1
    last_wrong = multihop.drt_scores(_Oracle(samples, [last]), samples)[0]
    assert last_wrong["accuracy"] == 0 and last_wrong["answer_token_acc"] == pytest.approx(10 / 11)
    first_wrong = multihop.drt_scores(_Oracle(samples, [samples[0].answer_start - 1]), samples)[0]
    assert first_wrong["accuracy"] == 1 and first_wrong["answer_exact"] == 0  # DRT's rule checks only the last


def test_token_argmax_matches_logits(adapter):
    ids = torch.tensor([_window(40, 3)])
    with torch.no_grad():
        logits = adapter.model.logits(adapter.model(ids))
    assert torch.equal(adapter.token_argmax(ids), logits.argmax(-1))


def test_drt_run(adapter, tmp_path):
    config = NiahConfig(mode="2hop", flavour="drt", lengths=[256, 512], samples=3)
    res = run_niah(adapter, config, tmp_path / "drt", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "drt" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and {r["subtask"] for r in rows} == {"2hop-drt"}
    assert all(len(r["prediction"]) == len(r["answer"]) == 11 for r in rows)
    assert {r["metric"] for r in res["records"]} == {"accuracy", "answer_token_acc", "answer_exact"}
    assert all(r["n"] == 3 and r["depth"] is None for r in res["records"])
    assert res["label"] == "2hop-drt" and res["config"]["depths"] == []
    with pytest.raises(UserError, match="teacher-forced"):
        run_niah(adapter, NiahConfig(mode="2hop", flavour="drt", judge="openai:x"), tmp_path / "j", progress=False)
