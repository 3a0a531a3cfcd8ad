"""Checkpoints: our own format, and the official FoX release layout (checkpoint_formats.md §A).

Our format is a directory with ``config.json`` (``{"format": "evalsuite", "architecture": ...,
"config": {...}}``) and ``model.safetensors`` holding the state dict under our module names.

The official FoX checkpoints (``zhixuan-lin/{fox-pro,fox-llama,transformer-pro,transformer-llama}-760m-
longcrawl64-48b``) are HF directories: ``config.json`` with the repo's keys and ``model.safetensors``
(or shards / ``pytorch_model.bin``) with names like ``model.layers.{i}.attn.k_proj.linear.weight``.
Loading dispatches on tensor names, not ``model_type`` alone, as the reference notes advise: the KV-shift
is present when ``k_proj.linear.weight`` is; QK-norm sharing follows the ``q_norm.weight`` shape.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from evalsuite.errors import UserError
from evalsuite.models.fox import ForgettingTransformer, FoxConfig
from evalsuite.store import file_sha256

OWN_FORMAT = "evalsuite"


def weight_files(ckpt_dir: Path) -> list[Path]:
    """The weight files of a checkpoint directory, in load order."""
    ckpt_dir = Path(ckpt_dir)
    single = ckpt_dir / "model.safetensors"
    if single.exists():
        return [single]
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [ckpt_dir / s for s in shards]
    bins = sorted(ckpt_dir.glob("pytorch_model*.bin"))
    if bins:
        return bins
    raise UserError(f"{ckpt_dir}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin")


def read_state_dict(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt_dir):
        if f.suffix == ".safetensors":
            state.update(load_file(str(f)))
        else:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
    return state


def read_config(ckpt_dir: Path) -> dict:
    path = Path(ckpt_dir) / "config.json"
    if not path.exists():
        raise UserError(f"{ckpt_dir}: no config.json (is this a checkpoint directory?)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise UserError(f"{path}: invalid JSON ({e.msg})") from None


def checkpoint_sha256(ckpt_dir: Path) -> str:
    return file_sha256(weight_files(ckpt_dir))


# --------------------------------------------------------------------------------------------------
# Our own format


def save_checkpoint(model: ForgettingTransformer, ckpt_dir: Path, architecture: str = "fox") -> None:
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(ckpt_dir / "model.safetensors"))
    cfg = {"format": OWN_FORMAT, "architecture": architecture, "config": model.cfg.to_dict()}
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_state_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``state`` into ``model``; any missing, unexpected or misshapen tensor is a UserError naming it."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        raise UserError(f"{where}: checkpoint is missing tensor(s) {', '.join(missing[:5])}")
    if unexpected:
        raise UserError(f"{where}: checkpoint has unexpected tensor(s) {', '.join(unexpected[:5])}")
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise UserError(
                f"{where}: tensor {k} has shape {tuple(state[k].shape)}, the model expects {tuple(v.shape)}"
            )
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


# --------------------------------------------------------------------------------------------------
# The official FoX release layout (checkpoint_formats.md §A.1-A.3)

_OFFICIAL_LAYER_RENAMES = {
    "attn.k_proj.shift_proj.weight": "attn.k_proj.shift.weight",
    "attn.v_proj.shift_proj.weight": "attn.v_proj.shift.weight",
    "attn.output_norm.weight": "attn.out_norm.weight",
}
_UNSUPPORTED = {"num_kv_heads": None, "window_size": None, "log_pruning_tolerance": None}


def is_official_fox(config: dict, state_keys) -> bool:
    return config.get("format") != OWN_FORMAT and any(k.startswith("model.layers.") for k in state_keys)


def official_fox_config(config: dict, state: dict[str, torch.Tensor]) -> FoxConfig:
    """Our config for an official FoX-repo checkpoint, reading the features off the tensors."""
    for key, allowed in _UNSUPPORTED.items():
        if config.get(key, allowed) != allowed:
            raise UserError(f"official config sets {key}={config[key]!r}, which evalsuite does not implement")
    if config.get("ogate_act", "sigmoid") != "sigmoid" or config.get("hidden_act", "swish") not in ("swish", "silu"):
        raise UserError("official config uses an activation other than sigmoid output gate / SiLU MLP")
    D = config["hidden_size"]
    H = config["num_heads"]
    has = lambda suffix: any(k.endswith(suffix) for k in state)  # noqa: E731
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
    gate_up = next(v for k, v in state.items() if k.endswith("mlp.gate_proj.weight"))
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
                out[prefix + _OFFICIAL_LAYER_RENAMES.get(rest, rest)] = tensor
        else:
            out[name] = tensor  # left for the strict loader to report as unexpected
    return out


# --------------------------------------------------------------------------------------------------


def load_checkpoint(ckpt_dir: Path) -> tuple[ForgettingTransformer, str]:
    """Build the model stored in ``ckpt_dir`` (our format or the official FoX layout).

    Returns the model (fp32, CPU, eval mode) and the layout name ("evalsuite" or "fox-official").
    """
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        raise UserError(f"checkpoint directory {ckpt_dir} does not exist")
    config = read_config(ckpt_dir)
    state = read_state_dict(ckpt_dir)
    if config.get("format") == OWN_FORMAT:
        try:
            cfg = FoxConfig.from_dict(config["config"])
        except (KeyError, ValueError, TypeError) as e:
            raise UserError(f"{ckpt_dir}/config.json: bad evalsuite config ({e})") from None
        layout = OWN_FORMAT
    elif is_official_fox(config, state):
        try:
            cfg = official_fox_config(config, state)
        except (KeyError, StopIteration) as e:
            raise UserError(f"{ckpt_dir}: incomplete official FoX checkpoint (missing {e})") from None
        state = official_to_own_state(state)
        layout = "fox-official"
    else:
        raise UserError(f"{ckpt_dir}: unrecognised checkpoint layout (neither evalsuite nor official FoX)")
    model = ForgettingTransformer(cfg)
    load_state_strict(model, state, ckpt_dir)
    return model.eval(), layout
