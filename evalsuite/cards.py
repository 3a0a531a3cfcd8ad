"""Model cards: YAML files naming an architecture, its hyperparameters, tokenizer, context lengths and
where the weights come from. Built-in cards ship in ``models/`` (package data in a wheel); more can be
added with ``$EVALSUITE_CARDS`` (directories, ``:``-separated) or by passing a path to a YAML file.

Card keys::

    name: fox-pro                  # defaults to the file name
    description: FoX (Pro), 760M, 48B LongCrawl64 tokens
    architecture: fox-pro          # a key of ARCHITECTURES
    config: {hidden_size: 1536, ...}   # overrides of the architecture's preset
    tokenizer: gpt2-json           # see evalsuite.tokenizers.get_tokenizer
    train_length: 16384            # training context (dashed lines, within/beyond summaries)
    max_length: 65536              # longest context the suite will feed it
    weights: {source: random | own | fox-official, ...}
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import yaml

from evalsuite.errors import UserError

# Architecture presets: the paper's four block designs as FoxConfig overrides (fox.md §5).
_PRO = dict(qk_norm=True, use_output_gate=True, use_output_norm=True, use_k_shift=True, use_v_shift=True)
_LLAMA = dict(qk_norm=False, use_output_gate=False, use_output_norm=False, use_k_shift=False, use_v_shift=False)
ARCHITECTURES: dict[str, dict] = {
    "fox-pro": dict(fgate_type="full", use_rope=False, hidden_ratio=3.5, **_PRO),
    "fox-llama": dict(fgate_type="full", use_rope=False, hidden_ratio=4, **_LLAMA),
    "transformer-pro": dict(fgate_type="none", use_rope=True, hidden_ratio=3.5, **_PRO),
    "transformer-llama": dict(fgate_type="none", use_rope=True, hidden_ratio=4, **_LLAMA),
}
WEIGHT_SOURCES = ("random", "own", "fox-official")
_CARD_KEYS = {"name", "description", "architecture", "config", "tokenizer", "train_length", "max_length", "weights"}


@dataclass
class ModelCard:
    name: str
    architecture: str
    tokenizer: str
    weights: dict
    config: dict = field(default_factory=dict)
    description: str = ""
    train_length: int | None = None
    max_length: int | None = None
    path: Path | None = None

    def model_config(self):
        """The full FoxConfig: architecture preset, then the card's overrides."""
        from evalsuite.models.fox import FoxConfig

        try:
            return FoxConfig.from_dict({**ARCHITECTURES[self.architecture], **self.config})
        except (ValueError, TypeError) as e:
            raise UserError(f"model card {self.name}: {e}") from None

    def build_module(self):
        """A fresh, uninitialised module of this card's architecture (the one place that maps cards to
        module classes; new architectures extend it with ``model_config``)."""
        from evalsuite.models.fox import ForgettingTransformer

        return ForgettingTransformer(self.model_config())

    def weights_summary(self) -> str:
        src = self.weights["source"]
        if src == "random":
            return f"random init (seed {self.weights.get('seed', 0)})"
        if src == "own":
            return f"own: {self.weights['path']}"
        return f"{src}: {self.weights.get('repo', self.weights.get('path', ''))}"

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in sorted(_CARD_KEYS)}
        d["path"] = str(self.path) if self.path else None
        return d


def builtin_dir(kind: str) -> Path:
    """``models`` or ``tasks``: inside the installed package (wheel) or at the repo root (editable)."""
    packaged = resources.files("evalsuite") / "_data" / kind
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parent.parent / kind


def card_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("EVALSUITE_CARDS", "").split(os.pathsep) if p]
    return [builtin_dir("models"), *extra]


def parse_card(path: Path) -> ModelCard:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise UserError(f"cannot read model card {path}: {e}") from None
    if not isinstance(raw, dict):
        raise UserError(f"model card {path} is not a YAML mapping")
    unknown = set(raw) - _CARD_KEYS
    if unknown:
        raise UserError(f"model card {path}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in ("architecture", "tokenizer", "weights"):
        if key not in raw:
            raise UserError(f"model card {path}: missing '{key}'")
    if raw["architecture"] not in ARCHITECTURES:
        raise UserError(f"model card {path}: unknown architecture {raw['architecture']!r}")
    weights = raw["weights"]
    if not isinstance(weights, dict) or weights.get("source") not in WEIGHT_SOURCES:
        raise UserError(f"model card {path}: weights.source must be one of {', '.join(WEIGHT_SOURCES)}")
    raw.setdefault("name", Path(path).stem)
    return ModelCard(**raw, path=Path(path))


def list_cards() -> list[ModelCard]:
    cards: dict[str, ModelCard] = {}
    for d in card_dirs():
        if d.is_dir():
            for p in sorted(d.glob("*.yaml")):
                card = parse_card(p)
                cards.setdefault(card.name, card)
    # paper model first, then its tiny twin
    return sorted(cards.values(), key=lambda c: (c.name.removesuffix("-tiny"), c.name.endswith("-tiny")))


def load_card(name_or_path: str) -> ModelCard:
    """A card by name, or from a YAML file path."""
    if name_or_path.endswith((".yaml", ".yml")) or os.sep in name_or_path:
        if not Path(name_or_path).is_file():
            raise UserError(f"model card file {name_or_path} does not exist")
        return parse_card(Path(name_or_path))
    for card in list_cards():
        if card.name == name_or_path:
            return card
    names = ", ".join(c.name for c in list_cards())
    raise UserError(f"unknown model {name_or_path!r}; known models: {names}")


def count_params(card: ModelCard, non_embedding: bool = True) -> int:
    """Parameter count from the config alone (built on the meta device, no memory)."""
    import torch

    with torch.device("meta"):
        model = card.build_module()
    return model.num_params(non_embedding)
