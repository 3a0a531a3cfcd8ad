"""The architecture registry: one entry per model family, with its named architectures and checkpoint layouts.

A *family* (FoX, and next GSA, TNL, DRT) is one config dataclass plus one :class:`~evalsuite.models.base.CausalLM`
class. Its *architectures* are named presets of that config (``fox-pro``, ``transformer-llama``, ...), which
model cards name in ``architecture:``. Its *layouts* read released checkpoints (e.g. the official FoX release):
a detector looks at ``config.json`` and the tensor names, a converter returns our config and state dict.

Adding a family is one package that calls :func:`register_family` at import, plus its module name in
``FAMILIES``' built-ins below (or in ``$EVALSUITE_PLUGINS`` for code outside this repository).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, fields

import torch

from evalsuite.errors import UserError
from evalsuite.models.base import CausalLM
from evalsuite.registry import Registry


@dataclass(frozen=True)
class CheckpointLayout:
    """A released checkpoint format of one family.

    ``detect(config, tensor_names)``: whether a directory's ``config.json`` (a dict) and tensor names are in this
    layout. ``convert(config, state)``: our config object and a state dict under our module names.
    """

    name: str
    detect: Callable[[dict, Collection[str]], bool]
    convert: Callable[[dict, dict[str, torch.Tensor]], tuple[object, dict[str, torch.Tensor]]]


@dataclass(frozen=True)
class Family:
    """One model family. ``config_cls`` is a dataclass (its fields are the card's ``config:`` keys; it has
    ``to_dict``); ``architectures`` maps architecture names to config overrides of the dataclass defaults."""

    name: str
    config_cls: type
    model_cls: type[CausalLM]
    architectures: dict[str, dict] = field(default_factory=dict)
    layouts: tuple[CheckpointLayout, ...] = ()
    description: str = ""
    tiny: dict = field(default_factory=dict)  # overrides giving a CPU-sized model (the contract tests use it)

    def make_config(self, architecture: str | None = None, overrides: dict | None = None):
        """The config of ``architecture`` (a preset of this family, or the family name for the defaults) with
        ``overrides`` on top; unknown keys and bad values are UserErrors."""
        preset = {} if architecture in (None, self.name) else self.architectures[architecture]
        values = {**preset, **(overrides or {})}
        known = {f.name for f in fields(self.config_cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise UserError(f"unknown {self.name} config key(s): {', '.join(unknown)}")
        hints = typing.get_type_hints(self.config_cls)
        for key, value in values.items():
            if not _has_type(value, hints[key]):
                raise UserError(
                    f"bad {self.name} config: {key} must be {_type_name(hints[key])}, got {type(value).__name__} "
                    f"{value!r}"
                )
        try:
            return self.config_cls(**values)
        except (TypeError, ValueError, ArithmeticError) as e:
            raise UserError(f"bad {self.name} config: {e}") from None

    def build(self, config) -> CausalLM:
        """A fresh, uninitialised model of ``config``."""
        return self.model_cls(config)


def _has_type(value, hint) -> bool:
    """Whether a config value read from YAML or JSON fits a config field's annotation: a class (an int passes for a
    float, a bool for nothing else), ``X | None`` and the like, or ``list[X]``/``tuple[X, ...]`` element-wise. A hint
    of another form (a Literal, a Callable) is left to the config's own ``__post_init__``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is type(None):
        return value is None
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arg) for arg in args)
    if origin in (list, tuple):
        items = [a for a in args if a is not Ellipsis] or [object]
        return isinstance(value, list | tuple) and all(any(_has_type(v, a) for a in items) for v in value)
    if not isinstance(hint, type):
        return True
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint) -> str:
    return getattr(hint, "__name__", None) if isinstance(hint, type) else str(hint).replace("NoneType", "None")


FAMILIES: Registry[Family] = Registry(
    "model family",
    builtins=("evalsuite.models.fox", "evalsuite.models.gsa", "evalsuite.models.tnl", "evalsuite.models.drt"),
)


def register_family(family: Family) -> Family:
    """Register ``family``; its architecture names must not clash with another family's."""
    for other_name, other in FAMILIES._entries.items():
        clash = (set(family.architectures) | {family.name}) & (set(other.architectures) | {other.name})
        if other_name != family.name and clash:
            raise ValueError(f"architecture name(s) {', '.join(sorted(clash))} already belong to family {other_name}")
    return FAMILIES.register(family.name, family, replace=True)


def resolve_architecture(name: str) -> tuple[Family, str]:
    """(family, architecture) for an architecture name or a bare family name."""
    for family_name, family in FAMILIES.items():
        if name == family_name or name in family.architectures:
            return family, name
    raise UserError(f"unknown architecture {name!r}; known: {', '.join(architecture_names())}")


def architecture_names() -> list[str]:
    """Every registered architecture (the presets of every family), in registration order."""
    return [a for _, family in FAMILIES.items() for a in family.architectures]


def find_layout(config: dict, tensor_names: Collection[str]) -> tuple[Family, CheckpointLayout] | None:
    """The first family layout whose detector accepts a checkpoint, or None."""
    for _, family in FAMILIES.items():
        for layout in family.layouts:
            if layout.detect(config, tensor_names):
                return family, layout
    return None
