"""Checks of the papers' published tables (``evalsuite/papers/data/<paper>.yaml``, format in docs/paper-tables.md)
shared by ``tests/test_paper_tables_<paper>.py``: the shape of each item, and a read-back of its cells out of the
paper's text in ``../shared/seeds/``.

The seeds are HTML-to-text extractions of the arXiv pages. A table's rows are lines ``<label> <cell> <cell> ...``;
its caption line (``Table N: ...``) sits above or below it. Math comes out in three copies (rendered text, LaTeX,
annotation), so ``2×10^{-3}`` reads ``2×1032superscript1032\\times 10^{-3}2 × 10 start_POSTSUPERSCRIPT - 3
end_POSTSUPERSCRIPT``; :func:`flatten_math` folds that back (and GSA's ``64×Ld``), and cells the extraction mangles
otherwise (✓ marks, formulas) are not compared: a cell is found by counting whitespace tokens from the row's end
(or from its label), across cells that print as plain text only.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "evalsuite" / "papers" / "data"
SEEDS = ROOT.parent / "shared" / "seeds"

ITEM_FIELDS = {"id", "kind", "number", "caption", "columns", "rows", "averages", "footnotes", "marks", "needs"}
COLUMN_FIELDS = {"key", "label", "group", "better", "unit", "recipe"}
ROW_FIELDS = {"label", "group", "model", "scale", "source", "values"}
RECIPE_FIELDS = {  # docs/paper-tables.md, "Recipes": the fields each kind needs
    "lm-eval": {"task", "metric", "shots"},
    "longbench": {"dataset"},
    "loss": {"length", "metric"},
    "niah": {"mode", "length"},
    "passkey": {"kind", "length"},
    "mqar": {"preset", "d_model"},
    "summarize": {"metric"},
    "params": {"what"},
    "flops": {"formula"},
    "bench": {"op", "metric", "length"},
}
MQAR_FIELDS = {"d_model": "d_models", "seq_len": "seq_lens", "num_kv_pairs": "num_kv_pairs"}  # recipe: preset
BENCH_OPS = {"attention", "linear", "decode", "train_step"}
BENCH_METRICS = {"time", "memory", "throughput"}
MARKS = {"best_second", "bold_best", "none"}
NEEDS = {"cards", "gpu", "weights", "dataset", "training", "none"}

SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
MATH_CELL = re.compile(r"\d+(?:\.\d+)?×10\^-?\d+|\d+×Ld")  # the math cells flatten_math folds back
# rendered copy, LaTeX copy ("\times 10^{e}"), annotation copy ("m × 10 start_POSTSUPERSCRIPT - e end_...")
SCI_SEED = re.compile(
    r"\S*\\times 10\^\{(-?\d+)\}(\d+(?:\.\d+)?) × 10 start_POSTSUPERSCRIPT (?:- )?\d+ end_POSTSUPERSCRIPT"
)
STATE_SEED = re.compile(r"(\d+)×Ld\d+\S*\\times Ld\d+ × italic_L italic_d")  # GSA's "64×Ld" state sizes
CAPTION = re.compile(r"^(?:(?:Table|Figure) \d+: |\([a-z]\) )")
NUMBER_END = re.compile(r"^\d+(?:\.\d+)?[kKMBT%]?$")


@functools.cache
def load(paper: str) -> dict:
    """A paper's data file, parsed once (the checks only read it)."""
    return yaml.safe_load((DATA / f"{paper}.yaml").read_text(encoding="utf-8"))


@functools.cache
def task_spec(name: str) -> dict:
    """One of this suite's task specs, ``tasks/<name>.yaml``."""
    return yaml.safe_load((ROOT / "tasks" / f"{name}.yaml").read_text(encoding="utf-8"))


@functools.cache
def seed_lines(name: str) -> list[str] | None:
    """The seed text's lines, or None where ``../shared/seeds/`` is absent (CI)."""
    path = SEEDS / name
    return path.read_text(encoding="utf-8").replace("\u00a0", " ").splitlines() if path.is_file() else None


def card_names() -> set[str]:
    return {p.stem for p in (ROOT / "models").glob("*.yaml")}


# ---- shape ---------------------------------------------------------------------------------------------------


def id_suffix(number: str) -> str:
    """``"3(b)"`` -> ``"3b"``: the part of an item's id after ``table``/``figure``."""
    m = re.fullmatch(r"(\d+)(?:\(([a-z])\))?", number)
    assert m, f"number {number!r} is not N or N(x)"
    return m.group(1) + (m.group(2) or "")


def recipe_problems(recipe) -> list[str]:
    if recipe is None:
        return []
    if not isinstance(recipe, dict) or recipe.get("kind") not in RECIPE_FIELDS:
        return [f"recipe {recipe!r} has no known kind"]
    missing = RECIPE_FIELDS[recipe["kind"]] - set(recipe)
    out = [f"recipe {recipe} lacks {sorted(missing)}"] if missing else []
    if recipe["kind"] == "bench" and (recipe["op"] not in BENCH_OPS or recipe["metric"] not in BENCH_METRICS):
        out.append(f"bench recipe {recipe} names an unknown op or metric")
    return out


def column_problems(columns: list) -> list[str]:
    out = []
    keys = [c.get("key") for c in columns]
    if len(set(keys)) != len(keys):
        out.append(f"column keys repeat: {keys}")
    for c in columns:
        if set(c) != COLUMN_FIELDS:
            out.append(f"column {c.get('key')} has fields {sorted(c)}")
            continue
        if not re.fullmatch(r"[a-z0-9_]+", str(c["key"])) or not isinstance(c["label"], str):
            out.append(f"column {c['key']!r}: bad key or label")
        if c["better"] not in ("higher", "lower", None) or not isinstance(c["group"], (str, type(None))):
            out.append(f"column {c['key']}: better {c['better']!r}, group {c['group']!r}")
        out += recipe_problems(c["recipe"])
    return out


def row_problems(rows: list, n_columns: int, cards: set[str]) -> list[str]:
    out = []
    for r in rows:
        if set(r) != ROW_FIELDS:
            out.append(f"row {r.get('label')!r} has fields {sorted(r)}")
            continue
        if len(r["values"]) != n_columns:
            out.append(f"row {r['label']!r}: {len(r['values'])} values for {n_columns} columns")
        if any(v is not None and not isinstance(v, str) for v in r["values"]):
            out.append(f"row {r['label']!r}: a value is not a string (quote it as printed)")
        if r["model"] is not None and r["model"] not in cards:
            out.append(f"row {r['label']!r}: model {r['model']!r} is not a card in models/")
        if not isinstance(r["label"], str) or not (isinstance(r["scale"], str) and r["scale"]):
            out.append(f"row {r['label']!r}: label and scale must be strings")
    return out


def item_problems(item: dict, paper: str, cards: set[str]) -> list[str]:
    """Everything wrong with one item's shape, as readable lines (empty when it is well formed)."""
    if not ITEM_FIELDS <= set(item) <= ITEM_FIELDS | {"notes"}:
        return [f"{item.get('id')}: fields {sorted(item)}"]
    out = []
    if item["kind"] not in ("table", "figure") or item["id"] != f"{paper}:{item['kind']}{id_suffix(item['number'])}":
        out.append(f"id {item['id']!r} does not match kind {item['kind']!r} and number {item['number']!r}")
    if not (isinstance(item["caption"], str) and item["caption"].strip()):
        out.append("no caption")
    if item["kind"] == "table" and not (item["columns"] and item["rows"]):
        out.append("a table without columns or rows")
    if item["marks"] not in MARKS or item["needs"] not in NEEDS:
        out.append(f"marks {item['marks']!r}, needs {item['needs']!r}")
    keys = {c.get("key") for c in item["columns"]}
    for a in item["averages"]:
        if set(a) != {"column", "of", "how"} or a["column"] not in keys or not set(a["of"]) <= keys:
            out.append(f"average {a} names columns the item lacks")
    if not all(isinstance(f, str) for f in item["footnotes"]):
        out.append("footnotes must be strings")
    out += column_problems(item["columns"]) + row_problems(item["rows"], len(item["columns"]), cards)
    return [f"{item['id']}: {p}" for p in out]


@functools.cache
def lm_eval_task_names() -> set[str] | None:
    """Task and group names of the installed lm-eval's task YAML, or None without the lm-eval extra."""
    spec = importlib.util.find_spec("lm_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    names = set()
    for path in (Path(next(iter(spec.submodule_search_locations))) / "tasks").rglob("*.yaml"):
        names.update(re.findall(r"^(?:task|group): *([\w.-]+) *$", path.read_text(errors="replace"), re.M))
    return names


def suite_recipe_problems(item: dict) -> list[str]:
    """LongBench datasets and MQAR presets that this suite's task specs (``tasks/*.yaml``) have."""
    longbench, presets = task_spec("longbench")["tasks"], task_spec("mqar")["presets"]
    out = []
    for c in item["columns"]:
        r = c["recipe"] or {}
        if r.get("kind") == "longbench" and r["dataset"] not in longbench:
            out.append(f"{item['id']} {c['key']}: LongBench has no {r['dataset']!r}")
        if r.get("kind") == "mqar":
            p = presets.get(r["preset"], {})
            if any(r.get(field) not in p.get(values, [None]) for field, values in MQAR_FIELDS.items()):
                out.append(f"{item['id']} {c['key']}: preset {r['preset']!r} has no cell {r}")
    return out


def average_problems(item: dict) -> list[str]:
    """An average column against the mean of the cells it averages, within one unit of its last printed digit
    (the papers average unrounded scores, then round)."""
    keys = [c["key"] for c in item["columns"]]
    out = []
    for a in item["averages"]:
        for r in item["rows"]:
            cells = [r["values"][keys.index(k)] for k in a["of"]]
            avg = r["values"][keys.index(a["column"])]
            if avg is None or not all(c and NUMBER_END.match(c) for c in [avg, *cells]):
                continue
            mean = sum(float(c) for c in cells) / len(cells)
            unit = 10.0 ** -len(avg.partition(".")[2])
            if abs(mean - float(avg)) > unit + 1e-9:
                out.append(f"{item['id']} {r['label']!r}: mean of {a['of']} is {mean:.3f}, printed {avg}")
    return out


# ---- read-back from the seed text -----------------------------------------------------------------------------


def flatten_math(line: str) -> str:
    """The seed's copies of ``m×10^e`` as one token ``m×10^e``, of ``64×Ld`` as ``64×Ld``; ``2K×\\times×8`` as
    ``2K×8``."""
    line = STATE_SEED.sub(r"\1×Ld", SCI_SEED.sub(r"\2×10^\1", line))
    return line.replace("×\\times×", "×")


def cell_text(value: str) -> str:
    """A cell as the flattened seed prints it: ``2.72×10⁹`` -> ``2.72×10^9``."""
    return re.sub(r"×10([⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+)", lambda m: "×10^" + m.group(1).translate(SUPERSCRIPT), value)


def label_text(label: str) -> str:
    """A label as the extraction renders it: math minus signs dropped, superscripts as digits (``−softmax+ReLU²``
    reads ``softmax+ReLU2``)."""
    return label.replace("−", "").translate(SUPERSCRIPT)


def is_plain(value: str | None) -> bool:
    """Whether a cell prints as plain whitespace-separated text in the seed: not an empty cell or a ✓ (printed as
    nothing there), nor math (non-ASCII, or written with ``_``/``^`` in the data: printed in several copies)."""
    if value is None:
        return False
    text = cell_text(value)
    if MATH_CELL.fullmatch(text):
        return True
    return text.isascii() and text.isprintable() and bool(text.strip()) and not set("_^") & set(text)


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{3,}", text)


def is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(w == h for h in it) for w in needle)


def caption_index(lines: list[str], item: dict) -> int:
    """The line of an item's caption: ``Table N: ...`` / ``Figure N: ...``; a part whose float lost that line
    (GSA's 3(a), 3(b)) by its own ``(x) ...`` line."""
    kind = "Table" if item["kind"] == "table" else "Figure"
    base, _, letter = item["number"].partition("(")
    if letter:
        for i, line in enumerate(lines):
            if line.startswith(f"({letter[0]}) ") and is_subsequence(words(item["caption"]), words(line)):
                return i
    found = [i for i, line in enumerate(lines) if line.startswith(f"{kind} {base}: ")]
    assert found, f"{item['id']}: no caption line '{kind} {base}:' in the seed"
    return found[0]


def _previous_text_line(lines: list[str], i: int) -> str:
    i -= 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    return lines[i].strip() if i >= 0 else ""


def table_region(lines: list[str], item: dict) -> list[str]:
    """The lines between the item's caption and the next caption, or, where the caption sits below the table (the
    line above it is the table's last row), between the previous caption and it."""
    at = caption_index(lines, item)
    bounds = [i for i, line in enumerate(lines) if CAPTION.match(line)]
    last = label_text(item["rows"][-1]["label"])
    if last and _previous_text_line(lines, at).startswith(last):
        return lines[max([b for b in bounds if b < at], default=-1) + 1 : at]
    return lines[at + 1 : min([b for b in bounds if b > at], default=len(lines))]


def _starts_with_label(line: str, label: str) -> bool:
    """A row's line begins with its label; an unnamed row's with a number."""
    line = line.strip()
    return line.startswith(label) if label else bool(line) and bool(NUMBER_END.match(line.split()[0]))


def row_line_indices(region: list[str], item: dict) -> list[int]:
    """Each row's line in ``region``: the first row's by its label, each later row on the next line, past blank
    lines and the row group's header line where the group changes (checked)."""
    rows = item["rows"]
    first = label_text(rows[0]["label"])
    at = next((i for i, line in enumerate(region) if first and _starts_with_label(line, first)), None)
    assert at is not None, f"{item['id']}: first row {rows[0]['label']!r} not found under its caption"
    if rows[0]["group"]:
        assert _previous_text_line(region, at) == rows[0]["group"], f"{item['id']}: no group line above row 1"
    found = [at]
    for prev, row in pairwise(rows):
        j, skipped = found[-1] + 1, []
        while j < len(region) and (not region[j].strip() or region[j].strip() == row["group"] != prev["group"]):
            skipped += [region[j].strip()] if region[j].strip() else []
            j += 1
        where = f"{item['id']} row {row['label']!r}"
        assert skipped == ([row["group"]] if row["group"] != prev["group"] and row["group"] else []), where
        assert j < len(region) and _starts_with_label(region[j], label_text(row["label"])), (
            f"{where}: the next line of the table is {region[j] if j < len(region) else None!r}"
        )
        found.append(j)
    return found


def _row_cells(line: str, row: dict) -> tuple[list[str], bool]:
    """The whitespace tokens after a row's label, and whether they start right after it (a label printed plainly)."""
    line = flatten_math(line.strip())
    label = row["label"]
    if label and line.startswith(label + " "):
        return line[len(label) :].split(), True
    if not label:
        return line.split(), True
    return line[len(label_text(label)) :].split(), False


def row_mismatches(line: str, row: dict, item_id: str) -> tuple[int, list[str]]:
    """Compare a row's plain cells with the seed line: a cell is located by counting tokens from the line's end
    when every cell after it is plain, else from the label when every cell before it is. Returns (cells compared,
    mismatches)."""
    tokens, from_label = _row_cells(line, row)
    cells = [cell_text(v) if is_plain(v) else None for v in row["values"]]
    sizes = [len(c.split()) if c is not None else 0 for c in cells]
    checked, wrong = 0, []
    if from_label and None not in cells and len(tokens) != sum(sizes):
        wrong.append(f"{item_id} {row['label']!r}: {len(tokens)} tokens in the text for {sum(sizes)}: {line!r}")
    for j, cell in enumerate(cells):
        if cell is None:
            continue
        if None not in cells[j + 1 :]:
            end = len(tokens) - sum(sizes[j + 1 :])
            got = tokens[max(end - sizes[j], 0) : max(end, 0)]
        elif from_label and None not in cells[:j]:
            got = tokens[sum(sizes[:j]) : sum(sizes[: j + 1])]
        else:
            continue
        checked += 1
        if " ".join(got) != cell:
            wrong.append(f"{item_id} {row['label']!r} column {j + 1}: data {cell!r}, text {' '.join(got)!r}")
    return checked, wrong


def table_mismatches(lines: list[str], item: dict) -> list[str]:
    """Every plain cell of a table read back out of the seed; also that each row has a cell to read and that the
    line after the last row is not one more row."""
    region = table_region(lines, item)
    at = row_line_indices(region, item)
    wrong = []
    for i, row in zip(at, item["rows"], strict=True):
        checked, bad = row_mismatches(region[i], row, item["id"])
        wrong += bad
        if checked == 0 and any(v is not None for v in row["values"]):
            wrong.append(f"{item['id']} {row['label']!r}: no cell of this row can be read back")
    after = _next_text_line(region, at[-1])
    if after is not None and NUMBER_END.match(after.split()[-1]):
        wrong.append(f"{item['id']}: the line after the last row looks like one more row: {after!r}")
    return wrong


def _next_text_line(lines: list[str], i: int) -> str | None:
    return next((line for line in lines[i + 1 :] if line.strip()), None)


def figure_text(lines: list[str], item: dict) -> str:
    """A figure's text: what the extraction kept of its plot (axis labels, ticks, legend, bar values), between the
    previous ``Table/Figure N:`` caption and its own caption."""
    at = caption_index(lines, item)
    before = [i for i, line in enumerate(lines[:at]) if re.match(r"(?:Table|Figure) \d+: ", line)]
    return flatten_math("\n".join(lines[(before[-1] + 1 if before else 0) : at]))


def figure_mismatches(lines: list[str], item: dict) -> list[str]:
    """A figure's x values, column groups and series read back (the plot prints them run together, in order), and
    bar values written as pgfplots coordinates ``Y<k>.0e0]pt<value>`` (bar k is the k-th series) compared."""
    text = figure_text(lines, item)
    wrong = []
    for what, parts in [
        ("x values", [c["label"] for c in item["columns"]]),
        ("series", [r["label"] for r in item["rows"]]),
        *[("column group", [g]) for g in {c["group"] for c in item["columns"]} if g],
    ]:
        if "".join(parts) not in text:
            wrong.append(f"{item['id']}: {what} {parts} not in the figure's text")
    bars = {int(k): v for k, v in re.findall(r"Y(\d+)\.0e0\]pt([\d.]+)", text)}
    for k, row in enumerate(item["rows"], start=1):
        printed = [v for v in row["values"] if v is not None]
        if printed and printed != [bars.get(k)]:
            wrong.append(f"{item['id']} {row['label']!r}: data {printed}, text bar Y{k} = {bars.get(k)}")
    return wrong


# ---- the checks every paper's test file runs --------------------------------------------------------------------


class PaperTableChecks:
    """Subclassed once per paper (``class TestFoxTables(PaperTableChecks)`` with ``PAPER`` and ``SEED``): the shape
    of every item, and its captions and cells read back out of the paper's text when that text is here."""

    PAPER = ""
    SEED = ""

    def pytest_generate_tests(self, metafunc):
        items = load(self.PAPER)["items"]
        chosen = {
            "item": items,
            "table": [i for i in items if i["kind"] == "table"],
            "plotted": [i for i in items if i["kind"] == "figure" and i["columns"]],
        }
        for name, group in chosen.items():
            if name in metafunc.fixturenames:
                metafunc.parametrize(name, group, ids=[i["id"] for i in group])

    def seed(self) -> list[str]:
        lines = seed_lines(self.SEED)
        if lines is None:
            pytest.skip(f"the paper's text {SEEDS / self.SEED} is absent: no read-back (the shape checks still run)")
        return lines

    def test_file_names_its_paper(self):
        doc = load(self.PAPER)
        assert set(doc) == {"paper", "title", "arxiv", "items"} and doc["paper"] == self.PAPER
        assert re.fullmatch(r"\d{4}\.\d{5}", doc["arxiv"]) and doc["title"].strip()

    def test_item_shape(self, item):
        problems = item_problems(item, self.PAPER, card_names())
        assert not problems, "\n".join(problems)

    def test_ids_are_unique(self):
        ids = [i["id"] for i in load(self.PAPER)["items"]]
        assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)

    def test_averages_agree_with_their_columns(self):
        problems = [p for i in load(self.PAPER)["items"] for p in average_problems(i)]
        assert not problems, "\n".join(problems)

    def test_lm_eval_recipes_name_installed_tasks(self):
        known = lm_eval_task_names()
        if known is None:
            pytest.skip("lm-eval is not installed (the lm-eval extra)")
        named = {
            c["recipe"]["task"]
            for i in load(self.PAPER)["items"]
            for c in i["columns"]
            if c["recipe"] and c["recipe"]["kind"] == "lm-eval"
        }
        assert named <= known, f"lm-eval has no task {sorted(named - known)}"

    def test_recipes_name_our_tasks(self):
        problems = [p for i in load(self.PAPER)["items"] for p in suite_recipe_problems(i)]
        assert not problems, "\n".join(problems)

    def test_every_caption_of_the_text_has_an_item(self):
        printed = {m.groups() for line in self.seed() if (m := re.match(r"(Table|Figure) (\d+): ", line))}
        ours = {(i["kind"].capitalize(), re.match(r"\d+", i["number"]).group()) for i in load(self.PAPER)["items"]}
        assert printed <= ours, f"captions in the text without an item: {sorted(printed - ours)}"

    def test_caption_reads_back(self, item):
        lines = self.seed()
        line = lines[caption_index(lines, item)]
        assert is_subsequence(words(item["caption"]), words(line)), f"caption {item['caption']!r} vs {line!r}"

    def test_table_cells_read_back(self, table):
        problems = table_mismatches(self.seed(), table)
        assert not problems, "\n".join(problems)

    def test_figure_reads_back(self, plotted):
        problems = figure_mismatches(self.seed(), plotted)
        assert not problems, "\n".join(problems)
