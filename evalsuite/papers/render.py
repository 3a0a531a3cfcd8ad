"""``paper show`` (a published table alone) and ``paper render`` (our rows beside it, and ours − paper).

Our row for a model takes each column from its recipe: the model card (parameters, FLOPs, architecture flags), or
the run directories under the results folder (:mod:`evalsuite.papers.found`); an average column is the mean of its
columns, as the paper forms it. Where the paper's rows state the length a column is measured at (``length: row``),
a model has one row of ours per such length; where they take it from other columns of the row (``{column: KEY}``: GCA's
Table 3 prints prompt and generated tokens), one per setting the paper's rows print, showing it. Our numbers print in
the column's printed format and unit (values computed exactly from a card keep two more decimals than the paper's
rounded ones). The difference view has a row for each of our models that a published row names as the same model
(``model``); every row of ours gets a note of what it is (the card's size and weights) beside what the paper's rows
report, so a tiny random-weight twin is never read as the paper's model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.figures import figure_notes
from evalsuite.papers.found import Results, find
from evalsuite.papers.found_bench import train_step_record
from evalsuite.papers.layout import Cell, Grid, Line, marks, to_csv, to_latex, to_markdown
from evalsuite.papers.numbers import parse_number
from evalsuite.papers.published import Item
from evalsuite.papers.recipes import (
    CARD_KINDS,
    GPU_KINDS,
    RUN_KINDS,
    at_each_length,
    at_setting,
    bench_command,
    card_value,
    column_settings,
    describe,
    takes_row_length,
)
from evalsuite.runs.store import atomic_write_bytes

FORMATS = ("md", "latex", "csv")
SUFFIX = {"md": "md", "latex": "tex", "csv": "csv"}


@dataclass(frozen=True)
class Ours:
    """Our row for one model (at ``length`` tokens, for the columns measured at each row's length; at ``setting``,
    the printed cells of the columns others take token counts from): per column a number in the column's printed unit,
    a flag (✓ columns), a setting's printed cell or None, and the run directory behind it."""

    model: str
    values: tuple[float | bool | str | None, ...]
    sources: tuple[str | None, ...]
    note: str
    length: int | None = None
    setting: tuple[tuple[str, str], ...] = ()

    @property
    def label(self) -> str:
        return f"{self.model} (ours" + (f", {self.length} tokens)" if self.length is not None else ")")


def _card(model: str):
    from evalsuite.cards import load_card

    try:
        return load_card(model)
    except UserError:
        return None  # an hf: or openai: model: no card


def _note(item: Item, model: str, card) -> str:
    what = f"{card.description.strip()} (weights: {card.weights_summary()})" if card else "no model card"
    presets = sorted({c.recipe["preset"] for c in item.columns if (c.recipe or {}).get("kind") == "mqar"})
    if presets and card is not None:  # MQAR trains the card's architecture afresh at each width: not the card's model
        what = f"{card.architecture} blocks as the card sets them, trained from scratch at each width by MQAR " + (
            ", ".join(presets)
        )
    rows = [r for r in item.rows if r.model == model]
    if rows:
        return f"{model}: {what}; beside the paper's row {rows[0].label!r}: {rows[0].scale or 'scale not given'}"
    scales = list(dict.fromkeys(r.scale for r in item.rows if r.scale))
    theirs = f"the paper's rows report {'; '.join(scales)}" if scales else "the paper prints no rows"
    return f"{model} (no row of the paper is this model): {what}; {theirs}"


def _at_length(recipe: dict, length: int | None, setting: tuple[tuple[str, str], ...] = ()) -> dict | None:
    """A run or bench recipe with its token counts set for our row: its own numbers, the row's length for ``length:
    row`` and the ``setting``'s for counts printed in other columns (None without them)."""
    if recipe.get("length") == "row":
        return {**recipe, "length": length} if length is not None else None
    if setting:
        return at_setting(recipe, setting)
    return None if isinstance(recipe.get("length"), dict) else recipe


def our_row(item: Item, model: str, results: Results, length: int | None = None,
            setting: tuple[tuple[str, str], ...] = ()) -> Ours:  # fmt: skip
    """``model``'s row (its recorded name: a card, or an hf:/openai: model's name), at ``length`` tokens for the
    columns measured at each row's length, at ``setting`` for those measured at counts printed in other columns."""
    card = _card(model)
    given = dict(setting)
    values: list = []
    sources: list = []
    for i, column in enumerate(item.columns):
        recipe, value, source = column.recipe, given.get(column.key), None
        if recipe is not None and recipe["kind"] in CARD_KINDS and card is not None:
            value, source = card_value(recipe, card), "card"
            if isinstance(value, float):  # a count, in the column's printed unit (Lightning's "44.65" millions)
                value /= item.magnitude(i)
        elif (
            recipe is not None
            and recipe["kind"] in (*RUN_KINDS, *GPU_KINDS)
            and (concrete := _at_length(recipe, length, setting))
        ):
            found = find(results, concrete, model)  # memory in bytes: the column's unit scales it (GiB)
            value, source = (found.value / item.magnitude(i), found.source) if found else (None, None)
        values.append(value)
        sources.append(source)
    for average in item.averages:
        parts = [values[item.index(key)] for key in average.of]
        if all(isinstance(p, (int, float)) and not isinstance(p, bool) for p in parts):
            values[item.index(average.column)] = sum(parts) / len(parts)
    return Ours(model, tuple(values), tuple(sources), _note(item, model, card), length, setting)


def our_rows(item: Item, models: list[str], results: Results) -> list[Ours]:
    """Our rows of ``models``: one each, or one per length the paper's rows state where a column takes each row's, or
    one per setting of :func:`~evalsuite.papers.recipes.column_settings`."""
    if takes_row_length(item):
        lengths = sorted({row.length for row in item.rows if row.length is not None})
        return [our_row(item, model, results, n) for model in models for n in lengths]
    if settings := column_settings(item):
        return [our_row(item, model, results, setting=s) for model in models for s in settings]
    return [our_row(item, model, results) for model in models]


def _measured(item: Item, kinds: tuple[str, ...]) -> list[dict]:
    """The recipes of ``kinds`` of the item's columns, at each of their token counts."""
    return [r for c in item.columns if c.recipe and c.recipe["kind"] in kinds for r in at_each_length(item, c.recipe)]


def default_models(item: Item, results: Results) -> list[str]:
    """The models a render shows without ``--models``: the cards the paper's rows name (for columns computed from
    cards) and every model with a run-based value under the results folder, or a bench value (of the models the
    paper's rows name: bench files are found by model)."""
    out = []
    if any(c.recipe and c.recipe["kind"] in CARD_KINDS for c in item.columns):
        out += [r.model for r in item.rows if r.model and _card(r.model) is not None]
    runs, bench = _measured(item, RUN_KINDS), _measured(item, GPU_KINDS)
    out += [m for m in results.models() if any(find(results, recipe, m) for recipe in runs)]
    named = dict.fromkeys(r.model for r in item.rows if r.model)
    out += [m for m in named if any(find(results, recipe, m) for recipe in bench)]
    return list(dict.fromkeys(out))


def _text(item: Item, i: int, value) -> str:
    if value is None:
        return ""
    if isinstance(value, str):  # a setting's cell, as the paper prints it
        return value
    if isinstance(value, bool):
        return "✓" if value else ""
    kind = (item.columns[i].recipe or {}).get("kind")
    if kind == "card":
        return str(int(value)) if float(value).is_integer() else str(value)
    return item.formats[i].format(value, extra=2 if kind in ("params", "flops") else 0)


def _delta(item: Item, i: int, ours, printed: str | None) -> str:
    """ours − paper for one cell: a signed number, = / ≠ for check marks, empty when either is missing."""
    if isinstance(ours, bool):
        return "=" if ours == (printed == "✓") else "≠"
    if isinstance(ours, str):  # a setting's cell: the same as the row's
        return ours
    paper = parse_number(printed)
    if ours is None or paper is None:
        return ""
    kind = (item.columns[i].recipe or {}).get("kind")
    return item.formats[i].format(ours - paper, extra=2 if kind in ("params", "flops") else 0, signed=True)


def _marked(item: Item, lines: list[tuple[str, list[str], list], str | None]) -> list[Line]:
    """Lines with each column's best and second best marked over the numbers shown (``lines``: label, printed
    cells, numbers, source)."""
    n = len(item.columns)
    tiers = [marks([nums[i] for _, _, nums, _ in lines], item.columns[i].better, item.marks) for i in range(n)]
    return [Line(label, tuple(Cell(texts[i], tiers[i][k]) for i in range(n)), source=source)
            for k, (label, texts, _, source) in enumerate(lines)]  # fmt: skip


def _grid(item: Item, lines: list[Line]) -> Grid:
    return Grid(item.row_header, tuple(c.label for c in item.columns), tuple(c.group for c in item.columns),
                tuple(c.better for c in item.columns), tuple(lines))  # fmt: skip


def _published(item: Item, source: str | None = None) -> list[tuple]:
    return [(row.label, [v or "" for v in row.values], [parse_number(v) for v in row.values], source)
            for row in item.rows]  # fmt: skip


def published_grid(item: Item) -> Grid:
    lines = _marked(item, _published(item))
    return _grid(item, [Line(ln.label, ln.cells, row.group) for ln, row in zip(lines, item.rows, strict=True)])


def _heading(item: Item) -> str:
    return f"{item.title} of arXiv:{item.arxiv} (`{item.id}`)"


def show(item: Item, fmt: str) -> str:
    """The published table alone: labels and cells exactly as printed (CSV), or in the paper's layout."""
    grid = published_grid(item)
    if fmt == "csv":
        return to_csv(grid)
    if fmt == "latex":
        return to_latex(grid, caption=item.caption, label=item.id)
    if fmt != "md":
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    body = to_markdown(grid) if item.columns else "Nothing to tabulate: the paper's text gives no numbers for it.\n"
    if item.rows and not any(v for row in item.rows for v in row.values):
        body += "\nThe text gives this plot's axes and series but no point of it.\n"
    notes = "".join(f"\n- {f}" for f in item.footnotes)
    return f"**{_heading(item)}**: {item.caption}\n\n{body}{notes}\n"


def _missing_notes(item: Item, ours: list[Ours], results: Results) -> list[str]:
    """Why columns have no value of ours (the bench columns one command measures in one note)."""
    notes, gpu, bench = [], {}, _measured(item, GPU_KINDS)
    for i, column in enumerate(item.columns):
        if not ours or any(o.values[i] is not None for o in ours):
            continue
        kind = (column.recipe or {}).get("kind")
        if kind in GPU_KINDS:
            gpu.setdefault(bench_command(column.recipe, bench), []).append(column.label)
        elif kind in RUN_KINDS:
            notes.append(f"{column.label}: no results of these models for {describe(column.recipe)} under "
                         f"{results.root} (evalsuite paper run {item.id} --models ...)")  # fmt: skip
        elif kind in CARD_KINDS:
            notes.append(f"{column.label}: computed from model cards; none of these models has one")
    return notes + [f"{', '.join(labels)}: {'needs' if len(labels) == 1 else 'need'} a GPU run ({command})"
                    for command, labels in gpu.items()]  # fmt: skip


def _params_note(model: str) -> str:
    from evalsuite.papers.params import breakdown

    parts = breakdown(_card(model))
    return f"{model} parameters by component: " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in parts.items())


def _train_step_notes(item: Item, models: list[str], results: Results) -> list[str]:
    """What our ``bench train`` values are: the shape measured, and for throughput the ratio to the run's baseline
    over rounds timed at the same moments, beside the paper's ratio of the same two rows where it prints both (the
    papers' GPUs are not ours: only ratios compare)."""
    notes = []
    rows = {r.model: r for r in reversed(item.rows) if r.model}  # the first row of each model
    for i, column in enumerate(item.columns):
        recipe = column.recipe or {}
        if (recipe.get("kind"), recipe.get("op")) != ("bench", "train_step") or recipe["metric"] == "time":
            continue
        for model in models:
            rec = train_step_record(results.root, recipe, model)
            if rec is None:
                continue
            where = f"{column.label}: {model} at {rec['length']}x{rec['batch']}"
            if recipe["metric"] == "memory":
                notes.append(f"{where}, the peak device memory of a training step (weights, gradients, AdamW state, "
                             "activations)")  # fmt: skip
            elif "ratio_to_baseline" in rec:
                timed = "interleaved" if rec.get("interleaved") else "timed one model at a time"
                note = (f"{where}: {rec['ratio_to_baseline']:.3f}× {rec['baseline']}'s tokens/s (median of "
                        f"{rec['rounds']} {timed} rounds, p20-p80 {rec['ratio_to_baseline_p20']:.3f}-"
                        f"{rec['ratio_to_baseline_p80']:.3f})")  # fmt: skip
                ours, base = rows.get(model), rows.get(rec["baseline"])
                if ours and base and parse_number(ours.values[i]) and parse_number(base.values[i]):
                    ratio = parse_number(ours.values[i]) / parse_number(base.values[i])
                    note += f"; the paper's {ours.values[i]} / {base.values[i]} = {ratio:.2f}×"
                notes.append(note)
    return notes


def compare(item: Item, ours: list[Ours], results: Results) -> tuple[Grid, Grid | None, list[str]]:
    """(the table with our rows, the ours − paper table or None, notes)."""
    mine = [(o.label, [_text(item, i, v) for i, v in enumerate(o.values)],
             [v if isinstance(v, (int, float)) and not isinstance(v, bool) else None for v in o.values], "ours")
            for o in ours]  # fmt: skip
    main = _grid(item, _marked(item, _published(item, "paper") + mine))
    deltas = []
    for o in ours:
        row = next((r for r in item.rows if r.model == o.model and o.length in (None, r.length)
                    and all(r.values[item.index(key)] == cell for key, cell in o.setting)), None)  # fmt: skip
        cells = tuple(Cell(_delta(item, i, v, row.values[i])) for i, v in enumerate(o.values)) if row else ()
        numbers = [c.text for c, v in zip(cells, o.values, strict=False) if not isinstance(v, str)]
        if any(numbers):  # a row of the paper's with a value to compare (a plot's cells are empty)
            deltas.append(Line(f"{o.model} − {row.label}", cells, source="ours − paper"))
    models = list(dict.fromkeys(o.model for o in ours))
    notes = list(dict.fromkeys(o.note for o in ours))
    for model in models:
        runs = sorted({s for o in ours if o.model == model for s in o.sources if s not in (None, "card")})
        if runs:
            notes.append(f"{model} values from {', '.join(runs)}")
    notes += _train_step_notes(item, models, results)
    if any((c.recipe or {}).get("kind") == "params" for c in item.columns):
        notes += [_params_note(model) for model in models if _card(model) is not None]
    notes += _missing_notes(item, ours, results) + figure_notes(item, results)
    notes += [f"{a.column} = {a.how} of {', '.join(a.of)} (as the paper forms it)" for a in item.averages]
    notes += [f"paper: {f}" for f in item.footnotes] + ([f"about the table: {item.notes}"] if item.notes else [])
    return main, (_grid(item, deltas) if deltas else None), notes


def render(item: Item, ours: list[Ours], results: Results, fmt: str) -> str:
    """The table with our rows (and the difference view and notes) in ``fmt``."""
    main, delta, notes = compare(item, ours, results)
    if fmt == "csv":
        return to_csv(main if delta is None else _grid(item, [*main.lines, *delta.lines]))
    if fmt == "latex":
        out = to_latex(main, caption=f"{item.caption} Rows marked (ours): this suite.", label=item.id)
        if delta is not None:
            out += "\n" + to_latex(delta, caption=f"{item.title}: ours minus the paper's row of the same model.")
        return out + "".join(f"% {n}\n" for n in notes)
    if fmt != "md":
        raise UserError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = f"**{_heading(item)}** with our rows: {item.caption}\n\n{to_markdown(main)}"
    if delta is not None:
        out += f"\nOurs − paper:\n\n{to_markdown(delta)}"
    return out + "\n" + "".join(f"- {n}\n" for n in notes)


def write_rendered(item: Item, ours: list[Ours], results: Results, out_dir: Path | str) -> list[Path]:
    """``<out>/<paper>-<item>.{md,tex,csv}`` (``fox-table2.md``); returns the paths."""
    stem = Path(out_dir) / item.id.replace(":", "-")
    return [atomic_write_bytes(f"{stem}.{SUFFIX[fmt]}", render(item, ours, results, fmt)) for fmt in FORMATS]
