"""Ship a model trained by scripts/drt_claim/run.sh: its checkpoint becomes ``<models>/weights/<name>/`` and a card
``<models>/<name>.yaml`` names it, so ``evalsuite passkey --model <name>`` runs it with nothing to download. The card
keeps the training card's architecture, config, tokenizer and lengths; its weights are ``{source: own, path:
weights/<name>}``. A shipped checkpoint must be at most 8 MB (the limit on shipped weights; ``train-lm`` stores
bf16). After writing, the model is loaded through the new card and must give the checkpoint's logits on a short
input.

    python scripts/drt_claim/ship.py --checkpoint RUN/drt/checkpoint --card scripts/drt_claim/drt-bytes.yaml \\
        --name drt-gutenberg --describe "DRT trained on ... (results/drt-claim/)"
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
import yaml

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.models.checkpoint import load_checkpoint, read_config, weight_files

MAX_BYTES = 8 * 10**6
CARD_KEYS = ("architecture", "config", "tokenizer", "train_length", "max_length")


def ship(checkpoint: Path, card_path: Path, name: str, describe: str, models: Path) -> Path:
    """Copy ``checkpoint`` into ``models/weights/name`` and write ``models/name.yaml``; returns the card's path."""
    source = load_card(str(card_path))
    saved = read_config(checkpoint)
    if saved.get("architecture") != source.architecture or saved.get("config") != source.model_config().to_dict():
        raise UserError(f"{checkpoint} was not trained from {card_path} (architecture or config differ)")
    size = sum(f.stat().st_size for f in weight_files(checkpoint))
    if size > MAX_BYTES:
        raise UserError(f"{checkpoint}: {size / 1e6:.1f} MB of weights, more than the {MAX_BYTES / 1e6:.0f} MB to ship")
    target = models / "weights" / name
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copy2(checkpoint / f, target / f)
    card = {"description": describe, **{k: getattr(source, k) for k in CARD_KEYS if getattr(source, k) is not None}}
    card["weights"] = {"source": "own", "path": f"weights/{name}"}
    path = models / f"{name}.yaml"
    path.write_text(yaml.safe_dump(card, sort_keys=False, width=120))
    return path


@torch.inference_mode()
def check(card_path: Path, checkpoint: Path) -> float:
    """Largest |logit| difference between the model loaded through the card and the checkpoint itself (CPU)."""
    shipped = NativeAdapter(load_card(str(card_path)), device="cpu", dtype="float32")
    model, _ = load_checkpoint(checkpoint)
    ids = torch.arange(1, 130).remainder(shipped.tokenizer.vocab_size)[None]
    return (shipped.model.logits(shipped.model(ids)) - model.logits(model(ids))).abs().max().item()


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="The run's checkpoint directory.")
    ap.add_argument("--card", type=Path, required=True, help="The card it was trained from.")
    ap.add_argument("--name", required=True, help="The shipped model's name, e.g. drt-gutenberg.")
    ap.add_argument("--describe", required=True, help="The card's description: what was trained, and where.")
    ap.add_argument("--models", type=Path, default=Path("models"), help="The cards' folder (default: models).")
    args = ap.parse_args(argv)
    try:
        path = ship(args.checkpoint, args.card, args.name, args.describe, args.models)
        diff = check(path, args.checkpoint)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    if diff != 0.0:
        raise SystemExit(f"error: the shipped {args.name} gives other logits than {args.checkpoint} (max diff {diff})")
    print(f"wrote {path} and {args.models / 'weights' / args.name}; loads and gives the checkpoint's logits")


if __name__ == "__main__":
    main()
