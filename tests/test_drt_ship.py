"""scripts/drt_claim/ship.py: a trained checkpoint becomes a card with its own weights that loads by name and gives
the checkpoint's logits; checkpoints over the size limit or from another card are refused."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.models.checkpoint import save_checkpoint
from evalsuite.training.train import build_model

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "drt_claim" / "ship.py"
CARD = ROOT / "models" / "drt-tiny.yaml"


def _load_ship():
    spec = importlib.util.spec_from_file_location("drt_ship", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trained(tmp_path: Path) -> Path:
    model = build_model(load_card(str(CARD)), seed=3)
    ckpt = tmp_path / "run" / "checkpoint"
    save_checkpoint(model, ckpt, dtype=torch.bfloat16)
    return ckpt


def test_ship_writes_a_card_that_loads_by_name(tmp_path, monkeypatch):
    ckpt = _trained(tmp_path)
    models = tmp_path / "models"
    run = [sys.executable, str(SCRIPT), "--checkpoint", str(ckpt), "--card", str(CARD), "--name", "drt-shipped",
           "--describe", "a test model", "--models", str(models)]  # fmt: skip
    done = subprocess.run(run, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    card = yaml.safe_load((models / "drt-shipped.yaml").read_text())
    assert card["weights"] == {"source": "own", "path": "weights/drt-shipped"}
    assert card["architecture"] == "drt" and card["config"] == yaml.safe_load(CARD.read_text())["config"]
    shipped = sorted(p.name for p in (models / "weights" / "drt-shipped").iterdir())
    assert shipped == ["config.json", "model.safetensors"]
    monkeypatch.setenv("EVALSUITE_CARDS", str(models))  # a card folder beside the built-in one: found by name
    assert load_card("drt-shipped").weights_summary() == "own: weights/drt-shipped"


def test_ship_refuses_big_or_foreign_checkpoints(tmp_path, monkeypatch):
    ship = _load_ship()
    ckpt = _trained(tmp_path)
    with pytest.raises(UserError, match="was not trained from"):
        ship.ship(ckpt, ROOT / "models" / "fox-pro-tiny.yaml", "x", "x", tmp_path / "models")
    monkeypatch.setattr(ship, "MAX_BYTES", 1000)
    with pytest.raises(UserError, match="more than the 0 MB to ship"):
        ship.ship(ckpt, CARD, "x", "x", tmp_path / "models")
    assert not (tmp_path / "models").exists()  # nothing written


def test_shipped_drt_gutenberg_retrieves_beyond_its_training_length(tmp_path):
    """The shipped model (results/drt-claim/), by name, on the built-in synthetic haystack: trained at
    1,024 bytes, it names all five passkey bytes at 4x that length (4 of 4 on this CPU; 3 allows one miss)."""
    from evalsuite.adapters.native import NativeAdapter
    from evalsuite.tasks.drt_passkey import DrtConfig, run_drt_passkey

    card = load_card("drt-gutenberg")
    assert card.weights_summary() == "own: weights/drt-gutenberg" and card.train_length == 1024
    adapter = NativeAdapter(card, device="cpu")
    res = run_drt_passkey(adapter, DrtConfig(lengths=[4096], samples=4, kind="passkey"), tmp_path / "pk", False)
    exact = [r for r in res["records"] if r["metric"] == "answer_exact"]
    assert len(exact) == 1 and exact[0]["length"] == 4096 and exact[0]["value"] >= 3 / 4, exact
