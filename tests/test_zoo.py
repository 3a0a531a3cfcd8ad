"""The zoo preset (tasks/train-lm.yaml, models/zoo-*.yaml) and `evalsuite train-lm --preset`."""

import json

import pytest
import torch

from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.training.zoo import TrainPreset, load_preset, member_dir, train_preset


def _params(name: str) -> int:
    with torch.device("meta"):
        model = load_card(name).build_module()
    return sum(p.numel() for p in model.parameters())


def test_zoo_is_every_family_matched_and_small():
    preset = load_preset("zoo")
    archs = {load_card(m).architecture for m in preset.models}
    assert archs == {"fox-pro", "fox-llama", "transformer-pro", "transformer-llama", "gsa", "tnl", "drt"}
    cards = [load_card(m) for m in preset.models]
    assert {c.tokenizer for c in cards} == {"bytes"} and {c.train_length for c in cards} == {preset.seq_len}
    counts = [_params(m) for m in preset.models]
    mean = sum(counts) / len(counts)
    assert all(abs(n / mean - 1) <= 0.10 for n in counts), counts  # matched parameter counts, ±10%
    assert 2 * sum(counts) <= 32 * 10**6  # all zoo weights in bf16 at most 32 MB
    assert len(preset.seeds) >= 2


def test_unknown_preset_is_one_line():
    with pytest.raises(UserError, match="unknown train-lm preset 'nope'; known: zoo"):
        load_preset("nope")


def test_train_preset_trains_each_member_once(tmp_path):
    corpus = tmp_path / "books.txt"
    corpus.write_text("".join(f"Chapter {i}. The quick brown fox jumps over the lazy dog.\n" for i in range(600)))
    preset = TrainPreset(name="t", models=("zoo-fox-pro", "zoo-tnl"), seeds=(0, 1), seq_len=64, batch_size=2,
                         steps=3, warmup_steps=1, eval_every=3)  # fmt: skip
    lines = []
    summary = train_preset(preset, str(corpus), tmp_path / "zoo", device="cpu", log=lines.append)
    assert [(m["model"], m["seed"]) for m in summary["members"]] == preset.members()
    assert all(m["tokens_seen"] == 3 * 2 * 64 for m in summary["members"])
    first = member_dir(tmp_path / "zoo", "zoo-tnl", 1) / "train.json"
    stamp = first.stat().st_mtime_ns
    assert json.loads(first.read_text())["config"]["seed"] == 1
    again = train_preset(preset, str(corpus), tmp_path / "zoo", device="cpu", log=lines.append)
    assert first.stat().st_mtime_ns == stamp  # trained members are not trained again
    assert again["members"] == summary["members"]
    assert "0 of 4 runs to train" in lines[-1]
