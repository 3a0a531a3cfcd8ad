"""What produces each column of a table here (its recipe), grouped into runs, and the columns computed from cards.

Recipe kinds (docs/paper-tables.md): ``lm-eval``, ``longbench``, ``loss``, ``niah``, ``passkey``, ``mqar`` and
``summarize`` run one of our tasks; ``params``, ``flops`` and ``card`` are computed from a model card (nothing to
run, no weights: the model is built on the meta device); ``bench`` is measured by ``evalsuite bench`` on a GPU.

Columns of one run kind and settings form a :class:`Job`: one task run per model covers them all (the 14 LongBench
columns of FoX Table 2 are one LongBench run with 14 tasks; the lm-eval columns of a table one lm-eval run; the
per-token loss columns of one evaluation text one loss run at their longest length).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.format import LENGTH_FIELDS, printed_length
from evalsuite.papers.published import Column, Item

CARD_KINDS = ("params", "flops", "card")
RUN_KINDS = ("lm-eval", "longbench", "loss", "niah", "passkey", "mqar", "summarize")
GPU_KINDS = ("bench",)
TOKEN_KINDS = ("loss", "passkey")  # need token-level scores: a text-only (API) model is refused
# The recipe fields that vary from column to column of one run; the rest are the run's settings.
COLUMN_FIELDS = {
    "lm-eval": ("task", "metric", "shots"),
    "longbench": ("dataset",),
    "loss": ("length", "metric"),
    "niah": ("length",),
    "passkey": ("length",),
    "mqar": ("d_model",),
    "summarize": ("metric",),
}
# The `evalsuite bench` command that measures each bench op (None: no command measures it yet), and each figure
# without columns that a bench run draws (keyed by its id); L, N, C: token counts that bench_command fills in.
BENCH_COMMANDS = {
    "attention": "evalsuite bench attention",
    "linear": "evalsuite bench linear --modes fwd,fwdbwd",
    "decode": "evalsuite bench generate --batches 1 --lengths L --new-tokens N --call-tokens C",
    "train_step": "evalsuite bench train",
    # Lightning, Vanilla and Flash2 (SDPA on its flash backend) at a fixed batch, so that growth in T shows
    "lightning:figure4": (
        "evalsuite bench linear --ops lightning --providers lightning_triton,lightning_vanilla,sdpa_flash "
        "--modes fwd,bwd --batch 1 --seq-lens 1024,2048,4096,8192,16384,32768,65536 "
        "--out results/runs/bench/lightning-figure4"
    ),
}
# The metrics of a bench op its command measures, where not all (no `train_step` `time`: GCA Table 1's training time
# relative to its Base LM).
BENCH_METRICS = {"train_step": ("throughput", "memory")}
# A decode recipe with `offload` (DRT's chunk store in CPU memory or not) is DRT against its Base LM.
OFFLOAD_COMMAND = "evalsuite bench drt-memory --model drt --base drt-base-lm --lengths L --new-tokens N"


def recipe_lengths(item: Item, recipe: dict, name: str = "length") -> list[int]:
    """The token counts a recipe's ``name`` (``length``, ``new_tokens``) stands for in ``item``: its number; the
    rows' lengths for ``row``; the lengths printed in a column for ``{column: KEY}``; none where the paper does not
    state it (null)."""
    value = recipe.get(name)
    if value is None:
        return []
    if value == "row":
        return sorted({row.length for row in item.rows if row.length is not None})
    if isinstance(value, dict):
        at = item.index(value["column"])
        return sorted({n for row in item.rows if (n := printed_length(row.values[at])) is not None})
    return [value]


def at_each_length(item: Item, recipe: dict) -> list[dict]:
    """A recipe at each token count it stands for: itself, one per row length for ``length: row``, one per setting of
    :func:`column_settings` for counts printed in other columns."""
    if recipe.get("length") == "row":
        return [{**recipe, "length": n} for n in recipe_lengths(item, recipe)]
    if any(isinstance(recipe.get(name), dict) for name in LENGTH_FIELDS):
        return [at_setting(recipe, setting) for setting in column_settings(item)]
    return [recipe]


def column_settings(item: Item) -> list[tuple[tuple[str, str], ...]]:
    """Where recipes take token counts from other columns (``{column: KEY}``): the distinct printed cells of those
    columns over the paper's rows, each as ``((KEY, cell), ...)``, the settings our rows are made at (GCA's Table 3:
    ``(("prompt_tokens", "16K"), ("generated_tokens", "128"))`` and the 48K one); none otherwise."""
    keys = list(dict.fromkeys(v["column"] for c in item.columns if c.recipe for name in LENGTH_FIELDS
                              if isinstance(v := c.recipe.get(name), dict)))  # fmt: skip
    settings = [tuple((key, row.values[item.index(key)]) for key in keys) for row in item.rows] if keys else []
    return list(dict.fromkeys(s for s in settings if all(printed_length(cell) is not None for _, cell in s)))


def at_setting(recipe: dict, setting: tuple[tuple[str, str], ...]) -> dict:
    """``recipe`` with each token count printed in another column read from ``setting`` (:func:`column_settings`)."""
    cells = dict(setting)
    counts = {name: printed_length(cells[v["column"]]) for name in LENGTH_FIELDS
              if isinstance(v := recipe.get(name), dict)}  # fmt: skip
    return {**recipe, **counts}


def takes_row_length(item: Item) -> bool:
    """Whether a column of ``item`` takes its length from each row (``length: row``): our rows are then one per
    model and row length."""
    return any((c.recipe or {}).get("length") == "row" for c in item.columns)


def data_name(source: str | None) -> str | None:
    """The evaluation text a run's ``data`` stands for: a built-in corpus by its name (``synthetic``, ``books``), a
    file or folder by its name without suffixes (``/data/pg19-test.jsonl`` is ``pg19-test``)."""
    return Path(source).name.split(".")[0] if source else None


@dataclass(frozen=True)
class Job:
    """Columns one task run per model produces: the recipe ``kind``, the run's ``settings`` (recipe fields shared by
    its columns, sorted pairs), the ``columns`` and the token ``lengths`` they need."""

    kind: str
    settings: tuple[tuple[str, object], ...]
    columns: tuple[Column, ...]
    lengths: tuple[int, ...] = ()

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
    return [
        Job(kind, settings, tuple(columns), tuple(sorted({n for c in columns for n in recipe_lengths(item, c.recipe)})))
        for (kind, settings), columns in grouped.items()
    ]


def describe(recipe: dict | None) -> str:
    """A short label of what produces a column (``longbench qasper``, ``lm-eval hellaswag acc_norm, 0-shot``)."""
    if recipe is None:
        return "not a measurement"
    kind, r = recipe["kind"], recipe
    length = r.get("length") if isinstance(r.get("length"), int) else "each row's length"
    if kind == "lm-eval":
        return f"lm-eval {r['task']} {r['metric']}, {r['shots']}-shot"
    if kind == "longbench":
        return f"longbench {r['dataset']}"
    if kind == "loss":
        return f"loss P({length}) on {r['dataset']}"
    if kind in ("niah", "passkey"):
        return f"{kind} {r['mode']} at {length}"
    if kind == "mqar":
        return f"mqar {r['preset']} d={r['d_model']}"
    if kind == "summarize":
        return f"summarize {r['dataset']} {r['metric']}"
    if kind == "params":
        return f"params ({r['what'].replace('_', '-')})"
    if kind == "flops":
        return f"flops {r['formula']}"
    if kind == "bench":
        return f"bench {r['op']} {r['metric']}"
    return f"card {r['field']}"


def _template(recipe: dict) -> str | None:
    if recipe["metric"] not in BENCH_METRICS.get(recipe["op"], (recipe["metric"],)):
        return None
    return OFFLOAD_COMMAND if "offload" in recipe else BENCH_COMMANDS.get(recipe["op"])


def bench_command(recipe: dict, at: list[dict] | None = None) -> str:
    """The command that measures a bench column, with the token counts of the recipes of ``at`` that share it (the
    item's bench recipes at each of their settings, :func:`at_each_length`) where they are numbers: L the prompt
    lengths, N the most new tokens, C the other counts of new tokens (``--call-tokens``; dropped when none)."""
    command = _template(recipe)
    if command is None:
        return f"no `evalsuite bench` command measures {recipe['op']} {recipe['metric']} yet"
    same = [r for r in at or [recipe] if _template(r) == command] or [recipe]

    def counts(field: str) -> list[str]:
        found = {r.get(field) for r in same}
        return [str(n) for n in sorted(found)] if all(isinstance(n, int) for n in found) else []

    new = counts("new_tokens")
    fill = {"L": ",".join(counts("length")) or None, "N": ",".join(new[-1:]) or None, "C": ",".join(new[:-1]) or None}
    words: list[str] = []
    for word in command.split():
        if word == "C" and fill["C"] is None:
            words.pop()  # no other count: no --call-tokens
            continue
        words.append(fill.get(word) or word)
    return " ".join(words)


# --- columns computed from a model card ---------------------------------------------------------------------------


def _flag(name: str) -> Callable:
    return lambda config: getattr(config, name, None)


# Each field of a `card` recipe (evalsuite.papers.format.CARD_FIELDS) read from a card's config: hyperparameters,
# and the components of the FoX paper's ablations as booleans (None where the family has no such switch).
CARD_VALUES: dict[str, Callable] = {
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
    Table 6 Params, arXiv:2503.02130 Appendix B.2), ``L`` the card's training length."""
    from evalsuite.cards import count_params

    kind = recipe["kind"]
    if kind == "params":
        return float(count_params(card, non_embedding=recipe["what"] == "non_embedding"))
    config = card.model_config()
    if kind == "card":
        return CARD_VALUES[recipe["field"]](config)
    symbols = {"N": float(count_params(card)), "L": card.train_length, "d_state": None,
               **{name: CARD_VALUES[name](config) for name in ("n_layer", "d_model", "d_head")}}  # fmt: skip
    return flops_per_token(recipe["formula"], symbols)
