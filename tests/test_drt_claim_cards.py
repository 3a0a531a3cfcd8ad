"""The model cards of the small-scale DRT claim (scripts/drt_claim/): each set (GPT-2 tokens, bytes) has a DRT,
a FoX (Pro) and a Transformer of similar size whose bf16 weights can ship (at most 8 MB, safetensors)."""

from pathlib import Path

import pytest

from evalsuite.cards import load_card
from evalsuite.training.train import build_model

CARDS = Path(__file__).resolve().parent.parent / "scripts" / "drt_claim"


@pytest.mark.parametrize("suffix", ["gutenberg", "bytes"])
def test_card_sets_ship_and_match_in_size(suffix):
    sizes = {}
    for name in ("drt", "fox-pro", "transformer-llama"):
        card = load_card(str(CARDS / f"{name}-{suffix}.yaml"))
        model = build_model(card, seed=0)
        sizes[name] = sum(p.numel() for p in model.parameters())
        assert card.train_length == 1024 and card.architecture == name
        assert 2 * sizes[name] <= 8e6, (name, sizes[name])  # bf16 bytes
    assert max(sizes.values()) <= 1.15 * min(sizes.values()), sizes
    tokenizers = {load_card(str(CARDS / f"{n}-{suffix}.yaml")).tokenizer for n in sizes}
    assert len(tokenizers) == 1
