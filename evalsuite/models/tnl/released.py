"""The released TransNormerLLM layout (``OpenNLPLab/TransNormerLLM-{385M,1B,7B}``, ``model_type: "transnormer"``;
the hub's ``modeling_transnormer.py``): config keys ``decoder_embed_dim``, ``decoder_layers``,
``decoder_attention_heads``, ``hidden_dim``, ``glu_dim``, ``linear_use_lrpe_list``, ``linear_act_fun``,
``no_scale_embedding``; tensors ``model.embed_tokens``, ``model.layers.{i}.token_mixer.{qkvu_proj,out_proj}``,
optional ``token_mixer.lrpe.theta`` (later hub revisions dropped the parameter: then its fixed init is used),
``channel_mixer.{l1,l2,l3}`` and a head tied to the embedding unless the config says otherwise. No norm has weights.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from evalsuite.errors import UserError
from evalsuite.models.tnl.model import TNLConfig, lrpe_theta

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "none": "none"}


def detect(config: dict, tensor_names: Collection[str]) -> bool:
    return (
        config.get("model_type") == "transnormer"
        or "model.embed_tokens.weight" in tensor_names
        and any(".token_mixer.qkvu_proj." in k for k in tensor_names)
    )


def _config(config: dict, state: dict[str, torch.Tensor]) -> TNLConfig:
    for key in ("decoder_embed_dim", "decoder_layers", "decoder_attention_heads", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise UserError(f"TransNormerLLM config.json lacks an integer {key!r}")
    if config.get("norm_type", "simplermsnorm") != "simplermsnorm":
        raise UserError(f"TransNormerLLM norm_type {config['norm_type']!r} is not implemented (simplermsnorm is)")
    if config.get("bias", False):
        raise UserError("TransNormerLLM checkpoints with linear biases (bias: true) are not implemented")
    if "gate_dim" in config:
        raise UserError("TransNormerLLM3 (low-rank output gate, gate_dim) is not implemented")
    act = str(config.get("linear_act_fun", "silu"))
    L = config["decoder_layers"]
    lrpe = config.get("linear_use_lrpe_list") or [0] * L
    if len(lrpe) != L:
        raise UserError(f"linear_use_lrpe_list has {len(lrpe)} entries for {L} layers")
    D = config["decoder_embed_dim"]
    return TNLConfig(
        vocab_size=config["vocab_size"],
        hidden_size=D,
        num_layers=L,
        num_heads=config["decoder_attention_heads"],
        attention_dim=config.get("hidden_dim", D),
        glu_dim=config.get("glu_dim", 2816),
        lrpe_layers=[i for i, flag in enumerate(lrpe) if flag],
        decay_schedule="code",
        activation=_ACTIVATIONS.get(act, "none"),  # the released code: unknown names mean identity
        no_scale_embedding=bool(config.get("no_scale_embedding", False)),
        tie_word_embeddings=config.get("tie_word_embeddings", True),
    )


def convert(config: dict, state: dict[str, torch.Tensor]) -> tuple[TNLConfig, dict[str, torch.Tensor]]:
    """Our config and state dict for a released TransNormerLLM checkpoint."""
    try:
        cfg = _config(config, state)
    except ValueError as e:
        raise UserError(f"bad TransNormerLLM config: {e}") from None
    names = {"model.embed_tokens.weight": "embed.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.num_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        for part in (
            "token_mixer.qkvu_proj",
            "token_mixer.out_proj",
            "channel_mixer.l1",
            "channel_mixer.l2",
            "channel_mixer.l3",
        ):
            names[f"{src}{part}.weight"] = f"{dst}{part}.weight"
    missing = [k for k in names if k not in state]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UserError(f"TransNormerLLM checkpoint is missing tensor(s) {', '.join(missing[:5])}{more}")
    out = {dst: state[src] for src, dst in names.items()}
    for i in cfg.lrpe_layers:  # a trained theta when the checkpoint has one, else the fixed init
        theta = state.get(f"model.layers.{i}.token_mixer.lrpe.theta")
        out[f"blocks.{i}.token_mixer.lrpe_theta"] = (
            theta if theta is not None else lrpe_theta(cfg.num_heads, cfg.head_dim)
        )
    return cfg, out
