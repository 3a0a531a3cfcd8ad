"""2-hop NIAH: the text-level chained facts with a 1-hop control (the DRT passkey: test_drt_passkey.py)."""

import json

import pytest

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.data.haystack import load_haystack
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
    assert match_answer("feed the striped goat", key).match == 0  # a key word missing
    # Whole words only: a key phrase inside a longer word is not stated (substring matching would say it is).
    assert match_answer("Feed the goat.", ("goat",)).match == 1
    assert match_answer("feed the striped goats", ("goat",)).match == 0
    assert match_answer("feed the billygoat", ("goat",)).match == 0
    assert match_answer("feed the striped goats", ("the striped goat",)).match == 0
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
    assert {s["subtask"] for s in res["summary"]["within_beyond"]} == {"2hop", "1hop"}
    assert res["summary"]["label"] == "2hop"
