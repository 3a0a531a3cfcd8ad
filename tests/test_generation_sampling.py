"""The sampler's per-row settings (evalsuite/generation/sampling.py, the Finisher's stop tokens and min_tokens): each
logit rule on known logits, min_p's cut, the counter-based draws (Philox's published answers, a row's draws from its
own seed, the draws' distribution, no value read on the host), and through the decode engine a row of a batch
decoding exactly as it does alone, and whole-call generate equal to the step-by-step DecodeRun."""

import math

import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation import engine, philox
from evalsuite.generation.sampling import (
    LogitRules,
    SamplerRows,
    TokenChooser,
    draw_uniforms,
    filtered_probs,
    sample_next,
)
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
    kept = filtered_probs(logits, SamplerRows.of([GenerationConfig(temperature=1.0, min_p=0.25)]))  # cut at 0.125
    assert kept[0].tolist() == pytest.approx([0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0])
    # a second row without min_p is untouched, bit for bit, by the first row's cut
    rows = [GenerationConfig(temperature=1.0, min_p=0.7), GenerationConfig(temperature=1.0)]
    both = filtered_probs(logits.repeat(2, 1), SamplerRows.of(rows))
    assert both[0].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert torch.equal(both[1], torch.softmax(logits[0], -1))


def test_philox_gives_the_published_known_answers():
    """Philox4x32-10's known-answer vectors (the Random123 library's, from the paper's authors): counter and key all
    zeros, all ones, and the digits of pi."""
    cases = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
             ((2**32 - 1,) * 4, (2**32 - 1,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
             ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
              (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]  # fmt: skip
    counters, keys, want = (torch.tensor(list(column)) for column in zip(*cases, strict=True))
    assert philox.philox4x32(counters, keys).tolist() == want.tolist()
    assert philox.seed_keys([-1, 2**32 + 5]).tolist() == [[2**32 - 1, 2**32 - 1], [5, 1]]  # two's complement


def choices(chooser, logits):
    """The chooser's tokens ``[steps, B]`` for logits ``[steps, B, V]``, one call per step."""
    return torch.stack([chooser(step) for step in logits])


def chooser(config, batch=None):
    """A chooser of ``config`` (one per row, or one for ``batch`` rows) over a vocabulary of 1000, on the CPU."""
    prompts = torch.zeros(batch or len(config), 1, dtype=torch.long)
    return TokenChooser(config, prompts, None, 1000, None, torch.device("cpu"))


def test_a_rows_draws_depend_on_its_seed_alone():
    """One config per row: a row's tokens equal its own alone (a greedy row among them takes the argmax). One config
    for every row: the rows draw apart, the first as a batch of one does. The uniforms of a step do not depend on
    how many steps the call makes room for."""
    logits = torch.randn(20, 3, 1000, generator=torch.Generator().manual_seed(0))
    configs = [GenerationConfig(temperature=1.0, seed=s, max_new_tokens=20) for s in (11, 12, 2**63 - 1)]
    together = choices(chooser([configs[0], GenerationConfig(max_new_tokens=20), configs[2]]), logits)
    for b in (0, 2):
        assert torch.equal(together[:, b], choices(chooser([configs[b]]), logits[:, b : b + 1])[:, 0])
    assert torch.equal(together[:, 1], logits[:, 1].argmax(-1))
    same = logits[:, :1].expand(20, 3, 1000)
    shared = choices(chooser(configs[0], batch=3), same)
    assert torch.equal(shared[:, 0], choices(chooser(configs[0], batch=1), same[:, :1])[:, 0])
    assert not torch.equal(shared[:, 0], shared[:, 1]) and not torch.equal(shared[:, 1], shared[:, 2])
    u = draw_uniforms(configs, 3, 20)
    assert torch.equal(draw_uniforms(configs, 3, 7), u[:, :7]) and 0 <= float(u.min()) and float(u.max()) < 1


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = counts.sum() * probs
    kept = expected > 0
    return float(((counts[kept] - expected[kept]) ** 2 / expected[kept]).sum())


def test_draws_follow_the_filtered_probabilities():
    """20,000 draws (200 rows of one config, 100 steps each) from fixed logits: their counts fit the probabilities
    after temperature and the cuts (Pearson's chi-square under the 0.1% critical value), and not the probabilities
    without them; a token the cuts remove is never drawn."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0])
    # (config, the chi-square's 0.1% critical value at its degrees of freedom: the kept tokens less one)
    for config, critical in ((GenerationConfig(temperature=0.7, seed=1, max_new_tokens=100), 24.32),  # 7 df
                             (GenerationConfig(temperature=1.3, top_k=6, top_p=0.85, seed=2, max_new_tokens=100),
                              16.27)):  # fmt: skip  # 3 df: top_k cuts two tokens, top_p two more
        rows = SamplerRows.of([config] * 200)
        probs = filtered_probs(logits.expand(200, -1), rows)[0].double()
        probs = probs / probs.sum()  # top_p's cut is not renormalised: the draw scales by the row's total
        u = draw_uniforms(config, 200, 100)
        drawn = torch.cat([sample_next(logits.expand(200, -1), rows, u[:, n]) for n in range(100)])
        counts = torch.bincount(drawn, minlength=8).double()
        assert chi_square(counts, probs) < critical, (counts, probs)
        assert chi_square(counts, torch.softmax(logits.double(), -1)) > 10 * critical  # the test can tell
        assert counts[probs == 0].sum() == 0
    assert int((probs > 0).sum()) == 4  # the second config's cuts took effect


def test_the_sampled_choice_reads_nothing_on_the_host():
    """The whole choice -- logit rules, cuts, the draw, the step counter -- on the meta device, where any value read
    on the host (``.item()``, ``bool()``, ``.tolist()``, ``.cpu()``) raises: it makes no host sync on a GPU either,
    and a CUDA graph can capture it."""
    meta = torch.device("meta")
    configs = [GenerationConfig(temperature=0.9, top_k=40, top_p=0.8, min_p=0.05, seed=5, repetition_penalty=1.3,
                                min_tokens=2, stop_token_ids=[3], logit_bias={7: 1.0}),
               GenerationConfig(presence_penalty=0.5, frequency_penalty=0.2)]  # fmt: skip
    select = TokenChooser(configs, torch.zeros(2, 4, dtype=torch.long, device=meta), torch.tensor([1, 0]), 100, 0,
                          meta)  # fmt: skip
    for _ in range(3):
        tok = select(torch.empty(2, 100, device=meta))
        assert tok.device == meta and tok.shape == (2,) and tok.dtype == torch.long
    with pytest.raises(RuntimeError, match="meta"):  # what a host read does there
        bool(select.rules.made > 0)


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


@pytest.mark.parametrize("path", ["eager", "static"])
def test_generate_and_the_step_by_step_run_draw_the_same_tokens(fox, path):
    """Sampled configs, one for every row and one per row (a greedy row among them), give the same tokens through
    whole-call generate and through a DecodeRun prefilled in passes and stepped, on the eager path and the static
    decoder's; a call with room for more tokens begins with the same ones (a draw is keyed by its step)."""
    prompts = [fox.tokenizer.encode(t) for t in ("The river", "A much longer prompt that pads")]
    shared = GenerationConfig(max_new_tokens=5, temperature=1.0, top_p=0.95, seed=21, stop_at_eos=False)
    rows = [GenerationConfig(max_new_tokens=5, temperature=t, top_k=k, seed=s, stop_at_eos=False)
            for t, k, s in ((0.8, 40, 1), (0.0, 0, 0))]  # fmt: skip
    fox.decode_path = path
    try:
        for config in (shared, rows):
            want = [g.token_ids for g in fox.generate(prompts, config)]
            run = fox.decode_run(prompts, config)
            while not run.prefill(4):
                pass
            tokens = [run.next_tokens()]
            for _ in range(4):
                run.step(tokens[-1])
                tokens.append(run.next_tokens())
            assert torch.stack(tokens, 1).tolist() == want, config
        if path == "static":
            longer = fox.generate(prompts, GenerationConfig(**{**shared.__dict__, "max_new_tokens": 8}))
            assert [g.token_ids[:5] for g in longer] == [g.token_ids for g in fox.generate(prompts, shared)]
    finally:
        fox.decode_path = "auto"
