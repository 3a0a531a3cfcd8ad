"""One look per model in every figure: a fixed colour per model family, a readable name, and the markers and line
styles that tell apart what shares a colour (a family's variants, one model's learning rates).

A model is matched to its family by its architecture when the caller knows it (a card's ``architecture``, an MQAR
record's), else by the longest family name that prefixes its own at a word boundary (``fox-pro-tiny`` is FoX
(Pro)); names of no family (``hf:``, ``openai:`` models) take a fallback colour chosen by a hash of the name, so
they too keep their colour from one figure to the next.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class FamilyLook:
    """A model family's colour and the name a figure shows for it."""

    name: str  # architecture prefix, e.g. "fox-pro"
    display: str  # e.g. "FoX (Pro)"
    color: str


# The FoX paper's colours for its models (arXiv:2503.02130; matplotlib's tab10 slots C0-C4, C8, C9), then the other
# families of the suite in the remaining tab10 slots.
FAMILIES = (
    FamilyLook("fox-pro", "FoX (Pro)", "#1f77b4"),
    FamilyLook("transformer-pro", "Transformer (Pro)", "#ff7f0e"),
    FamilyLook("fox-llama", "FoX (LLaMA)", "#2ca02c"),
    FamilyLook("transformer-llama", "Transformer (LLaMA)", "#d62728"),
    FamilyLook("mamba2", "Mamba-2", "#9467bd"),
    FamilyLook("mamba-2", "Mamba-2", "#9467bd"),
    FamilyLook("tnl", "TNL", "#8c564b"),
    FamilyLook("gsa", "GSA", "#e377c2"),
    FamilyLook("drt", "DRT", "#7f7f7f"),
    FamilyLook("hgrn2", "HGRN2", "#bcbd22"),
    FamilyLook("deltanet", "DeltaNet", "#17becf"),
)
# Models of no family: dark tab20b shades, none of them near a family's colour above.
FALLBACK_COLORS = ("#8c6d31", "#637939", "#7b4173", "#843c39", "#393b79", "#bd9e39")
# Words of card names shown otherwise in a figure.
WORDS = {"timescale-init": "time-scale init", "gutenberg": "Gutenberg"}
MARKERS = "os^DvP*Xph<>"  # models of one colour in one figure, base model first
LINESTYLES = ("-", "--", ":", "-.", (0, (5, 1)))  # what one model's lines differ in: learning rates, repeated runs


@dataclass(frozen=True)
class ModelStyle:
    """How one model is drawn in one figure."""

    label: str
    color: str
    marker: str
    linestyle: str | tuple


def family_of(model: str, architecture: str | None = None) -> FamilyLook | None:
    """The family of ``model``: by ``architecture`` when given (and known), else by the longest family name that
    ``model`` holds as whole words (``fox-pro-tiny`` and ``zoo-fox-pro`` are FoX (Pro), ``foxy`` is none); None for a
    model of no family."""
    for name in (architecture, model):
        found = [look for look in FAMILIES if _find(look.name, (name or "").lower()) is not None]
        if found:
            return max(found, key=lambda look: len(look.name))
    return None


def _find(family: str, name: str) -> int | None:
    """Where ``family`` starts in ``name`` as whole words (not inside a longer word), or None."""
    start = name.find(family)
    while start >= 0:
        end = start + len(family)
        if (start == 0 or not name[start - 1].isalnum()) and (end == len(name) or not name[end].isalnum()):
            return start
        start = name.find(family, start + 1)
    return None


def model_color(model: str, architecture: str | None = None) -> str:
    """The fixed colour of ``model``: its family's, or a fallback chosen by a CRC32 of its name."""
    look = family_of(model, architecture)
    if look is not None:
        return look.color
    return FALLBACK_COLORS[zlib.crc32(model.encode()) % len(FALLBACK_COLORS)]


def display_name(model: str, architecture: str | None = None) -> str:
    """A readable name: the family's name and what the model's name adds to it.

    ``fox-pro`` -> "FoX (Pro)", ``fox-pro-tiny`` -> "FoX (Pro), tiny", ``zoo-fox-pro`` -> "FoX (Pro), zoo",
    ``fox-llama-timescale-init`` -> "FoX (LLaMA), time-scale init", ``transformer-llama [untied]`` ->
    "Transformer (LLaMA) [untied]"; a model of no family, or whose name does not hold its family's, keeps its name.
    """
    look = family_of(model, architecture)
    start = None if look is None else _find(look.name, model.lower())
    if start is None:
        return model
    # the words around the family's name, then an MQAR recipe variant's tag ("[untied]")
    rest, bracket, tag = f"{model[:start]}-{model[start + len(look.name) :]}".partition("[")
    words = [w for w in re.split(r"[-_ ]+", rest) if w]
    shown = WORDS.get("-".join(words), " ".join(words))
    return f"{look.display}{', ' + shown if shown else ''}{' ' + bracket + tag if bracket else ''}"


def model_styles(models: Iterable[str], architectures: dict[str, str] | None = None) -> dict[str, ModelStyle]:
    """The style of each model of one figure: its fixed colour, its display name, and for models that share a
    colour (a family's variants: ``fox-llama`` and ``fox-llama-timescale-init``) a marker and line style of their own,
    given in sorted name order ("o" and a solid line for the first, then "s" dashed, "^" dotted, ...)."""
    architectures = architectures or {}
    styles, seen = {}, {}
    for model in sorted(set(models)):
        color = model_color(model, architectures.get(model))
        k = seen.get(color, 0)
        seen[color] = k + 1
        label = display_name(model, architectures.get(model))
        styles[model] = ModelStyle(label, color, MARKERS[k % len(MARKERS)], LINESTYLES[k % len(LINESTYLES)])
    return styles


def value_linestyles(values: Iterable[float]) -> dict[float, str | tuple]:
    """A line style per distinct value (learning rates), in ascending order: solid, dashed, dotted, ..."""
    return {v: LINESTYLES[i % len(LINESTYLES)] for i, v in enumerate(sorted(set(values)))}


def spread(n: int, step: float) -> list[float]:
    """``n`` offsets ``step`` apart, centred on zero (``spread(3, 1.0) == [-1, 0, 1]``)."""
    return [(i - (n - 1) / 2) * step for i in range(n)]


def separate(values: Sequence[float], step: float, tolerance: float) -> list[float]:
    """Offsets that draw nearly equal values apart. Taken from the largest down (ties in their given order), each
    value opens a group of those within ``tolerance`` below it; a group's members are spread ``step`` apart around
    their place, larger values higher; a value with no close neighbour stays where it is. Groups do not chain, so no
    value moves by more than half its group's size times ``step``."""
    order = sorted(range(len(values)), key=lambda i: (-values[i], i))
    offsets = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start + 1
        while end < len(order) and values[order[start]] - values[order[end]] <= tolerance:
            end += 1
        for i, offset in zip(order[start:end], spread(end - start, -step), strict=True):
            offsets[i] = offset
        start = end
    return offsets


def legend_columns(labels: Sequence[str], width_inches: float, fontsize: float = 10.0) -> int:
    """How many legend columns fit across ``width_inches``: each column as wide as the widest label (measured in
    the font) plus matplotlib's default handle, pad and column spacing (4.8 font sizes); at least one, at most one
    per label."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    font = FontProperties(size=fontsize)
    widest = max((text_to_path.get_text_width_height_descent(s, font, ismath=False)[0] for s in labels), default=0)
    spacing = 2.0 * fontsize  # columnspacing: the last column has none after it
    column = widest + (2.0 + 0.8) * fontsize + spacing
    return max(1, min(len(labels), math.floor((72 * width_inches + spacing) / column)))


def legend_below(fig, handles: Sequence, labels: Sequence[str], **kwargs):
    """One legend below every panel of ``fig``, wrapped into as many columns as the figure's width holds (saving
    with ``bbox_inches="tight"`` grows the canvas downwards to fit it). Lays the figure out first (``tight_layout``)."""
    fig.tight_layout()
    ncol = legend_columns(labels, fig.get_figwidth())
    return fig.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol, frameon=False, **kwargs
    )
