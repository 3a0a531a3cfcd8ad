"""The papers' published tables and figures, read from ``papers/data/<paper>.yaml`` (format: docs/paper-tables.md).

A file is checked against the format's rules (:mod:`evalsuite.papers.format`) before it is read: a malformed file
is one :class:`~evalsuite.errors.UserError` line naming the file, the item and what is wrong. Every value stays the
string the paper prints; :mod:`evalsuite.papers.numbers` parses it when a number is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.format import file_problems, item_problems, part_problems, suite_recipe_problems
from evalsuite.papers.numbers import MAGNITUDES, NumberFormat, infer_format
from evalsuite.resources import read_yaml

DATA_DIR = Path(__file__).resolve().parent / "data"
PAPER_ORDER = ("fox", "gsa", "gca", "lightning")  # `paper list` order; other papers follow by name
NOT_PAPERS = ("claims",)  # data files of the package that are no paper's tables (papers/data/claims.yaml)


@dataclass(frozen=True)
class Column:
    """One leaf column: ``key`` (ours), ``label`` and ``group`` as printed, ``better`` (higher, lower, None),
    ``unit``, and the ``recipe`` that produces it here (None: not a measurement, e.g. a formula)."""

    key: str
    label: str
    group: str | None
    better: str | None
    unit: str | None
    recipe: dict | None


@dataclass(frozen=True)
class Row:
    """One published row: ``values`` exactly as printed (None: a cell the paper leaves empty); ``model``: our card
    of the same model, if any; ``scale``: what the row reports (size, tokens, corpus); ``source``: where the paper
    took it from when not its own run; ``length``: the tokens a ``length: row`` recipe takes from it."""

    label: str
    values: tuple[str | None, ...]
    group: str | None
    model: str | None
    scale: str | None
    source: str | None
    length: int | None = None


@dataclass(frozen=True)
class Average:
    """Column ``column`` is the ``how`` (mean) of the columns ``of``, as the paper forms it."""

    column: str
    of: tuple[str, ...]
    how: str


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
    averages: tuple[Average, ...]
    footnotes: tuple[str, ...]
    marks: str
    needs: str
    notes: str | None = None
    row_header: str = "Model"

    @property
    def title(self) -> str:
        return f"{self.kind.capitalize()} {self.number}"

    def index(self, key: str) -> int:
        return next(i for i, c in enumerate(self.columns) if c.key == key)

    def magnitude(self, i: int) -> float:
        """What one printed unit of column ``i`` counts: 10⁶ for a column of unit ``M`` printing bare numbers
        ("44.65" parameters in millions), else 1 (a printed "385M" carries its own suffix)."""
        unit = self.columns[i].unit
        plain = self.formats[i].suffix == "" and self.formats[i].exponent is None
        return MAGNITUDES.get(unit, 1.0) if plain else 1.0

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


def _item(data: dict, paper: str, arxiv: str) -> Item:
    """An item the format's checks passed."""
    columns = tuple(Column(**c) for c in data["columns"])
    return Item(
        id=data["id"], paper=paper, arxiv=arxiv, kind=data["kind"], number=data["number"], caption=data["caption"],
        columns=columns, rows=tuple(Row(**{**r, "values": tuple(r["values"])}) for r in data["rows"]),
        averages=tuple(Average(a["column"], tuple(a["of"]), a["how"]) for a in data["averages"]),
        footnotes=tuple(data["footnotes"]), marks=data["marks"], needs=data["needs"], notes=data.get("notes"),
        row_header=data.get("row_header", "Model"),
    )  # fmt: skip


def load_paper(path: Path) -> Paper:
    """One paper's file, checked (its first problem one UserError line naming the file and the item)."""
    from evalsuite.cards import list_cards

    path = Path(path)
    doc = read_yaml(path, "paper tables")
    problems = file_problems(doc, path.stem)
    if not problems:
        cards = {card.name for card in list_cards()}
        items = doc["items"]
        problems = [p for item in items for p in item_problems(item, path.stem, cards)]
        problems = problems or part_problems(items) or [p for i in items for p in suite_recipe_problems(i)]
    if problems:
        raise UserError(f"{path}: {problems[0]}" + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""))
    items = tuple(_item(entry, doc["paper"], str(doc["arxiv"])) for entry in doc["items"])
    return Paper(paper=doc["paper"], title=doc["title"], arxiv=str(doc["arxiv"]), items=items)


def load_papers(extra_dirs: tuple[Path, ...] = ()) -> tuple[Paper, ...]:
    """Every paper of the package's data folder and of ``extra_dirs`` (``--papers DIR``), in the seed papers' order
    then by name; a paper in two folders is an error."""
    papers: dict[str, Paper] = {}
    for folder in (DATA_DIR, *map(Path, extra_dirs)):
        if not folder.is_dir():
            raise UserError(f"paper tables folder {folder} does not exist")
        for path in sorted(folder.glob("*.yaml")):
            if folder == DATA_DIR and path.stem in NOT_PAPERS:
                continue
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
