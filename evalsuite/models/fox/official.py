"""The official FoX release layout (``zhixuan-lin/{fox-pro,fox-llama,transformer-pro,transformer-llama}-760m-
longcrawl64-48b``): HF directories with ``config.json`` in the FoX repository's keys and ``model.safetensors`` (or
shards / ``pytorch_model.bin``) with names like ``model.layers.{i}.attn.k_proj.linear.weight``.

Features are read off the tensor names, not ``model_type`` alone: the KV-shift is present when
``k_proj.linear.weight`` is; QK-norm sharing follows the ``q_norm.weight`` shape (one ``[hd]`` scale in the
released checkpoints); the fused MLP ``gate_proj`` ``[2I, D]`` is split into our gate (first half) and up.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import torch

from evalsuite.errors import UserError
from evalsuite.models.checkpoint import OWN_FORMAT
from evalsuite.models.fox.model import FoxConfig

_LAYER_RENAMES = {
    "attn.k_proj.shift_proj.weight": "attn.k_proj.shift.weight",
    "attn.v_proj.shift_proj.weight": "attn.v_proj.shift.weight",
    "attn.output_norm.weight": "attn.out_norm.weight",
}
_UNSUPPORTED = {"num_kv_heads": None, "window_size": None, "log_pruning_tolerance": None}
_REQUIRED = ("model.embeddings.weight", "model.norm.weight", "lm_head.weight")


# The FoX repository's model_type strings, with and without the "-project_fox" suffix (its config classes).
_MODEL_TYPES = (
    "forgetting_transformer-project_fox",
    "transformer-project_fox",
    "forgetting_transformer",
    "transformer",
)


def detect(config: dict, tensor_names: Collection[str]) -> bool:
    """HF-style FoX names: ``model.embeddings.weight`` and ``model.layers.*`` (not our own format, nor another
    family's ``model_type``, such as fla's ``gsa``, which shares these names)."""
    return (
        config.get("format") != OWN_FORMAT
        and config.get("model_type", "transformer") in _MODEL_TYPES
        and "model.embeddings.weight" in tensor_names
        and any(k.startswith("model.layers.") for k in tensor_names)
    )


def official_config(config: dict, state: dict[str, torch.Tensor]) -> FoxConfig:
    """Our config for an official FoX-repo checkpoint, reading the features off the tensors."""
    for key, allowed in _UNSUPPORTED.items():
        if config.get(key, allowed) != allowed:
            raise UserError(f"official config sets {key}={config[key]!r}, which evalsuite does not implement")
    if config.get("ogate_act", "sigmoid") != "sigmoid" or config.get("hidden_act", "swish") not in ("swish", "silu"):
        raise UserError("official config uses an activation other than sigmoid output gate / SiLU MLP")
    missing = [k for k in _REQUIRED if k not in state]
    if missing:
        raise UserError(f"incomplete official FoX checkpoint: missing tensor(s) {', '.join(missing)}")
    D = config["hidden_size"]
    H = config["num_heads"]

    def has(suffix: str) -> bool:
        return any(k.endswith(suffix) for k in state)

    if has("attn.fgate_proj.weight"):
        fgate = "full"
    elif has("attn.fgate_bias"):
        fgate = config.get("fgate_type", "bias_only")
    else:
        fgate = "none"
    q_norm = next((v for k, v in state.items() if k.endswith("attn.q_norm.weight")), None)
    is_transformer_class = "TransformerForCausalLM" in config.get("architectures", []) or config.get(
        "model_type", ""
    ).startswith("transformer")
    gate_up = next((v for k, v in state.items() if k.endswith("mlp.gate_proj.weight")), None)
    if gate_up is None:
        raise UserError("incomplete official FoX checkpoint: missing tensor(s) model.layers.*.mlp.gate_proj.weight")
    return FoxConfig(
        vocab_size=config["vocab_size"],
        hidden_size=D,
        num_layers=config["num_hidden_layers"],
        num_heads=H,
        hidden_ratio=config.get("hidden_ratio") or 4,
        intermediate_size=gate_up.shape[0] // 2,  # the fused [2I, D] tensor fixes I exactly
        fgate_type=fgate,
        decay_time_min=config.get("decay_time_min"),
        decay_time_max=config.get("decay_time_max"),
        use_rope=config.get("use_rope", is_transformer_class),
        rope_base=float(config.get("rope_base", 500000.0)),
        qk_norm=q_norm is not None,
        qk_norm_shared=q_norm is not None and q_norm.shape[0] != D,
        use_output_gate=has("attn.ogate_proj.weight"),
        use_output_norm=has("attn.output_norm.weight"),
        use_k_shift=has("attn.k_proj.linear.weight"),
        use_v_shift=has("attn.v_proj.linear.weight"),
        norm_eps=config.get("norm_eps", 1e-6),
        initializer_range=config.get("initializer_range", 0.02),
    )


def official_to_own_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename official tensors to ours; split the fused MLP ``gate_proj`` [2I, D] into gate (first half) and up."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name == "model.embeddings.weight":
            out["embed.weight"] = tensor
        elif name == "model.norm.weight":
            out["norm.weight"] = tensor
        elif name == "lm_head.weight":
            out[name] = tensor
        elif m := re.fullmatch(r"model\.layers\.(\d+)\.(.+)", name):
            layer, rest = m.groups()
            prefix = f"blocks.{layer}."
            if rest == "mlp.gate_proj.weight":
                gate, up = tensor.chunk(2, dim=0)
                out[prefix + "mlp.gate_proj.weight"] = gate
                out[prefix + "mlp.up_proj.weight"] = up
            else:
                out[prefix + _LAYER_RENAMES.get(rest, rest)] = tensor
        else:
            out[name] = tensor  # left for the strict loader to report as unexpected
    return out


def convert(config: dict, state: dict[str, torch.Tensor]) -> tuple[FoxConfig, dict[str, torch.Tensor]]:
    """(our config, our state dict) of an official checkpoint."""
    try:
        cfg = official_config(config, state)
    except KeyError as e:
        raise UserError(f"incomplete official FoX config.json (missing {e})") from None
    return cfg, official_to_own_state(state)
