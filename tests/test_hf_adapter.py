"""The ``hf`` adapter kind: a tiny random LLaMA-architecture transformers model built here, run through the adapter
contracts of ``test_contracts.py`` and the adapter's own promises; then SmolLM2-135M-Instruct as a Q4_1 GGUF when
``scripts/fetch_smollm2.py`` has fetched it.
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from test_contracts import check_text_adapter, check_token_adapter

from evalsuite.adapters import hf
from evalsuite.adapters.registry import AdapterOptions, load_adapter
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig
from evalsuite.runs.store import file_sha256

transformers = pytest.importorskip("transformers")

SENTENCES = [
    "The river was quiet and the old mill stood by the bridge.",
    "A letter arrived in the morning, and nobody knew who had sent it.",
    "The quiet river ran past the old mill and under the stone bridge.",
    "She read the letter twice, then folded it and put it in her coat.",
]
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def build_tiny_model(path, seed: int = 0):
    """A 2-layer LLaMA with a byte-level BPE tokenizer (trained on SENTENCES; its template puts <s> first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(SENTENCES * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.chat_template = CHAT_TEMPLATE
    config = transformers.LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.2,  # sharp logits: greedy choices are not near-ties
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("hf") / "tiny-llama")


@pytest.fixture(scope="module")
def tiny(tiny_dir):
    return hf.HFAdapter(tiny_dir, device="cpu")


# -- (a) a tiny random model -------------------------------------------------------------------------------------


def test_text_tier_contract(tiny):
    check_text_adapter(tiny)


def test_token_tier_contract(tiny):
    check_token_adapter(tiny)


def test_identity_and_tokenizer(tiny, tiny_dir):
    info, tok = tiny.info, tiny.tokenizer
    assert info.name == "tiny-llama" and info.max_length == info.train_length == 256 and info.dtype == "float32"
    assert info.weights_id == file_sha256([tiny_dir / "model.safetensors"])
    assert info.tokenizer == tok.spec == f"hf:{tiny_dir.resolve()}"
    assert tok.vocab_size == len(tok.tok) and (tok.bos_id, tok.eos_id, tok.pad_id) == (1, 2, 0)
    assert tok.add_bos and tok.encode("The river")[0] == 1 and tok.encode("The river", add_bos=False)[0] != 1
    assert tok.decode(tok.encode("The river ran.", add_bos=False)) == "The river ran."
    prompt = tok.chat_template([{"role": "user", "content": "Hi"}])
    assert tok.has_chat_template and prompt == "<s>user: Hi\nassistant:"
    assert tok.encode(prompt)[:2] != [1, 1]  # the template's BOS is not doubled
    prov = tiny.provenance()
    assert prov["transformers_version"] == transformers.__version__ and prov["model_type"] == "llama"
    assert prov["device"] == "cpu" and prov["gguf_file"] is None


def test_chunked_nll_equals_full_logits(tiny, monkeypatch):
    monkeypatch.setattr(hf, "LOGIT_BUDGET", 2 * 7 * tiny.vocab)  # 7 positions per chunk
    ids = torch.randint(3, tiny.vocab, (2, 40), generator=torch.Generator().manual_seed(0))
    starts = [s for s, _ in tiny.chunked_logits(ids[:, :-1])]
    assert starts == list(range(0, 39, 7))
    with torch.no_grad():
        full = tiny.model(ids[:, :-1]).logits
    expected = F.cross_entropy(full.flatten(0, 1), ids[:, 1:].flatten(), reduction="none").view(2, 39)
    torch.testing.assert_close(tiny.token_nll(ids[:, :-1], ids[:, 1:]), expected, rtol=1e-5, atol=1e-5)
    with pytest.raises(UserError, match="max_length"):
        next(tiny.chunked_logits(torch.zeros(1, 257, dtype=torch.long)))
    with pytest.raises(UserError, match="token ids"):
        next(tiny.chunked_logits(torch.tensor([[tiny.vocab]])))


def test_left_padded_batch_equals_one_by_one(tiny):
    tok = tiny.tokenizer
    prompts = [tok.encode(s) for s in ("The river", SENTENCES[1], "She read the letter twice, then")]
    config = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    batched = tiny.generate(prompts, config)
    assert batched == [tiny.generate([p], config)[0] for p in prompts]
    assert all(g.finish_reason == "length" and len(g.token_ids) == 8 for g in batched)


def test_stop_strings_and_eos(tiny, monkeypatch):
    prompt = [tiny.tokenizer.encode("The quiet river")]
    free = tiny.generate(prompt, GenerationConfig(max_new_tokens=12, stop_at_eos=False))[0]
    text = free.text
    stop = next(text[i : i + 2] for i in range(2, len(text) - 1) if text[i : i + 2].strip())
    cut = tiny.generate(prompt, GenerationConfig(max_new_tokens=12, stop=[stop, "never"], stop_at_eos=False))[0]
    assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]
    assert cut.token_ids == free.token_ids[: len(cut.token_ids)] and len(cut.token_ids) < 12
    forward, calls = tiny.model.forward, []
    with monkeypatch.context() as m:
        m.setattr(tiny.model, "forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
        tiny.generate(prompt, GenerationConfig(max_new_tokens=12, stop=[stop], stop_at_eos=False))
    assert len(calls) == len(cut.token_ids)  # generation ended at the stop string, not at max_new_tokens
    eos = free.token_ids[3]  # pretend the 4th generated token is EOS
    k = free.token_ids.index(eos)
    monkeypatch.setattr(tiny, "eos_ids", {eos})
    ended = tiny.generate(prompt, GenerationConfig(max_new_tokens=12))[0]
    assert ended.finish_reason == "eos" and ended.token_ids == free.token_ids[:k]
    assert tiny.generate(prompt, GenerationConfig(max_new_tokens=12, stop_at_eos=False))[0] == free


def test_seeded_sampling_is_reproducible(tiny):
    prompts = [tiny.tokenizer.encode("The river"), tiny.tokenizer.encode("A letter")]
    state = torch.random.get_rng_state()
    config = GenerationConfig(max_new_tokens=12, temperature=1.5, top_p=0.95, seed=7, stop_at_eos=False)
    first = tiny.generate(prompts, config)
    assert tiny.generate(prompts, config) == first
    config.seed = 8
    assert tiny.generate(prompts, config) != first
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched


def test_static_cache_option(tiny, tiny_dir, monkeypatch):
    """``cache=static,compile=true`` is accepted; a CPU keeps the dynamic cache (same outputs). transformers' static
    cache itself (CUDA's path, without compile), run here on the CPU, gives the same tokens with left padding,
    stop strings and EOS."""
    fast = load_adapter(f"hf:{tiny_dir},cache=static,compile=true", AdapterOptions(device="cpu"))
    assert (fast.cache, fast.compile, fast.generation_path()) == ("static", True, "dynamic")
    assert fast.provenance()["generation_path"] == "dynamic" and fast.identity() == tiny.identity()
    tok = tiny.tokenizer
    prompts = [tok.encode(s) for s in ("The river", SENTENCES[1], "She read the letter twice, then")]
    free = tiny.generate(prompts, GenerationConfig(max_new_tokens=10, stop_at_eos=False))
    text = free[0].text
    stop = next(text[i : i + 2] for i in range(2, len(text) - 1) if text[i : i + 2].strip())
    configs = [GenerationConfig(max_new_tokens=10, stop_at_eos=False), GenerationConfig(max_new_tokens=10, stop=[stop])]
    monkeypatch.setattr(tiny, "eos_ids", {free[1].token_ids[4]})
    monkeypatch.setattr(fast, "eos_ids", {free[1].token_ids[4]})
    wanted = [tiny.generate(prompts, c) for c in configs]
    assert wanted[0] == free and wanted[1][0].finish_reason == "stop" and wanted[1][1].finish_reason == "eos"
    assert [fast.generate(prompts, c) for c in configs] == wanted
    monkeypatch.setattr(fast, "generation_path", lambda: "static")
    assert fast._cache_options(transformers) == {"cache_implementation": "static", "disable_compile": True}
    assert [fast.generate(prompts, c) for c in configs] == wanted


def test_registry_spec_and_options(tiny_dir):
    adapter = load_adapter(f"hf:{tiny_dir},max_length=64", AdapterOptions(device="cpu", dtype="bfloat16"))
    assert isinstance(adapter, hf.HFAdapter) and adapter.model.dtype == torch.bfloat16
    assert (adapter.info.max_length, adapter.info.train_length, adapter.info.dtype) == (64, 256, "bfloat16")
    with pytest.raises(UserError, match="max_length 64"):
        adapter.generate([[1] * 65], GenerationConfig(max_new_tokens=1))
    assert adapter.generate_until(["The river"], GenerationConfig(max_new_tokens=3))[0].finish_reason


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:/no/such/model", "no such model directory or .gguf file"),
        ("hf:./missing.gguf", "no such model directory"),
        ("hf:{dir},colour=red", "key one of"),
        ("hf:{dir},max_length=-3", "max_length must be a positive integer"),
        ("hf:{dir}/config.json", "a file must be a .gguf"),
        ("hf:{dir},gguf_file=x.gguf", "gguf_file x.gguf not found"),
        ("hf:", "needs a model directory"),
        ("hf:{dir},cache=paged", "cache must be one of dynamic, static"),
        ("hf:{dir},cache=static,compile=yes", "compile must be true or false"),
        ("hf:{dir},compile=true", "compile=true needs cache=static"),
    ],
)
def test_bad_specs_are_one_line_errors(tiny_dir, spec, message):
    with pytest.raises(UserError, match=message) as e:
        load_adapter(spec.format(dir=tiny_dir))
    assert "\n" not in str(e.value)


def test_offline_hub_id_without_local_copy(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UserError, match="not in the local cache while HF_HUB_OFFLINE") as e:
        load_adapter("hf:evalsuite-tests/no-such-model-xyz")
    assert "\n" not in str(e.value) and "hf download evalsuite-tests/no-such-model-xyz" in str(e.value)


def test_offline_hub_id_from_the_local_cache(tiny_dir, tmp_path, monkeypatch):
    """An offline run finds a hub id's snapshot in the hub cache; the snapshot's commit is recorded."""
    import shutil

    import huggingface_hub

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "models--evalsuite-tests--tiny-llama"
    shutil.copytree(tiny_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    adapter = load_adapter("hf:evalsuite-tests/tiny-llama", AdapterOptions(device="cpu"))
    assert adapter.info.name == "tiny-llama" and adapter.info.tokenizer == "hf:evalsuite-tests/tiny-llama"
    assert adapter.provenance()["hub_revision"] == commit
    assert adapter.info.weights_id == file_sha256([tiny_dir / "model.safetensors"])


def test_module_imports_without_transformers():
    code = (
        "import sys; sys.modules['transformers'] = None\n"
        "from evalsuite.adapters import hf\n"
        "from evalsuite.errors import UserError\n"
        "try:\n    hf.HFAdapter('x')\nexcept UserError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "the hf: adapter needs the 'hf' extra: pip install 'evalsuite[hf]'"


def test_softcapped_logits_match_forward(tmp_path):
    """Gemma 2 post-processes its logits (tanh soft-capping); the chunked head reproduces it."""
    config = transformers.Gemma2Config(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
        final_logit_softcapping=3.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    transformers.Gemma2ForCausalLM(config).save_pretrained(tmp_path / "gemma")
    transformers.AutoTokenizer.from_pretrained(build_tiny_model(tmp_path / "llama")).save_pretrained(tmp_path / "gemma")
    adapter = hf.HFAdapter(tmp_path / "gemma", device="cpu")  # __init__ checks the head against forward
    check_token_adapter(adapter)


# -- (b) SmolLM2-135M-Instruct, Q4_1 GGUF ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol():
    path = hf.smollm2_path()
    if path is None:
        pytest.skip("SmolLM2 GGUF not fetched: run python scripts/fetch_smollm2.py")
    return load_adapter(f"hf:{path}", AdapterOptions(device="cpu"))


def test_smollm2_loads(smol):
    assert smol.info.max_length == 8192 and smol.info.weights_id == hf.SMOLLM2_SHA256
    assert smol.info.name == "SmolLM2-135M-Instruct.Q4_1" and smol.provenance()["gguf_file"] == hf.SMOLLM2_FILE
    assert smol.model.config.model_type == "llama" and smol.tokenizer.vocab_size == 49152
    assert smol.tokenizer.has_chat_template and not smol.tokenizer.add_bos


def test_smollm2_answers_a_simple_question(smol):
    prompt = smol.tokenizer.chat_template([{"role": "user", "content": "What is the capital of France?"}])
    (gen,) = smol.generate_until([prompt], GenerationConfig(max_new_tokens=24))
    assert "Paris" in gen.text, gen


def test_smollm2_contracts_and_nll(smol):
    check_text_adapter(smol)
    check_token_adapter(smol)
    ids = torch.tensor([smol.tokenizer.encode(" ".join(SENTENCES))])
    nll = smol.token_nll(ids[:, :-1], ids[:, 1:])
    assert torch.isfinite(nll).all() and 0.5 < float(nll.mean()) < 6, float(nll.mean())
    assert math.isfinite(smol.loglikelihood([("The capital of France is", " Paris")])[0][0])
