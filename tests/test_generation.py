"""Adapter generation: cached greedy decoding equals uncached argmax; batching, sampling, stops, limits."""

import pytest
import torch

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.sampling import SamplerRows, draw_uniforms, sample_next
from evalsuite.generation.types import GenerationConfig, apply_stop


@pytest.fixture(scope="module", params=["fox-pro-tiny", "transformer-llama-tiny"])
def adapter(request):
    return NativeAdapter(load_card(request.param), device="cpu")


def uncached_greedy(adapter, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = adapter.model.logits(adapter.model(torch.tensor([ids])))[0, -1]
            ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


def test_greedy_matches_uncached_argmax(adapter):
    prompt = adapter.tokenizer.encode("The quick brown fox jumps over the lazy dog.")
    out = adapter.generate([prompt], GenerationConfig(max_new_tokens=12, stop_at_eos=False))[0]
    assert out.token_ids == uncached_greedy(adapter, prompt, 12)
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    assert out.text == adapter.tokenizer.decode(out.token_ids)


def test_batched_left_padded_equals_one_by_one(adapter):
    tok = adapter.tokenizer
    prompts = [tok.encode("A short one."), tok.encode("A much longer prompt that needs padding in a batch, surely.")]
    cfg = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    batched = adapter.generate(prompts, cfg)
    for prompt, out in zip(prompts, batched, strict=True):
        assert out.token_ids == adapter.generate([prompt], cfg)[0].token_ids


def test_sampling_is_seeded(adapter):
    prompt = adapter.tokenizer.encode("Once upon a time")
    cfg = dict(max_new_tokens=10, temperature=1.0, top_p=0.95, stop_at_eos=False)
    a = adapter.generate([prompt], GenerationConfig(seed=1, **cfg))[0].token_ids
    b = adapter.generate([prompt], GenerationConfig(seed=1, **cfg))[0].token_ids
    c = adapter.generate([prompt], GenerationConfig(seed=2, **cfg))[0].token_ids
    assert a == b and a != c  # a random-init model's distribution is nearly flat: seeds differ


def picks(logits, config, n):
    """The tokens of ``n`` draws under ``config`` from logits ``[1, V]`` (n rows of one config: n streams)."""
    rows = SamplerRows.of([config] * n)
    return set(sample_next(logits.expand(n, -1), rows, draw_uniforms(config, n, 1)[:, 0]).tolist())


def test_top_k_keeps_the_k_likeliest():
    logits = torch.tensor([[3.0, 2.9, 2.8, 2.7, -1.0]])
    assert picks(logits, GenerationConfig(temperature=1.0, top_k=2), 200) == {0, 1}  # 2, 3 nearly as likely
    assert picks(logits, GenerationConfig(temperature=1.0, top_k=1), 50) == {0}
    assert picks(logits, GenerationConfig(temperature=1.0), 200) >= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="top_k"):
        GenerationConfig(top_k=-1)


def test_top_p_keeps_the_nucleus():
    logits = torch.tensor([[5.0, 4.0, -10.0, -10.0]])
    assert picks(logits, GenerationConfig(temperature=1.0, top_p=0.5), 50) == {0}  # token 0 holds > 50% of the mass
    assert picks(logits, GenerationConfig(temperature=1.0, top_p=0.99), 200) == {0, 1}


def test_stop_strings_and_eos(adapter):
    prompt = adapter.tokenizer.encode("Hello")
    free = adapter.generate([prompt], GenerationConfig(max_new_tokens=6, stop_at_eos=False))[0]
    stop = free.text[2:4]  # a string the greedy continuation is known to produce
    out = adapter.generate([prompt], GenerationConfig(max_new_tokens=6, stop=[stop], stop_at_eos=False))[0]
    assert out.finish_reason == "stop" and out.text == free.text[: free.text.find(stop)]
    # make the first greedy token the EOS id: generation ends at once with an empty text
    adapter.tokenizer.eos_id, saved = free.token_ids[0], adapter.tokenizer.eos_id
    try:
        out = adapter.generate([prompt], GenerationConfig(max_new_tokens=6))[0]
    finally:
        adapter.tokenizer.eos_id = saved
    assert out.finish_reason == "eos" and out.token_ids == [] and out.text == ""


def test_apply_stop_takes_the_earliest():
    assert apply_stop("abc\ndef. ghi", ["\n", "."]) == ("abc", True)
    assert apply_stop("abc", ["x", ""]) == ("abc", False)


@pytest.mark.parametrize("card", ["fox-pro-tiny", "tnl-tiny"])
def test_bfloat16_adapter_equals_autocast_over_fp32_weights(card):
    """The adapter casts linear layers once, and a tied head (TNL's) to its own bf16 copy of the embedding; the
    numbers must equal autocast over fp32 weights (FoX's evals)."""
    half = NativeAdapter(load_card(card), device="cpu", dtype="bfloat16")
    full = NativeAdapter(load_card(card), device="cpu")
    tied = half.model.cfg.tie_word_embeddings
    assert tied == (card == "tnl-tiny") and (half.model.head_cast is not None) == tied
    assert half.model.embed.weight.dtype == torch.float32 and full.model.head_cast is None
    ids = torch.randint(0, 50257, (2, 65), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = full.model.logits(full.model(ids)).float()
    ref = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten(), reduction="none").view(2, 65)
    torch.testing.assert_close(half.token_nll(ids, ids), ref, rtol=0, atol=0)
