"""Checkpoints: our own format, and the released layouts each model family registers.

Our format is a directory with ``config.json`` (``{"format": "evalsuite", "architecture": ..., "config": {...}}``)
and ``model.safetensors`` holding the state dict under our module names; ``architecture`` is an architecture or
family name of the registry (:mod:`evalsuite.models.registry`). Any other directory is offered to the families'
layout detectors (e.g. the official FoX release, :mod:`evalsuite.models.fox.official`), which read
``config.json`` and the tensor names; the first that accepts it converts it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from evalsuite.errors import UserError
from evalsuite.models.base import skip_random_init
from evalsuite.runs.store import file_sha256, read_json_file

OWN_FORMAT = "evalsuite"


def weight_files(ckpt_dir: Path) -> list[Path]:
    """The weight files of a checkpoint directory, in load order."""
    ckpt_dir = Path(ckpt_dir)
    single = ckpt_dir / "model.safetensors"
    if single.exists():
        return [single]
    index = ckpt_dir / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{index}: not a valid safetensors index ({type(e).__name__})") from None
        return [ckpt_dir / s for s in shards]
    bins = sorted(ckpt_dir.glob("pytorch_model*.bin"))
    if bins:
        return bins
    for name in ("model.bin", "model_best.bin"):  # what the DRT authors' trainer writes (torch.save of a state dict)
        if (ckpt_dir / name).exists():
            return [ckpt_dir / name]
    raise UserError(f"{ckpt_dir}: no model.safetensors, model.safetensors.index.json, pytorch_model.bin or model.bin")


def read_state_dict(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    state: dict[str, torch.Tensor] = {}
    for f in weight_files(ckpt_dir):
        try:
            if f.suffix == ".safetensors":
                state.update(load_file(str(f)))
            else:
                state.update(torch.load(f, map_location="cpu", weights_only=True))
        except Exception as e:  # noqa: BLE001 - safetensors/pickle raise assorted types for a bad file
            raise UserError(f"{f}: cannot read weights ({type(e).__name__}: {str(e)[:200]})") from None
    return state


def read_config(ckpt_dir: Path) -> dict:
    path = Path(ckpt_dir) / "config.json"
    if not path.exists():
        raise UserError(f"{ckpt_dir}: no config.json (is this a checkpoint directory?)")
    return read_json_file(path, "checkpoint config")


def checkpoint_sha256(ckpt_dir: Path) -> str:
    return file_sha256(weight_files(ckpt_dir))


def save_checkpoint(
    model: torch.nn.Module, ckpt_dir: Path, architecture: str | None = None, dtype: torch.dtype | None = None
) -> None:
    """Write ``model`` in our format; ``architecture`` defaults to the model's family name; ``dtype``: store the
    floating-point tensors in it (default: as they are)."""
    from evalsuite.models.registry import FAMILIES

    if architecture is None:
        architecture = next((n for n, f in FAMILIES.items() if isinstance(model, f.model_cls)), None)
        if architecture is None:
            raise UserError(f"{type(model).__name__} belongs to no registered model family")
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)

    def stored(v: torch.Tensor) -> torch.Tensor:  # one copy in the stored dtype: parameters may be rows of one
        # shared buffer (evalsuite/models/packed.py), which safetensors refuses
        cast = dtype if dtype is not None and v.is_floating_point() else v.dtype
        return v.detach().to("cpu", dtype=cast, copy=True).contiguous()

    state = {k: stored(v) for k, v in model.state_dict().items()}
    save_file(state, str(ckpt_dir / "model.safetensors"))
    cfg = {"format": OWN_FORMAT, "architecture": architecture, "config": model.config.to_dict()}
    (ckpt_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def load_state_strict(model: torch.nn.Module, state: dict[str, torch.Tensor], where: Path) -> None:
    """Copy ``state`` into ``model``; any missing, unexpected or misshapen tensor is a UserError naming it."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise UserError(f"{where}: checkpoint is missing tensor(s) {', '.join(missing[:5])}{more}")
    if unexpected:
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise UserError(f"{where}: checkpoint has unexpected tensor(s) {', '.join(unexpected[:5])}{more}")
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise UserError(
                f"{where}: tensor {k} has shape {tuple(state[k].shape)}, the model expects {tuple(v.shape)}"
            )
    model.load_state_dict({k: v.to(expected[k].dtype) for k, v in state.items()})


def checkpoint_dir(path: Path) -> Path:
    """``path`` when it is a directory; a UserError saying what it is otherwise (a file, or nothing)."""
    path = Path(path)
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"checkpoint {path} is a file; give the directory holding its config.json and weights")
    raise UserError(f"checkpoint directory {path} does not exist")


def load_checkpoint(ckpt_dir: Path):
    """Build the model stored in ``ckpt_dir``: our format (dispatch on its saved architecture) or a family's
    released layout (dispatch on the layout detectors).

    Returns the model (fp32, CPU, eval mode) and the layout name ("evalsuite" or e.g. "fox-official").
    """
    from evalsuite.models.registry import find_layout, resolve_architecture

    ckpt_dir = checkpoint_dir(ckpt_dir)
    config = read_config(ckpt_dir)
    state = read_state_dict(ckpt_dir)
    if config.get("format") == OWN_FORMAT:
        if not isinstance(config.get("config"), dict) or not isinstance(config.get("architecture"), str):
            raise UserError(f"{ckpt_dir}/config.json: an evalsuite checkpoint needs 'architecture' and 'config'")
        family, _ = resolve_architecture(config["architecture"])
        try:
            cfg = family.make_config(None, config["config"])
        except UserError as e:
            raise UserError(f"{ckpt_dir}/config.json: {e}") from None
        layout = OWN_FORMAT
    else:
        found = find_layout(config, set(state))
        if found is None:
            raise UserError(f"{ckpt_dir}: unrecognised checkpoint layout (not evalsuite's, nor a registered release)")
        family, released = found
        try:
            cfg, state = released.convert(config, state)
        except UserError as e:
            raise UserError(f"{ckpt_dir}: {e}") from None
        layout = released.name
    with skip_random_init():  # every tensor comes from the checkpoint (the load is strict)
        model = family.build(cfg)
    load_state_strict(model, state, ckpt_dir)
    return model.eval(), layout
