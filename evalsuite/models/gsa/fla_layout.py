"""fla's GSA checkpoints (``GSAForCausalLM``, ``model_type: "gsa"``; e.g. ``fla-hub/gsa-1.3B-100B``) in both of
their tensor layouts (fla's ``GSAConfig`` / ``modeling_gsa.py``; the layout changed in Feb 2025, fla commits
``13ced952`` and ``b48ca31d``):

* legacy (2024, ``norm_first: true``): ``attn.norm`` / ``mlp.norm`` and one fused ``mlp.gate_proj [2I, D]``
  (gate rows first, then up), optionally ``attn.g_proj`` (``use_output_gate``);
* current (2025-02 on): ``attn_norm`` / ``mlp_norm`` and separate ``mlp.gate_proj`` / ``mlp.up_proj``.

The math is the same in both. The LM layer uses ``scale = 1`` (no 1/sqrt(dk)); ``gate_logit_normalizer``,
``num_heads``, ``num_slots`` and ``expand_k/v`` are read from config.json because fla's defaults changed over time.
"""

from __future__ import annotations

from collections.abc import Collection

import torch

from evalsuite.errors import UserError
from evalsuite.models.gsa.model import GSAConfig

_ATTN = ("q_proj", "k_proj", "v_proj", "f_proj", "o_proj")


def detect(config: dict, tensor_names: Collection[str]) -> bool:
    return config.get("model_type") == "gsa" and "model.embeddings.weight" in tensor_names


def _is_legacy(config: dict, names: Collection[str]) -> bool:
    return "model.layers.0.attn.norm.weight" in names or (
        config.get("norm_first") is True and "model.layers.0.attn_norm.weight" not in names
    )


def _expected(config: dict, legacy: bool, tied: bool) -> dict[str, str]:
    """Checkpoint tensor name -> our module name, for every tensor the layout must hold."""
    names = {"model.embeddings.weight": "embed.weight", "model.norm.weight": "norm.weight"}
    if not tied:
        names["lm_head.weight"] = "lm_head.weight"
    attn = list(_ATTN) + (["g_proj"] if config.get("use_output_gate") else [])
    for i in range(config["num_hidden_layers"]):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        names[src + ("attn.norm.weight" if legacy else "attn_norm.weight")] = dst + "attn_norm.weight"
        names[src + ("mlp.norm.weight" if legacy else "mlp_norm.weight")] = dst + "mlp_norm.weight"
        for proj in attn:
            names[f"{src}attn.{proj}.weight"] = f"{dst}attn.{proj}.weight"
        if config.get("use_norm", True):
            names[src + "attn.g_norm.weight"] = dst + "attn.g_norm.weight"
        names[src + "mlp.gate_proj.weight"] = dst + "mlp.gate_proj.weight"  # fused [2I, D] when legacy
        if not legacy:
            names[src + "mlp.up_proj.weight"] = dst + "mlp.up_proj.weight"
        names[src + "mlp.down_proj.weight"] = dst + "mlp.down_proj.weight"
    return names


def _config(config: dict, state: dict[str, torch.Tensor]) -> GSAConfig:
    if config.get("use_short_conv"):
        raise UserError("fla GSA checkpoint uses short convolutions (use_short_conv), not implemented")
    if config.get("attn"):
        raise UserError("fla GSA checkpoint is a hybrid with softmax-attention layers ('attn'), not implemented")
    if config.get("feature_map", "swish") not in ("swish", "relu"):
        raise UserError(f"fla GSA feature_map {config['feature_map']!r} is not implemented (swish, relu are)")
    if config.get("hidden_act", "swish") not in ("swish", "silu"):
        raise UserError(f"fla GSA hidden_act {config['hidden_act']!r} is not implemented (swish)")
    D, H = config["hidden_size"], config["num_heads"]
    down = state.get("model.layers.0.mlp.down_proj.weight")
    head_k_dim = int(D * config.get("expand_k", 1)) // H
    return GSAConfig(
        vocab_size=config["vocab_size"],
        hidden_size=D,
        num_layers=config["num_hidden_layers"],
        num_heads=H,
        num_kv_heads=config.get("num_kv_heads"),
        num_slots=config.get("num_slots") or head_k_dim,
        gate_logit_normalizer=config.get("gate_logit_normalizer", 8),
        scale=1.0,
        expand_k=config.get("expand_k", 1),
        expand_v=config.get("expand_v", 1),
        feature_map=config.get("feature_map", "swish"),
        use_output_gate=bool(config.get("use_output_gate", False)),
        use_norm=config.get("use_norm", True),
        hidden_ratio=config.get("hidden_ratio") or 4,
        intermediate_size=int(down.shape[1]) if down is not None else config.get("intermediate_size"),
        norm_eps=config.get("norm_eps", 1e-6),
        tie_word_embeddings=config.get("tie_word_embeddings", False),
    )


def convert(config: dict, state: dict[str, torch.Tensor]) -> tuple[GSAConfig, dict[str, torch.Tensor]]:
    """Our config and state dict for an fla GSA checkpoint (either layout)."""
    for key in ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise UserError(f"fla GSA config.json lacks an integer {key!r}")
    try:
        cfg = _config(config, state)
    except ValueError as e:
        raise UserError(f"bad fla GSA config: {e}") from None
    legacy = _is_legacy(config, state)
    names = _expected(config, legacy, cfg.tie_word_embeddings)
    missing = [k for k in names if k not in state]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        layout = "legacy (norm_first)" if legacy else "current"
        raise UserError(f"fla GSA checkpoint ({layout} layout) is missing tensor(s) {', '.join(missing[:5])}{more}")
    out = {dst: state[src] for src, dst in names.items()}
    if legacy:  # split the fused [2I, D] MLP input: gate rows first, then up
        for i in range(cfg.num_layers):
            fused = out[f"blocks.{i}.mlp.gate_proj.weight"]
            out[f"blocks.{i}.mlp.gate_proj.weight"], out[f"blocks.{i}.mlp.up_proj.weight"] = fused.chunk(2, dim=0)
    return cfg, out
