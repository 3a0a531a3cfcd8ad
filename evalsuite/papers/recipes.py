"""What produces each column of a table here (its recipe), grouped into runs, and the columns computed from cards.

Recipe kinds (docs/paper-tables.md): ``lm-eval``, ``longbench``, ``loss``, ``niah``, ``passkey``, ``mqar`` and
``summarize`` run one of our tasks; ``params``, ``flops`` and ``card`` are computed from a model card (nothing to
run, no weights: the model is built on the meta device); ``bench`` is measured by ``evalsuite bench`` on a GPU.

Columns of one run kind and settings form a :class:`Job`: one task run per model covers them all (the 14 LongBench
columns of FoX Table 2 are one LongBench run with 14 tasks; the lm-eval columns of a table one lm-eval run).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from evalsuite.errors import UserError
from evalsuite.papers.published import Column, Item

CARD_KINDS = ("params", "flops", "card")
RUN_KINDS = ("lm-eval", "longbench", "loss", "niah", "passkey", "mqar", "summarize")
GPU_KINDS = ("bench",)
TOKEN_KINDS = ("loss", "passkey")  # need token-level scores: a text-only (API) model is refused
# The recipe fields that vary from column to column of one run; the rest are the run's settings.
COLUMN_FIELDS = {
    "lm-eval": ("task", "metric", "shots", "scale"),
    "longbench": ("dataset",),
    "loss": ("length", "metric"),
    "niah": ("length", "metric"),
    "passkey": ("length",),
    "mqar": ("d_model", "scale"),
    "summarize": ("metric",),
}
# The `evalsuite bench` command that measures each bench op (None: no command measures it yet).
BENCH_COMMANDS = {
    "attention": "evalsuite bench attention",
    "linear": "evalsuite bench linear --modes fwd,fwdbwd",
    "decode": "evalsuite bench linear --modes decode,memory",
    "generate": "evalsuite bench generate",
    "gca": "evalsuite bench gca",
    "train_step": None,
}


@dataclass(frozen=True)
class Job:
    """Columns one task run per model produces: the recipe ``kind``, the run's ``settings`` (recipe fields shared by
    its columns, sorted pairs) and the ``columns``."""

    kind: str
    settings: tuple[tuple[str, object], ...]
    columns: tuple[Column, ...]

    def setting(self, name: str, default=None):
        return dict(self.settings).get(name, default)

    def values(self, name: str) -> list:
        """The distinct values of a per-column recipe field, in column order."""
        return list(dict.fromkeys(c.recipe[name] for c in self.columns if c.recipe.get(name) is not None))


def jobs(item: Item) -> list[Job]:
    """The runs ``item`` needs, in column order (card and bench columns are not runs)."""
    grouped: dict[tuple, list[Column]] = {}
    for column in item.columns:
        recipe = column.recipe
        if recipe is None or recipe["kind"] not in RUN_KINDS:
            continue
        varying = COLUMN_FIELDS[recipe["kind"]]
        settings = tuple(sorted((k, v) for k, v in recipe.items() if k != "kind" and k not in varying))
        grouped.setdefault((recipe["kind"], settings), []).append(column)
    return [Job(kind, settings, tuple(columns)) for (kind, settings), columns in grouped.items()]


def describe(recipe: dict | None) -> str:
    """A short label of what produces a column (``longbench qasper``, ``lm-eval hellaswag acc_norm, 0-shot``)."""
    if recipe is None:
        return "not a measurement"
    kind, r = recipe["kind"], recipe
    if kind == "lm-eval":
        shots = f", {r['shots']}-shot" if r.get("shots") is not None else ""
        return f"lm-eval {r['task']} {r['metric']}{shots}"
    if kind == "longbench":
        return f"longbench {r['dataset']}"
    if kind == "loss":
        return f"loss P({r['length']})" if r.get("metric", "ppl") == "ppl" else f"loss {r['metric']} at {r['length']}"
    if kind in ("niah", "passkey"):
        return f"{kind} {r.get('mode', r.get('kind'))} at {r['length']}"
    if kind == "mqar":
        return f"mqar {r['preset']} d={r['d_model']}"
    if kind == "params":
        return f"params ({r['what'].replace('_', '-')})"
    if kind == "flops":
        return f"flops {r['formula']}"
    if kind == "bench":
        return f"bench {r['op']} {r['metric']}"
    return f"{kind} {r.get('field') or r.get('metric')}"


def bench_command(recipe: dict) -> str:
    command = BENCH_COMMANDS.get(recipe["op"])
    return command or f"no `evalsuite bench` command measures {recipe['op']} {recipe['metric']} yet"


# --- columns computed from a model card ---------------------------------------------------------------------------


def _flag(name: str) -> Callable:
    return lambda config: getattr(config, name, None)


# Architecture facts of a card's config (FoX Tables 3 and 4): hyperparameters, and the components of the FoX
# paper's ablations as booleans (None where the family has no such switch).
CARD_FIELDS: dict[str, Callable] = {
    "n_layer": lambda config: config.num_layers,
    "d_model": lambda config: config.hidden_size,
    "n_head": lambda config: config.num_heads,
    "d_head": lambda config: config.hidden_size // config.num_heads,
    "rope": _flag("use_rope"),
    "forget_gate": lambda config: None if not hasattr(config, "fgate_type") else config.fgate_type != "none",
    "qk_norm": _flag("qk_norm"),
    "output_gate": _flag("use_output_gate"),
    "output_norm": _flag("use_output_norm"),
    "kv_shift": lambda config: getattr(config, "use_k_shift", None) and getattr(config, "use_v_shift", None),
}


def flops_per_token(formula: str, symbols: dict[str, float | None]) -> float:
    """A FLOPs formula as the paper writes it (``2N + 2 n_layer d_model L``: terms joined by +, factors by spaces or
    juxtaposition) evaluated with ``symbols``; a symbol the card does not define is a UserError naming it."""
    total = 0.0
    for term in formula.split("+"):
        product = 1.0
        for factor in re.split(r"[\s·*×]+", term.strip()):
            match = re.fullmatch(r"(\d+(?:\.\d+)?)?([A-Za-z_]\w*)?", factor)
            if not factor or match is None:
                raise UserError(f"cannot read FLOPs formula {formula!r} (at {factor!r})")
            if match[1]:
                product *= float(match[1])
            if match[2]:
                if symbols.get(match[2]) is None:
                    known = ", ".join(k for k, v in symbols.items() if v is not None)
                    raise UserError(f"FLOPs formula {formula!r}: {match[2]} is not known for this model ({known})")
                product *= symbols[match[2]]
        total += product
    return total


def card_value(recipe: dict, card) -> float | bool | None:
    """The value of a ``params``, ``flops`` or ``card`` column for a model card (:class:`evalsuite.cards.ModelCard`).
    Parameters are counted on the meta device; ``N`` in a FLOPs formula is the non-embedding count (the FoX paper's
    Table 6 Params), ``L`` the card's training length."""
    from evalsuite.cards import count_params

    kind = recipe["kind"]
    if kind == "params":
        if recipe["what"] not in ("total", "non_embedding"):
            raise UserError(f"params recipe: what must be total or non_embedding, got {recipe['what']!r}")
        return float(count_params(card, non_embedding=recipe["what"] == "non_embedding"))
    config = card.model_config()
    if kind == "card":
        if recipe["field"] not in CARD_FIELDS:
            raise UserError(f"card recipe: field must be one of {', '.join(CARD_FIELDS)}, got {recipe['field']!r}")
        return CARD_FIELDS[recipe["field"]](config)
    symbols = {"N": float(count_params(card)), "L": card.train_length, "d_state": None,
               **{name: CARD_FIELDS[name](config) for name in ("n_layer", "d_model", "d_head")}}  # fmt: skip
    return flops_per_token(recipe["formula"], symbols)
