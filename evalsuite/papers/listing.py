"""``evalsuite paper list``: every table and figure of the papers, what regenerating it needs, what we have of it.

``needs`` is the item's (docs/paper-tables.md): ``cards`` (computable here from the model cards), ``gpu``
(measurable with ``evalsuite bench``), ``weights`` (the paper's released weights), ``dataset`` (a dataset the user
supplies, and the weights), ``training`` (training at the paper's scale), ``none`` (not a measurement). ``produced
by`` counts the columns per recipe kind; ``ours`` says which models have values for the item under the results
folder (``k/n``: columns found of those measured by runs or by ``evalsuite bench``), or that its columns come from the
cards.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from evalsuite.papers.figures import BENCH_STYLES, bench_source, style
from evalsuite.papers.found import Results, find
from evalsuite.papers.found_bench import BENCH_FINDERS
from evalsuite.papers.published import Item, Paper
from evalsuite.papers.recipes import CARD_KINDS, RUN_KINDS, at_each_length


@dataclass(frozen=True)
class Entry:
    """One line of the listing."""

    id: str
    title: str
    needs: str
    shape: str
    produced_by: str
    ours: str


def produced_by(item: Item) -> str:
    kinds = Counter(c.recipe["kind"] for c in item.columns if c.recipe)
    return ", ".join(f"{kind} ({n})" for kind, n in kinds.items()) or "-"


def measured(recipe: dict | None) -> bool:
    """Whether a column's value comes from a run or a benchmark file under the results folder (not from the cards)."""
    return bool(recipe) and (
        recipe["kind"] in RUN_KINDS or (recipe["kind"] == "bench" and recipe["op"] in BENCH_FINDERS)
    )


def ours(item: Item, results: Results, models: list[str]) -> str:
    """Which models have values of the item's measured columns (``model k/n``), and whether cards give the rest.
    Benchmark files name no run, so the item's own row models are looked up beside ``models``."""
    if (style(item) or ("",))[0] in BENCH_STYLES:  # no columns: drawn from one bench command's records
        source = bench_source(item, results.root)
        return f"bench records: {source}" if source else "none"
    runs = [c.recipe for c in item.columns if measured(c.recipe)]
    have = []
    for model in dict.fromkeys([*models, *(row.model for row in item.rows if row.model)]):
        k = sum(any(find(results, r, model) for r in at_each_length(item, recipe)) for recipe in runs)
        if k:
            have.append(f"{model} {k}/{len(runs)}")
    cards = any(c.recipe and c.recipe["kind"] in CARD_KINDS for c in item.columns)
    parts = have + (["from the cards"] if cards else [])
    return "; ".join(parts) if parts else ("none" if runs else "-")


def _short(text: str, width: int = 60) -> str:
    return text if len(text) <= width else text[:width].rstrip() + "…"


def entries(papers: tuple[Paper, ...], results: Results) -> list[Entry]:
    models = results.models()
    return [Entry(item.id, f"{item.title}: {_short(item.caption)}", item.needs, f"{len(item.rows)}×{len(item.columns)}",
                  produced_by(item), ours(item, results, models))
            for paper in papers for item in paper.items]  # fmt: skip


def to_markdown(listed: list[Entry]) -> str:
    head = "| item | what | needs | rows×columns | produced by | ours |\n|:---|:---|:---|---:|:---|:---|\n"
    return head + "".join(
        f"| {e.id} | {e.title.replace('|', '/')} | {e.needs} | {e.shape} | {e.produced_by} | {e.ours} |\n"
        for e in listed
    )
