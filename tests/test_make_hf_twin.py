"""``scripts/make_hf_twin.py``: the HF twin of ``transformer-llama-tiny`` loads through the ``hf:`` adapter with the
card's shapes, parameter count, tokenizer and (same seeded init) logits, runs in ``bench generate`` beside the
card, and a card that is not a plain LLaMA block is one error line with exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import assert_one_line_error

from evalsuite.adapters.registry import AdapterOptions, load_adapter
from evalsuite.bench import generate as bench
from evalsuite.cards import load_card
from evalsuite.generation.types import GenerationConfig
from evalsuite.tokenizers import get_tokenizer

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_hf_twin.py"
CARD = "transformer-llama-tiny"


def make_twin(card: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, str(SCRIPT), "--card", card, "--out", str(out), *extra]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def twin_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("twin") / "hf-llama-tiny"
    done = make_twin(CARD, out, "--dtype", "float32")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert len(line.splitlines()) == 1 and str(out) in line and CARD in line, done.stdout
    return out


@pytest.fixture(scope="module")
def models(twin_dir):
    twin = load_adapter(f"hf:{twin_dir}", AdapterOptions(device="cpu", dtype="float32"))
    native = bench.load_model(CARD, "cpu", "float32", "random")
    return twin, native


def test_twin_has_the_cards_shapes_and_parameter_count(models, twin_dir):
    twin, native = models
    cfg, c = native.model.config, twin.config
    assert type(twin.model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in twin.model.parameters()) == sum(p.numel() for p in native.model.parameters())
    assert (c.vocab_size, c.hidden_size, c.num_hidden_layers) == (cfg.vocab_size, cfg.hidden_size, cfg.num_layers)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (cfg.num_heads, cfg.num_heads, cfg.head_dim)
    assert (c.intermediate_size, c.rms_norm_eps, c.tie_word_embeddings) == (cfg.mlp_size, cfg.norm_eps, False)
    assert c.max_position_embeddings == twin.info.max_length == load_card(CARD).max_length
    assert (c.bos_token_id, c.eos_token_id) == (50256, 50256)
    assert {p.name for p in twin_dir.iterdir()} >= {"config.json", "model.safetensors", "tokenizer.json"}


def test_twin_tokenizer_is_the_suites_gpt2(models):
    tok, gpt2 = models[0].tokenizer, get_tokenizer("gpt2")
    text = "The river's quiet.\n\n  Ça coûte 12€ <|endoftext|> don't"
    assert (tok.vocab_size, tok.bos_id, tok.eos_id, tok.add_bos) == (50257, 50256, 50256, True)
    assert tok.encode(text) == gpt2.encode(text, add_bos=True)
    assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_twin_computes_the_same_function(models):
    """Same seeded init under LLaMA's names: the logits and greedy tokens of the card's random model."""
    twin, native = models
    ids = torch.randint(0, 50257, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = torch.cat([lg for _, lg in native.chunked_logits(ids)], 1)
        theirs = torch.cat([lg for _, lg in twin.chunked_logits(ids)], 1)
    torch.testing.assert_close(theirs, ours, rtol=1e-4, atol=1e-5)
    config = GenerationConfig(max_new_tokens=6, stop_at_eos=False)
    prompts = ids[:, :16].tolist()
    twin_tokens = [g.token_ids for g in twin.generate(prompts, config)]
    assert twin_tokens == [g.token_ids for g in native.generate(prompts, config)]


def test_bench_generate_runs_card_and_twin(twin_dir, tmp_path):
    spec = f"hf:{twin_dir}"
    records = bench.bench_generate(tmp_path, models=[CARD, spec], lengths=[32], batches=[1], new_tokens=4,
                                   paths=["eager", "graph"], device="cpu", copy_mib=8, warmup=False,
                                   verbose=False)  # fmt: skip
    by = {(r["model"], r["path"]): r for r in records}
    assert set(by) == {(m, p) for m in (CARD, spec) for p in ("eager", "graph")}
    for model in (CARD, spec):
        assert by[(model, "eager")]["status"] == "ok" and by[(model, "eager")]["tokens_made"] == 4, by
        assert by[(model, "graph")]["status"] == "unavailable: needs CUDA"
    # one decode step reads the same weights, and the same K/V per token (no forget-gate sums in a plain block)
    assert by[(CARD, "eager")]["weight_bytes"] == by[(spec, "eager")]["weight_bytes"]
    assert by[(CARD, "eager")]["state_bytes"] == by[(spec, "eager")]["state_bytes"]


@pytest.mark.parametrize("card", ["fox-pro-tiny", "transformer-pro-tiny", "gsa-tiny"])
def test_a_card_that_is_not_a_llama_block_is_refused(card, tmp_path):
    done = make_twin(card, tmp_path / "twin")
    assert_one_line_error(done.returncode, done.stderr, f"card {card}: architecture")
    assert "is not a" in done.stderr and not (tmp_path / "twin").exists()
