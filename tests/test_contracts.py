"""Contracts every model family and every adapter keeps, parametrised over the registries.

A new family gets these tests by registering itself (its ``tiny`` overrides make a CPU-sized model); a new
adapter kind by adding a spec to ``ADAPTER_SPECS``. The ``check_*`` functions are also called by
``test_extension.py`` on a family and an adapter that exist only inside that test file.
"""

import pytest
import torch

from evalsuite.adapters.base import GENERATE, TOKENS, TextAdapter, TokenAdapter
from evalsuite.adapters.registry import load_adapter
from evalsuite.cards import list_cards
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.models.base import STATE_KINDS
from evalsuite.models.checkpoint import load_checkpoint, save_checkpoint
from evalsuite.models.registry import architecture_names, resolve_architecture

DEVICE = torch.device("cpu")


def tiny_model(architecture: str, seed: int = 1):
    """A CPU-sized, deterministically initialised model of ``architecture``, with non-trivial norms and biases."""
    family, _ = resolve_architecture(architecture)
    model = family.build(family.make_config(architecture, family.tiny))
    model.init_weights(seed)
    with torch.no_grad():  # perturb gains and biases, which init leaves at 1 and 0, so every path matters
        for name, p in model.named_parameters():
            if name.endswith(("norm.weight", "bias")):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
    return model.eval()


def _ids(model, shape, seed):
    return torch.randint(0, model.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


# -- model contracts ---------------------------------------------------------------------------------------------


@torch.no_grad()
def check_cached_decoding_equals_full_forward(model):
    ids = _ids(model, (2, 40), 3)
    full = model.logits(model(ids))
    state = model.new_state(2, 40)
    steps = [model.logits(model(ids[:, :25], state=state))]
    steps += [model.logits(model(ids[:, t : t + 1], state=state)) for t in range(25, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)
    assert state.length == 40


@torch.no_grad()
def check_padding_is_invisible(model):
    """A left-padded row gives the same logits as the sequence alone, in prefill and in decoding."""
    long_seq, short_seq = _ids(model, (1, 30), 4), _ids(model, (1, 21), 5)
    alone = model.logits(model(short_seq))
    batch = torch.cat([long_seq, torch.cat([torch.full((1, 9), 5), short_seq], 1)])
    start = torch.tensor([0, 9])
    torch.testing.assert_close(model.logits(model(batch, start=start))[1, 9:], alone[0], rtol=1e-5, atol=1e-5)
    state = model.new_state(2, 32, start)
    model(batch, state=state)
    nxt = torch.tensor([[7], [11]])
    step = model.logits(model(nxt, state=state))
    ref = model.logits(model(torch.cat([short_seq, nxt[1:]], 1)))[:, -1]
    torch.testing.assert_close(step[1, -1], ref[0], rtol=1e-5, atol=1e-5)


@torch.no_grad()
def check_state_size_is_reported(model):
    """The state says its kind and bytes, and they agree with the model's analytic ``decode_state_size``."""
    for length in (7, 19):
        state = model.new_state(3, 32)
        model(_ids(model, (3, length), 6), state=state)
        size = model.decode_state_size(length, model.state_dtype())
        assert state.kind in STATE_KINDS and size["kind"] == state.kind
        assert state.nbytes() == 3 * size["bytes"] > 0
    short, long = (model.decode_state_size(n, torch.float32)["bytes"] for n in (100, 10_000))
    assert (long == short) == (state.kind == "recurrent")  # a fixed state does not grow with the context


@torch.no_grad()
def check_checkpoint_round_trip(model, tmp_path):
    save_checkpoint(model, tmp_path / "ckpt")
    loaded, layout = load_checkpoint(tmp_path / "ckpt")
    assert layout == "evalsuite" and type(loaded) is type(model) and loaded.config == model.config
    ids = _ids(model, (2, 17), 7)
    torch.testing.assert_close(loaded.logits(loaded(ids)), model.logits(model(ids)), rtol=0, atol=0)


@torch.no_grad()
def check_backends_match_the_reference(model):
    ids = _ids(model, (2, 37), 8)
    model.set_attention_backend(model.reference_backend)
    ref = model.logits(model(ids))
    for backend in model.available_backends(DEVICE):
        model.set_attention_backend(backend)
        torch.testing.assert_close(model.logits(model(ids)), ref, rtol=1e-5, atol=1e-5, msg=backend)
    model.set_attention_backend("auto")


MODEL_CONTRACTS = [
    check_cached_decoding_equals_full_forward,
    check_padding_is_invisible,
    check_state_size_is_reported,
    check_backends_match_the_reference,
]


@pytest.mark.parametrize("architecture", architecture_names())
@pytest.mark.parametrize("contract", MODEL_CONTRACTS, ids=lambda f: f.__name__.removeprefix("check_"))
def test_model_contract(architecture, contract):
    contract(tiny_model(architecture))


@pytest.mark.parametrize("architecture", architecture_names())
def test_checkpoint_round_trip(architecture, tmp_path):
    check_checkpoint_round_trip(tiny_model(architecture), tmp_path)


# -- adapter contracts -------------------------------------------------------------------------------------------

# One spec per built-in adapter kind and family: every CPU-sized built-in card.
ADAPTER_SPECS = [f"native:{c.name}" for c in list_cards() if c.name.endswith("-tiny")]


def check_text_adapter(adapter: TextAdapter):
    info = adapter.info
    assert info.name and info.weights_id and info.tokenizer and GENERATE in adapter.capabilities
    assert set(adapter.identity()) == {"model", "checkpoint_sha256", "tokenizer", "dtype"}
    prompts = ["The river was quiet and", "A letter arrived"]
    config = GenerationConfig(max_new_tokens=5)
    gens = adapter.generate_until(prompts, config)
    assert len(gens) == 2 and all(isinstance(g, Generation) for g in gens)
    assert all(g.finish_reason in ("stop", "eos", "length") for g in gens)
    assert adapter.generate_until(prompts, config) == gens  # greedy is deterministic
    if info.max_length is not None:
        with pytest.raises(Exception, match="max_length"):
            adapter.check_length(info.max_length + 1)


@torch.inference_mode()
def check_token_adapter(adapter: TokenAdapter):
    assert TOKENS in adapter.capabilities
    tok = adapter.tokenizer
    ids = torch.tensor([tok.encode("The quiet river ran past the old mill and the bridge.")])
    inputs, targets = ids[:, :-1], ids[:, 1:]
    logits = torch.cat([lg.float() for _, lg in adapter.chunked_logits(inputs)], 1).cpu()
    nll = adapter.token_nll(inputs, targets)
    expected = -torch.log_softmax(logits, -1).gather(-1, targets[..., None])[..., 0]
    torch.testing.assert_close(nll, expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(adapter.token_argmax(inputs), logits.argmax(-1))
    # greedy generation = argmax rollout with teacher forcing over its own output
    gen = adapter.generate([ids[0].tolist()], GenerationConfig(max_new_tokens=4, stop_at_eos=False))[0]
    rollout = torch.tensor([ids[0].tolist() + gen.token_ids])
    assert adapter.token_argmax(rollout[:, :-1])[0, ids.shape[1] - 1 :].tolist() == gen.token_ids
    # log-likelihood of a continuation = minus the summed NLL of its tokens, and "greedy" agrees with argmax
    context, continuation = "The quiet river ran past", " the old mill"
    ((logprob, greedy),) = adapter.loglikelihood([(context, continuation)])
    n = len(tok.encode(continuation, add_bos=False))
    full = torch.tensor([tok.encode(context) + tok.encode(continuation, add_bos=False)])
    assert logprob == pytest.approx(-float(adapter.token_nll(full[:, :-1], full[:, 1:])[0, -n:].sum()), abs=1e-3)
    assert greedy == bool((adapter.token_argmax(full[:, :-1])[0, -n:] == full[0, -n:]).all())


@pytest.fixture(scope="module", params=ADAPTER_SPECS)
def adapter(request):
    return load_adapter(request.param)


def test_text_tier_contract(adapter):
    check_text_adapter(adapter)


def test_token_tier_contract(adapter):
    check_token_adapter(adapter)
