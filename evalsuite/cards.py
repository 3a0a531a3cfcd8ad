"""Model cards: YAML files naming an architecture, its hyperparameters, tokenizer, context lengths and
where the weights come from. Built-in cards ship in ``models/`` (package data in a wheel); more can be
added with ``$EVALSUITE_CARDS`` (directories, ``:``-separated) or by passing a path to a YAML file.

Card keys::

    name: fox-pro                  # defaults to the file name
    description: FoX (Pro), 760M, 48B LongCrawl64 tokens
    architecture: fox-pro          # an architecture (or family) of evalsuite.models.registry
    config: {hidden_size: 1536, ...}   # overrides of the architecture's preset
    tokenizer: gpt2-json           # see evalsuite.tokenizers.get_tokenizer; "checkpoint": the weights' own
    train_length: 16384            # training context (dashed lines, within/beyond summaries)
    max_length: 65536              # longest context the suite will feed it
    weights: {source: random | own | <a released layout, e.g. fox-official>, ...}  # own: path, trained_tokens
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.resources import builtin_dir, read_yaml

# Types of the card's keys (None: optional). Checked when a card is read, so a wrong type is one clear line.
_CARD_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "description": (str,),
    "architecture": (str,),
    "config": (dict,),
    "tokenizer": (str,),
    "train_length": (int, type(None)),
    "max_length": (int, type(None)),
    "weights": (dict,),
}
_REQUIRED = ("architecture", "tokenizer", "weights")


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

    @property
    def family(self):
        """The card's model family (:class:`evalsuite.models.registry.Family`)."""
        from evalsuite.models.registry import resolve_architecture

        return resolve_architecture(self.architecture)[0]

    def model_config(self):
        """The family's config: the architecture preset, then the card's overrides."""
        try:
            return self.family.make_config(self.architecture, self.config)
        except UserError as e:
            raise UserError(f"model card {self.name}: {e}") from None

    def build_module(self):
        """A fresh, uninitialised module of this card's architecture: fill it with ``init_weights(seed)`` or a
        checkpoint (torch's default random init is skipped, see :func:`~evalsuite.models.base.skip_random_init`)."""
        from evalsuite.models.base import skip_random_init

        with skip_random_init():
            return self.family.build(self.model_config())

    def with_config(self, overrides: dict) -> ModelCard:
        """This card with config ``overrides`` on top (e.g. MQAR's widths)."""
        return replace(self, config={**self.config, **overrides})

    def weights_summary(self) -> str:
        src = self.weights["source"]
        if src == "random":
            return f"random init (seed {self.weights.get('seed', 0)})"
        if src == "own":
            tokens = self.weights.get("trained_tokens")  # the tokens it was trained on, where the card says
            return f"own: {self.weights['path']}" + (f" (trained on {tokens / 1e6:.0f}M tokens)" if tokens else "")
        return f"{src}: {self.weights.get('repo', self.weights.get('path', ''))}"

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in sorted(_CARD_TYPES)}
        d["path"] = str(self.path) if self.path else None
        return d


def card_dirs() -> list[Path]:
    """The built-in cards' folder, then each folder of ``$EVALSUITE_CARDS``; a named folder that is not one is a
    UserError (skipped, its cards would be missing with no word why)."""
    extra = [Path(p) for p in os.environ.get("EVALSUITE_CARDS", "").split(os.pathsep) if p]
    for folder in extra:
        if not folder.is_dir():
            raise UserError(
                f"$EVALSUITE_CARDS names {folder}, which is not a directory (folders of card YAML files, "
                f"separated by {os.pathsep!r})"
            )
    return [builtin_dir("models"), *extra]


def weight_sources() -> list[str]:
    """``random``, ``own``, and every released layout a family registers (e.g. ``fox-official``)."""
    from evalsuite.models.registry import FAMILIES

    return ["random", "own", *(layout.name for _, f in FAMILIES.items() for layout in f.layouts)]


def parse_card(path: Path) -> ModelCard:
    """Read and validate one card; every problem is a UserError naming the file and the key."""
    from evalsuite.models.registry import resolve_architecture

    raw = read_yaml(path, "model card")
    unknown = set(raw) - set(_CARD_TYPES)
    if unknown:
        raise UserError(f"model card {path}: unknown key(s) {', '.join(sorted(unknown))}")
    for key in _REQUIRED:
        if key not in raw:
            raise UserError(f"model card {path}: missing '{key}'")
    for key, value in raw.items():
        types = _CARD_TYPES[key]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            wanted = " or ".join("null" if t is type(None) else t.__name__ for t in types)
            raise UserError(f"model card {path}: '{key}' must be {wanted}, got {type(value).__name__} {value!r}")
    for key in ("train_length", "max_length"):
        if raw.get(key) is not None and raw[key] < 1:
            raise UserError(f"model card {path}: '{key}' must be positive, got {raw[key]}")
    try:
        resolve_architecture(raw["architecture"])
    except UserError as e:
        raise UserError(f"model card {path}: {e}") from None
    sources = weight_sources()
    if raw["weights"].get("source") not in sources:
        raise UserError(f"model card {path}: weights.source must be one of {', '.join(sources)}")
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
        if Path(name_or_path).is_dir():
            raise _directory_given(name_or_path)
        if not Path(name_or_path).is_file():
            raise UserError(f"model card file {name_or_path} does not exist")
        return parse_card(Path(name_or_path))
    cards = list_cards()
    for card in cards:
        if card.name == name_or_path:
            return card
    if Path(name_or_path).is_dir():
        raise _directory_given(name_or_path)
    raise UserError(f"unknown model {name_or_path!r}; known models: {', '.join(c.name for c in cards)}")


def _directory_given(path: str) -> UserError:
    return UserError(
        f"model {path} is a directory, not a model card (a card name or a card's YAML file); for a Hugging Face "
        f"model directory give hf:{path}, for a checkpoint of ours its card and --checkpoint {path}"
    )


def architecture_card(architecture: str) -> ModelCard:
    """A bare card of an architecture (its preset config, random weights, no tokenizer): MQAR trains these."""
    from evalsuite.models.registry import resolve_architecture

    resolve_architecture(architecture)
    return ModelCard(name=architecture, architecture=architecture, tokenizer="none", weights={"source": "random"})


def count_params(card: ModelCard, non_embedding: bool = True) -> int:
    """Parameter count from the config alone (built on the meta device, no memory)."""
    import torch

    with torch.device("meta"):
        model = card.build_module()
    return model.num_params(non_embedding)
