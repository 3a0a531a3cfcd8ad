"""The papers' published tables and figures, read from ``papers/data/<paper>.yaml`` (format: docs/paper-tables.md).

Every value stays the string the paper prints; :mod:`evalsuite.papers.numbers` parses it when a number is needed.
A malformed file is one :class:`~evalsuite.errors.UserError` line naming the file, the item and what is wrong.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.numbers import NumberFormat, infer_format, parse_number
from evalsuite.resources import read_yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
PAPER_ORDER = ("fox", "gsa", "gca", "lightning")  # `paper list` order; other papers follow by name
KINDS = ("table", "figure")
BETTER = ("higher", "lower", None)
MARKS = ("best_second", "bold_best", "none")
NEEDS = ("cards", "gpu", "weights", "dataset", "training", "none")
AVERAGE_HOW = ("mean",)
# Recipe kinds: (required fields, optional fields); None: further fields allowed (docs/paper-tables.md's "...").
RECIPES: dict[str, tuple[tuple[str, ...], tuple[str, ...] | None]] = {
    "lm-eval": (("task", "metric"), ("shots", "scale")),
    "longbench": (("dataset",), ("first_line", "max_length")),
    "loss": (("length",), ("metric",)),
    "niah": (("mode", "length"), ("metric",)),
    "passkey": (("kind", "length"), ()),
    "mqar": (("preset", "d_model"), None),
    "summarize": (("metric",), ()),
    "params": (("what",), ()),
    "flops": (("formula",), ()),
    "card": (("field",), ()),
    "bench": (("op", "metric"), None),
}
_ITEM_KEYS = {"id", "kind", "number", "caption", "columns", "rows", "averages", "footnotes", "marks", "needs",
              "notes", "row_header"}  # fmt: skip
_COLUMN_KEYS = {"key", "label", "group", "better", "unit", "recipe"}
_ROW_KEYS = {"label", "group", "model", "scale", "source", "values"}


@dataclass(frozen=True)
class Column:
    """One leaf column: ``key`` (ours), ``label`` and ``group`` as printed, ``better`` (higher, lower, None),
    ``unit``, and the ``recipe`` that produces it here (None: not a measurement, e.g. a formula)."""

    key: str
    label: str
    group: str | None = None
    better: str | None = None
    unit: str | None = None
    recipe: dict | None = None


@dataclass(frozen=True)
class Row:
    """One published row: ``values`` exactly as printed (None: a cell the paper leaves empty); ``model``: our card
    of the same model, if any; ``scale``: what the row reports (size, tokens, corpus); ``source``: where the paper
    took it from when not its own run."""

    label: str
    values: tuple[str | None, ...]
    group: str | None = None
    model: str | None = None
    scale: str | None = None
    source: str | None = None


@dataclass(frozen=True)
class Average:
    """Column ``column`` is the ``how`` (mean) of the columns ``of``, as the paper forms it."""

    column: str
    of: tuple[str, ...]
    how: str = "mean"


@dataclass(frozen=True)
class Item:
    """One table or figure of a paper, as docs/paper-tables.md describes its fields."""

    id: str
    paper: str
    arxiv: str
    kind: str
    number: str
    caption: str
    columns: tuple[Column, ...]
    rows: tuple[Row, ...]
    averages: tuple[Average, ...] = ()
    footnotes: tuple[str, ...] = ()
    marks: str = "none"
    needs: str = "none"
    notes: str | None = None
    row_header: str = "Model"

    @property
    def title(self) -> str:
        return f"{self.kind.capitalize()} {self.number}"

    def index(self, key: str) -> int:
        return next(i for i, c in enumerate(self.columns) if c.key == key)

    def number_at(self, row: Row, key: str) -> float | None:
        return parse_number(row.values[self.index(key)])

    @property
    def formats(self) -> tuple[NumberFormat, ...]:
        """Each column's number format, inferred from its printed cells. Trailing zeros dropped in one column
        (Python's round) are dropped in every column of the table with as many decimals: a column whose printed
        cells all happen to end in a non-zero digit (or a column of halves, "63.5") shows no sign of the rule itself."""
        formats = [infer_format(row.values[i] for row in self.rows) for i in range(len(self.columns))]
        trimmed = max((f.decimals for f in formats if f.trim), default=None)
        if trimmed is None:
            return tuple(formats)
        plain = [not f.suffix and f.exponent is None and 0 < f.decimals <= trimmed for f in formats]
        return tuple(replace(f, trim=True, decimals=trimmed) if p else f for f, p in zip(formats, plain, strict=True))


@dataclass(frozen=True)
class Paper:
    paper: str
    title: str
    arxiv: str
    items: tuple[Item, ...]


def _fail(where: str, message: str):
    raise UserError(f"{where}: {message}")


def _check_keys(data, allowed: set[str], required: set[str], where: str) -> None:
    if not isinstance(data, dict):
        _fail(where, f"expected a mapping, got {type(data).__name__}")
    unknown, missing = sorted(set(data) - allowed), sorted(required - set(data))
    if unknown:
        _fail(where, f"unknown key(s) {', '.join(unknown)}")
    if missing:
        _fail(where, f"missing key(s) {', '.join(missing)}")


def _text(value, where: str, name: str, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        _fail(where, f"{name} must be a string{' or null' if optional else ''}, got {value!r}")
    return value


def check_recipe(recipe, where: str) -> dict | None:
    """``recipe`` if it names a known kind with its required fields (and, for most kinds, no others)."""
    if recipe is None:
        return None
    if not isinstance(recipe, dict) or recipe.get("kind") not in RECIPES:
        _fail(where, f"recipe must be a mapping with kind one of {', '.join(RECIPES)}, got {recipe!r}")
    required, optional = RECIPES[recipe["kind"]]
    missing = [f for f in required if recipe.get(f) is None]
    if missing:
        _fail(where, f"recipe {recipe['kind']} needs {', '.join(missing)}")
    if optional is not None:
        unknown = sorted(set(recipe) - {"kind", *required, *optional})
        if unknown:
            _fail(where, f"recipe {recipe['kind']} has unknown field(s) {', '.join(unknown)}")
    return dict(recipe)


def _column(data, where: str) -> Column:
    _check_keys(data, _COLUMN_KEYS, {"key", "label", "better"}, where)
    key = data["key"]
    if not isinstance(key, str) or not re.fullmatch(r"[a-z0-9_]+", key):
        _fail(where, f"column key must match [a-z0-9_]+, got {key!r}")
    where = f"{where} {key}"
    if data["better"] not in BETTER:
        _fail(where, f"better must be higher, lower or null, got {data['better']!r}")
    return Column(key=key, label=_text(data["label"], where, "label", optional=False),
                  group=_text(data.get("group"), where, "group"), better=data["better"],
                  unit=_text(data.get("unit"), where, "unit"),
                  recipe=check_recipe(data.get("recipe"), where))  # fmt: skip


def _row(data, n_columns: int, where: str) -> Row:
    _check_keys(data, _ROW_KEYS, {"label", "values"}, where)
    label = _text(data["label"], where, "label", optional=False)
    where = f"{where} {label!r}"
    values = data["values"]
    if not isinstance(values, list) or len(values) != n_columns:
        _fail(where, f"values must be a list of {n_columns} (one per column), got {values!r}")
    bad = [v for v in values if v is not None and not isinstance(v, str)]
    if bad:  # an unquoted 18.10 would have lost its zero already
        _fail(where, f"values must be strings exactly as printed (quote them) or null, got {bad[0]!r}")
    fields = {k: _text(data.get(k), where, k) for k in ("group", "model", "scale", "source")}
    return Row(label=label, values=tuple(values), **fields)


def _averages(data, keys: list[str], where: str) -> tuple[Average, ...]:
    out = []
    for entry in data or []:
        _check_keys(entry, {"column", "of", "how"}, {"column", "of"}, f"{where} averages")
        refs = [entry["column"], *(entry["of"] if isinstance(entry["of"], list) else [None])]
        unknown = [r for r in refs if r not in keys]
        if unknown or entry.get("how", "mean") not in AVERAGE_HOW:
            _fail(f"{where} averages", f"column and of must name columns, how one of {AVERAGE_HOW}: {entry!r}")
        out.append(Average(entry["column"], tuple(entry["of"]), entry.get("how", "mean")))
    return tuple(out)


def _item(data, paper: str, arxiv: str, where: str) -> Item:
    item_id = data.get("id") if isinstance(data, dict) else None
    where = f"{where}: {item_id}"
    _check_keys(data, _ITEM_KEYS, {"id", "kind", "number", "caption", "columns", "rows", "needs"}, where)
    if not isinstance(item_id, str) or not re.fullmatch(rf"{re.escape(paper)}:(table|figure)\d+[a-z]?", item_id):
        _fail(where, f"id must be {paper}:table<N> or {paper}:figure<N><letter>")
    if data["kind"] not in KINDS or not item_id.split(":")[1].startswith(data["kind"]):
        _fail(where, f"kind must be table or figure, as its id says, got {data['kind']!r}")
    for name, choices in (("marks", MARKS), ("needs", NEEDS)):
        if data.get(name, "none") not in choices:
            _fail(where, f"{name} must be one of {', '.join(choices)}, got {data[name]!r}")
    if not isinstance(data["columns"], list) or not isinstance(data["rows"], list):
        _fail(where, "columns and rows must be lists")
    columns = tuple(_column(c, f"{where} column") for c in data["columns"])
    keys = [c.key for c in columns]
    if len(set(keys)) != len(keys):
        _fail(where, "column keys must be unique")
    footnotes = data.get("footnotes") or []
    if not isinstance(footnotes, list) or not all(isinstance(f, str) for f in footnotes):
        _fail(where, "footnotes must be a list of strings")
    return Item(
        id=item_id, paper=paper, arxiv=arxiv, kind=data["kind"], number=_text(str(data["number"]), where, "number"),
        caption=_text(data["caption"], where, "caption", optional=False), columns=columns,
        rows=tuple(_row(r, len(columns), f"{where} row") for r in data["rows"]),
        averages=_averages(data.get("averages"), keys, where), footnotes=tuple(footnotes),
        marks=data.get("marks", "none"), needs=data["needs"], notes=_text(data.get("notes"), where, "notes"),
        row_header=_text(data.get("row_header", "Model"), where, "row_header", optional=False),
    )  # fmt: skip


def load_paper(path: Path) -> Paper:
    """One paper's file, validated (every problem one UserError line naming the file and item)."""
    path = Path(path)
    data = read_yaml(path, "paper tables")
    where = str(path)
    _check_keys(data, {"paper", "title", "arxiv", "items"}, {"paper", "title", "arxiv", "items"}, where)
    if data["paper"] != path.stem:
        _fail(where, f"paper must be the file's stem {path.stem!r}, got {data['paper']!r}")
    arxiv = _text(data["arxiv"], where, "arxiv", optional=False)
    if not isinstance(data["items"], list):
        _fail(where, "items must be a list")
    items = tuple(_item(entry, path.stem, arxiv, where) for entry in data["items"])
    ids = [i.id for i in items]
    if len(set(ids)) != len(ids):
        _fail(where, f"duplicate item id(s) {', '.join(sorted({i for i in ids if ids.count(i) > 1}))}")
    return Paper(paper=path.stem, title=_text(data["title"], where, "title", optional=False), arxiv=arxiv, items=items)


def load_papers(extra_dirs: tuple[Path, ...] = ()) -> tuple[Paper, ...]:
    """Every paper of the package's data folder and of ``extra_dirs`` (``--papers DIR``), in the seed papers' order
    then by name; a paper in two folders is an error."""
    papers: dict[str, Paper] = {}
    for folder in (DATA_DIR, *map(Path, extra_dirs)):
        if not folder.is_dir():
            raise UserError(f"paper tables folder {folder} does not exist")
        for path in sorted(folder.glob("*.yaml")):
            if path.stem in papers:
                raise UserError(f"{path}: paper {path.stem} is already defined by another file")
            papers[path.stem] = load_paper(path)
    rank = {name: i for i, name in enumerate(PAPER_ORDER)}
    return tuple(sorted(papers.values(), key=lambda p: (rank.get(p.paper, len(rank)), p.paper)))


def all_items(papers: tuple[Paper, ...]) -> list[Item]:
    return [item for paper in papers for item in paper.items]


def find_item(papers: tuple[Paper, ...], item_id: str) -> Item:
    """The item ``fox:table2``; a UserError listing the paper's items (or the papers) otherwise."""
    for item in all_items(papers):
        if item.id == item_id:
            return item
    paper = item_id.partition(":")[0]
    known = [i.id for p in papers if p.paper == paper for i in p.items]
    choices = ", ".join(known) if known else "papers " + ", ".join(p.paper for p in papers)
    raise UserError(f"unknown table or figure {item_id!r}; known: {choices} (see `evalsuite paper list`)")
