"""The DRT authors' checkpoint layout (arXiv:2410.01651; the released training code saves ``model.state_dict()`` as
``model.bin`` / ``model_best.bin``, beside a separate json config; no weights were published).

Config keys (a transformers ``LlamaConfig`` json with extras): ``hidden_size``, ``num_attention_heads``,
``intermediate_size``, ``vocab_size``, ``decoder_layers`` (``[lower, group_1, ..., group_G]``, e.g. ``[6, 6]``),
``encoder_layers``, ``chunk_topk``, ``slide_window``, ``enc_chunk_size`` (tokens per chunk: 63 -> 64 positions with
the landmark), ``enable_softmax_one`` (used by the Triton GCA path, ``_triton_gca``), ``rms_norm_eps``, ``chunk_id``
(the landmark), ``tie_word_embeddings``. Tensors: ``model.embed_tokens``, ``model.lower_layers.{i}.*``,
``model.upper_layers.{g}.{j}.*`` (with ``gca.{pre_norm,q_proj,o_proj}``), ``model.lmk_norms.{g}``,
``model.encoder.{layers.*,norm}``, ``model.{chunk_k_proj,chunk_v_proj,enc_prenorm,norm}``, ``lm_head``; a DDP
save has ``module.`` in every name (stripped, as the authors' loader does). Our module names are the same minus
``model.`` (``embed_tokens`` -> ``embed``).
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from evalsuite.errors import UserError
from evalsuite.models.drt.layers import drt_alibi_slopes
from evalsuite.models.drt.model import DRTConfig

_KEYS = ("enc_chunk_size", "decoder_layers", "chunk_topk")


def _strip(name: str) -> str:
    return name.replace("module.", "")


def detect(config: dict, tensor_names: Collection[str]) -> bool:
    return all(k in config for k in _KEYS) or any(_strip(k).startswith("model.lmk_norms.") for k in tensor_names)


def _int(config: dict, key: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise UserError(f"DRT config.json lacks an integer {key!r}")
    return value


def released_config(config: dict) -> DRTConfig:
    """Our config for a released-code DRT json."""
    layers = config.get("decoder_layers")
    if not isinstance(layers, list) or len(layers) < 2 or not all(isinstance(n, int) and n >= 0 for n in layers):
        raise UserError(f"DRT decoder_layers must be [lower, group_1, ...], got {layers!r}")
    if len(set(layers[1:])) != 1 or layers[1] < 1:
        raise UserError(f"DRT decoder_layers {layers}: retrieval groups of different sizes are not implemented")
    unsupported = [
        (config.get("attention_bias", False), "linear biases (attention_bias: true)"),
        (not config.get("enable_alibi", True), "decoders without ALiBi (enable_alibi: false)"),
        (config.get("gpt2_mlp", False), "GPT-2 MLPs (gpt2_mlp)"),
        (config.get("hidden_act", "silu") not in ("silu", "swish"), f"hidden_act {config.get('hidden_act')!r}"),
        (
            config.get("num_key_value_heads", config.get("num_attention_heads")) != config.get("num_attention_heads"),
            "grouped-query attention (num_key_value_heads != num_attention_heads)",
        ),
    ]
    for bad, what in unsupported:
        if bad:
            raise UserError(f"DRT checkpoints with {what} are not implemented")
    window = _int(config, "slide_window")
    if window < 1:
        raise UserError(f"DRT slide_window {window}: full attention (-1) is not implemented")
    chunk = _int(config, "enc_chunk_size") + 1
    if chunk % 64 not in (0, 1):  # the released code zeroes the landmark row at 64k positions, drops it at 64k + 1
        raise UserError(f"DRT enc_chunk_size {chunk - 1}: the released code supports 63 or 64 (mod 64) tokens")
    try:
        return DRTConfig(
            vocab_size=_int(config, "vocab_size"),
            landmark_id=_int(config, "chunk_id"),
            hidden_size=_int(config, "hidden_size"),
            num_layers=sum(layers),
            lower_layers=layers[0],
            num_heads=_int(config, "num_attention_heads"),
            intermediate_size=_int(config, "intermediate_size"),
            retrieval_groups=len(layers) - 1,
            chunk_size=chunk,
            top_k=_int(config, "chunk_topk"),
            window=window,
            encoder_layers=_int(config, "encoder_layers"),
            # Only the Triton GCA path applies softmax-off-by-one; the flash-attn fallback ignores the flag.
            softmax_one=bool(config.get("enable_softmax_one", False)) and bool(config.get("_triton_gca", False)),
            zero_landmark_kv=chunk % 64 == 0,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),  # LlamaConfig's default
            encoder_norm_eps=1e-6,  # the encoder's LlamaConfig is built without rms_norm_eps
            rope_base=10000.0,  # ... and without rope_theta
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),  # LlamaConfig's default
        )
    except ValueError as e:
        raise UserError(f"bad DRT config: {e}") from None


def convert(config: dict, state: dict[str, torch.Tensor]) -> tuple[DRTConfig, dict[str, torch.Tensor]]:
    """Our config and state dict for a released-code DRT checkpoint (names checked by the strict loader)."""
    cfg = released_config(config)
    out = {}
    for name, tensor in state.items():
        name = _strip(name)
        if name.endswith("rotary_emb.inv_freq") or (name == "lm_head.weight" and cfg.tie_word_embeddings):
            continue
        name = name.removeprefix("model.")
        out["embed." + name.removeprefix("embed_tokens.") if name.startswith("embed_tokens.") else name] = tensor
    slopes = drt_alibi_slopes(cfg.num_heads)
    for prefix in [f"lower_layers.{i}" for i in range(cfg.lower_layers)] + [
        f"upper_layers.{g}.{j}"
        for g in range(cfg.retrieval_groups)
        for j in range(cfg.upper_layers // cfg.retrieval_groups)
    ]:
        out.setdefault(f"{prefix}.self_attn.m", slopes)  # a persistent buffer; fixed slopes if a save lacks it
    return cfg, out
