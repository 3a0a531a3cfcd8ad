"""The adapter registry: how ``--model KIND:NAME`` becomes an adapter.

``native`` (the default kind, so ``--model fox-pro`` means ``native:fox-pro``) builds our models from cards; ``hf``
(HF transformers) and ``openai`` (any OpenAI-compatible endpoint) are the further built-in kinds. Kind-specific
options follow the name after commas (``hf:DIR,max_length=8192``, ``openai:MODEL,base_url=URL,api=completions``),
so every command that takes ``--model`` passes them unchanged. A factory takes the name after the
colon and the shared :class:`AdapterOptions`, and returns a :class:`~evalsuite.adapters.base.TextAdapter`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evalsuite.adapters.base import TextAdapter
from evalsuite.errors import UserError
from evalsuite.registry import Registry

DEFAULT_KIND = "native"


@dataclass
class AdapterOptions:
    """The model options every command shares; an adapter uses those that apply to it."""

    device: str = "auto"
    dtype: str = "float32"
    checkpoint: Path | None = None
    attention: str = "auto"
    compile: bool = False  # native: full-sequence forwards through torch.compile


AdapterFactory = Callable[[str, AdapterOptions], TextAdapter]
ADAPTERS: Registry[AdapterFactory] = Registry(
    "model kind", builtins=("evalsuite.adapters.native", "evalsuite.adapters.hf", "evalsuite.adapters.openai_api")
)


def split_spec(spec: str) -> tuple[str, str]:
    """``"hf:gpt2"`` -> ``("hf", "gpt2")``; no known kind prefix -> the native kind (card names and card paths)."""
    kind, sep, name = spec.partition(":")
    if sep and kind in ADAPTERS:
        return kind, name
    return DEFAULT_KIND, spec


def parse_options(kind: str, name: str, keys: tuple[str, ...], missing: str) -> tuple[str, dict[str, str]]:
    """A kind's ``NAME,key=value,...`` -> ``(NAME, {key: value})``; a key not in ``keys`` is a UserError, and so is
    an empty NAME (``missing`` is that message)."""
    head, *pairs = name.split(",")
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or key.strip() not in keys:
            raise UserError(f"{kind}:{name}: expected key=value with key one of {', '.join(keys)}; got {pair!r}")
        options[key.strip()] = value.strip()
    if not head.strip():
        raise UserError(missing)
    return head.strip(), options


def positive_int_option(options: dict[str, str], key: str, where: str) -> int | None:
    """``options[key]`` as a positive integer, None when absent; ``where`` starts the error message."""
    value = options.get(key)
    if value is None:
        return None
    if not value.isdigit() or int(value) < 1:
        raise UserError(f"{where}: {key} must be a positive integer; got {value!r}")
    return int(value)


def load_adapter(spec: str, options: AdapterOptions | None = None) -> TextAdapter:
    """The adapter for a ``--model`` value."""
    kind, name = split_spec(spec)
    if kind == DEFAULT_KIND and name == spec:
        _check_kind(spec)
    return ADAPTERS.get(kind)(name, options or AdapterOptions())


def _check_kind(spec: str) -> None:
    """A UserError naming the model kinds when ``spec`` reads as ``KIND:NAME`` of an unknown kind and is neither a
    card's name nor a card file (names may hold a colon, so those win)."""
    prefix, sep, _ = spec.partition(":")
    if not sep or spec.endswith((".yaml", ".yml")) or os.sep in spec:
        return
    from evalsuite.cards import list_cards

    if any(card.name == spec for card in list_cards()):
        return
    raise UserError(
        f"unknown model {spec!r}: {prefix!r} is not a model kind (--model KIND:NAME with KIND one of "
        f"{', '.join(ADAPTERS.names())}), nor is there a card of that name"
    )
