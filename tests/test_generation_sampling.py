"""The sampler's per-row settings (evalsuite/generation/sampling.py, the Finisher's stop tokens and min_tokens): each
logit rule on known logits, min_p's cut, per-row generators, and through the decode engine a row of a batch
decoding exactly as it does alone."""

import math

import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation import engine
from evalsuite.generation.sampling import LogitRules, filtered_probs, sample_next
from evalsuite.generation.types import GenerationConfig, apply_stop
from evalsuite.tokenizers import get_tokenizer

INF = float("inf")


def rules(configs, prompts, start=None, vocab=5, eos=None):
    return LogitRules(configs, torch.tensor(prompts), start, vocab, eos, torch.device("cpu"))


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    # row 0: prompt tokens 1 and 2 (and left padding of id 0, which is no prompt token); row 1: no penalty
    r = rules([GenerationConfig(repetition_penalty=2.0), GenerationConfig()], [[0, 1, 2], [3, 3, 4]],
              start=torch.tensor([1, 0]))  # fmt: skip
    logits = torch.tensor([[2.0, 2.0, -2.0, 1.0, 0.5], [2.0, 2.0, -2.0, 1.0, 0.5]])
    assert r(logits).tolist() == [[2.0, 1.0, -4.0, 1.0, 0.5], logits[1].tolist()]
    r.update(torch.tensor([3, 0]))  # an output token counts as seen too
    assert r(logits)[0].tolist() == [2.0, 1.0, -4.0, 0.5, 0.5]
    assert torch.equal(r(logits)[1], logits[1])  # a row without rules: bit for bit


def test_frequency_and_presence_penalties_count_output_tokens_only():
    r = rules([GenerationConfig(frequency_penalty=0.5, presence_penalty=1.5)], [[2, 2]])
    logits = torch.zeros(1, 5)
    assert r(logits).tolist() == [[0.0] * 5]  # prompt tokens are not output tokens
    for tok in (1, 1, 3):
        r.update(torch.tensor([tok]))
    # token 1: twice (0.5 * 2 + 1.5), token 3: once (0.5 + 1.5)
    assert r(logits).tolist() == [[0.0, -2.5, 0.0, -2.0, 0.0]]
    r = rules([GenerationConfig(frequency_penalty=-1.0)], [[0]])
    r.update(torch.tensor([4]))
    assert r(logits).tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]  # negative penalties encourage repeats


def test_logit_bias_adds_by_token_id_and_min_tokens_masks_eos_and_stop_ids():
    configs = [GenerationConfig(logit_bias={4: 3.0, 0: -1.5}), GenerationConfig(min_tokens=2, stop_token_ids=[1])]
    r = rules(configs, [[2], [2]], eos=3)
    logits = torch.ones(2, 5)
    masked = [[-0.5, 1.0, 1.0, 1.0, 4.0], [1.0, -INF, 1.0, -INF, 1.0]]
    assert r(logits).tolist() == masked
    r.update(torch.tensor([0, 0]))
    assert r(logits).tolist() == masked  # one token made: still masked
    r.update(torch.tensor([0, 0]))
    assert r(logits).tolist() == [masked[0], [1.0] * 5]  # two made: EOS and the stop id are free again
    assert rules([GenerationConfig()], [[1]]).active is False
    with pytest.raises(ValueError, match="below the vocabulary size 5"):
        rules([GenerationConfig(stop_token_ids=[5])], [[1]])


def test_min_p_keeps_tokens_of_at_least_min_p_times_the_top_probability():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = filtered_probs(logits, [GenerationConfig(temperature=1.0, min_p=0.25)])  # cut at 0.125
    assert kept[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    # a second row without min_p is untouched, bit for bit, by the first row's cut
    rows = [GenerationConfig(temperature=1.0, min_p=0.7), GenerationConfig(temperature=1.0)]
    both = filtered_probs(logits.repeat(2, 1), rows)
    assert both[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(both[1], torch.softmax(logits[0], -1))


def test_each_row_draws_from_its_own_generator():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))
    configs = [GenerationConfig(temperature=1.0, seed=s) for s in (11, 12, 13)]
    gens = [torch.Generator().manual_seed(c.seed) for c in configs]
    together = torch.stack([sample_next(logits, configs, gens) for _ in range(20)])
    for b, c in enumerate(configs):  # each row alone, with a fresh generator of its seed: the same draws
        g = torch.Generator().manual_seed(c.seed)
        alone = torch.stack([sample_next(logits[b : b + 1], [c], [g]) for _ in range(20)])
        assert torch.equal(together[:, b], alone[:, 0])
    # a greedy row among sampled ones takes the argmax and draws nothing
    mixed = [configs[0], GenerationConfig(), configs[2]]
    g0, g2 = torch.Generator().manual_seed(11), torch.Generator().manual_seed(13)
    out = sample_next(logits, mixed, [g0, torch.Generator(), g2])
    assert int(out[1]) == int(logits[1].argmax()) and out[[0, 2]].tolist() == together[0, [0, 2]].tolist()


def test_finisher_stop_token_ids_and_min_tokens():
    tok = get_tokenizer("bytes")
    rows = [[*b"ab\ncd"], [*b"xyz"], [*b"a\nb\nc"]]
    stops = [{}, {"stop_token_ids": [ord("y")]}, {"min_tokens": 3}]
    f = engine.Finisher(tok, [GenerationConfig(stop=["\n"], **extra) for extra in stops], None)
    f.feed(rows)
    assert [(g.text, g.token_ids, g.finish_reason) for g in f.generations()] == [
        ("ab", [*b"ab\n"], "stop"),
        ("x", [*b"xy"], "stop"),  # the stop token is kept in the ids, not in the text
        ("a\nb", [*b"a\nb\n"], "stop"),  # the first "\n" came before min_tokens: the second one stops
    ]
    assert apply_stop("a\nb\nc", ["\n"], after=2) == ("a\nb", True)


def test_config_validation():
    for bad in (dict(min_p=1.5), dict(repetition_penalty=0), dict(min_tokens=9, max_new_tokens=8),
                dict(stop_token_ids=[-1]), dict(logit_bias={3: math.nan})):  # fmt: skip
        with pytest.raises(ValueError):
            GenerationConfig(**bad)
    assert GenerationConfig(min_p=0.1, stop_token_ids=[2]).extras() == ["min_p", "stop_token_ids"]


@pytest.fixture(scope="module")
def fox():
    return NativeAdapter(load_card("fox-pro-tiny"), device="cpu")


ROWS = [
    GenerationConfig(max_new_tokens=6, temperature=0.9, top_k=40, seed=5, repetition_penalty=1.3, min_p=0.05),
    GenerationConfig(max_new_tokens=6, presence_penalty=1.0, frequency_penalty=0.5, logit_bias={50: 2.0}),
    GenerationConfig(max_new_tokens=6, temperature=1.2, top_p=0.8, seed=9, min_tokens=4),
]


@pytest.mark.parametrize("path", ["eager", "static"])
def test_a_row_of_a_batch_decodes_as_it_does_alone(fox, path):
    """Sampled and greedy rows with different rules and seeds, left-padded in one batch: each row's tokens equal
    its generate call alone, on the eager path and the static decoder's."""
    prompts = [fox.tokenizer.encode(t) for t in ("The river", "A much longer prompt that pads the others", "He")]
    fox.decode_path = path
    try:
        batch = fox.generate(prompts, ROWS)
        alone = [fox.generate([p], [c])[0] for p, c in zip(prompts, ROWS, strict=True)]
    finally:
        fox.decode_path = "auto"
    assert [g.token_ids for g in batch] == [g.token_ids for g in alone]
    assert all(len(g.token_ids) == 6 for g in batch)
    if path == "static":
        return
    # the rules took effect: the same prompts under default settings decode otherwise
    plain = [fox.generate([p], GenerationConfig(max_new_tokens=6, temperature=c.temperature, seed=c.seed))[0]
             for p, c in zip(prompts, ROWS, strict=True)]  # fmt: skip
    assert all(a.token_ids != b.token_ids for a, b in zip(batch, plain, strict=True))
    with pytest.raises(ValueError, match="share max_new_tokens"):
        fox.generate(prompts[:2], [ROWS[0], GenerationConfig(max_new_tokens=3)])


def test_stop_token_ids_and_min_tokens_through_the_engine(fox):
    prompt = fox.tokenizer.encode("The river was quiet and")
    free = fox.generate([prompt], GenerationConfig(max_new_tokens=8, stop_at_eos=False))[0].token_ids
    stop_id = free[2]
    (g,) = fox.generate([prompt], GenerationConfig(max_new_tokens=8, stop_token_ids=[stop_id]))
    assert (g.token_ids, g.finish_reason) == (free[:3], "stop")
    assert g.text == fox.tokenizer.decode(free[:2])
    # min_tokens: the stop id may not be made among the first 4 tokens (masked), so the greedy path changes there
    (g,) = fox.generate([prompt], GenerationConfig(max_new_tokens=8, stop_token_ids=[stop_id], min_tokens=4))
    assert g.token_ids[:2] == free[:2] and g.token_ids[2] != stop_id and stop_id not in g.token_ids[:4]
