"""Checks of the papers' published tables (``evalsuite/papers/data/<paper>.yaml``, the format of
docs/paper-tables.md), shared by ``tests/test_paper_tables_<paper>.py``: each file against the format, and every
caption, table row and plotted figure read back out of the paper's text.

The texts are HTML-to-text renders of the arXiv pages, in ``shared/seeds/`` inside or beside the checkout (or the
folder ``$EVALSUITE_PAPER_SEEDS`` names); where they are absent (CI) the read-back skips and the format checks run.
A table's rows are lines ``<label> <cell> <cell> ...`` next to its caption line (``Table N: ...``), above or below
it. A formula comes in three copies (rendered, LaTeX, alt text): ``2.91×1052.91superscript1052.91\\times
10^{5}2.91 × 10 start_POSTSUPERSCRIPT 5 end_POSTSUPERSCRIPT`` is the printed 2.91×10⁵ and ``DRTretrieval×1retrieval1
{}_{\\text{retrieval}\\times 1}start_FLOATSUBSCRIPT retrieval × 1 end_FLOATSUBSCRIPT`` the label DRT_retrieval×1;
:func:`fold_math` folds such copies back to the data's spelling, and a formula the data writes ``$TeX$`` (a caption's,
a cell's) is found by its LaTeX copy.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from evalsuite.papers.format import (  # noqa: F401  (the format's rules, for the test files that import them here)
    CHOICES,
    RECIPES,
    file_problems,
    item_problems,
    part_problems,
    suite_recipe_problems,
)
from evalsuite.papers.published import load_paper

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "evalsuite" / "papers" / "data"
SEEDS_ENV = "EVALSUITE_PAPER_SEEDS"

# ---- the format (docs/paper-tables.md): its rules are the loader's, in evalsuite.papers.format --------------------


@functools.cache
def load(paper: str) -> dict:
    """A paper's data file, parsed once (the checks only read it)."""
    return yaml.safe_load((DATA / f"{paper}.yaml").read_text(encoding="utf-8"))


def card_names() -> set[str]:
    return {p.stem for p in (ROOT / "models").glob("*.yaml")}


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


NUMBER_END = re.compile(r"^\d+(?:\.\d+)?[kKMBT%]?$")
ROW_END = re.compile(r"^(?:\d+(?:\.\d+)?[kKMBGT%×]?|-|OOM|[KMGT]?B)$")  # how a table row's line ends


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


# ---- the paper's text --------------------------------------------------------------------------------------------

SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
SCI_SEED = re.compile(  # m×10^e: the rendered copy, "\times 10^{e}", then "m × 10 start_POSTSUPERSCRIPT - e end_..."
    r"\S*\\times 10\^\{(-?\d+)\}(\d+(?:\.\d+)?) × 10 start_POSTSUPERSCRIPT (?:- )?\d+ end_POSTSUPERSCRIPT"
)
TIMES_SEED = re.compile(r"(\d+(?:\.\d+)?)×\1\\times\1 ×")  # "1.22×1.22\times1.22 ×": the printed 1.22×
STATE_SEED = re.compile(r"(\d+)×Ld\d+\S*\\times Ld\d+ × italic_L italic_d")  # GSA's "64×Ld" state sizes
SUBSCRIPT_SEED = re.compile(r"(\S+?)\{\}_\{.*?\}start_FLOATSUBSCRIPT (.+?) end_FLOATSUBSCRIPT")
REPEATED_NUMBER = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\1\1\1(?![\d])")  # a number set as a formula: 4 copies
CAPTION = re.compile(r"^(?:(?:Table|Figure) \d+: |\([a-z]\) )")
FORMULA = re.compile(r"\$(.+?)\$")


def seed_dirs() -> list[Path]:
    """Where the papers' texts may be: ``$EVALSUITE_PAPER_SEEDS`` alone when set, else ``shared/seeds`` inside or
    beside the checkout."""
    if os.environ.get(SEEDS_ENV):
        return [Path(os.environ[SEEDS_ENV])]
    return [ROOT / "shared" / "seeds", ROOT.parent / "shared" / "seeds"]


@functools.cache
def _read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").replace("\u00a0", " ").splitlines()


def seed_lines(name: str) -> list[str] | None:
    """The text's lines, or None where no seed folder holds it."""
    return next((_read_lines(d / name) for d in seed_dirs() if (d / name).is_file()), None)


def _subscript(m: re.Match) -> str:
    """``DRTretrieval×1retrieval1{}_{...}start_FLOATSUBSCRIPT retrieval × 1 end_FLOATSUBSCRIPT`` -> ``DRT_retrieval×1``:
    the base is the token before the first copy of the subscript."""
    sub = m[2].replace(" ", "")
    at = m[1].find(sub)
    return f"{m[1][:at]}_{sub}" if at > 0 else m[0]


def fold_math(line: str) -> str:
    """A line of the text with its formula copies folded to the data's spelling: ``m×10^e``, ``1.22×``, ``64×Ld``,
    ``X_sub``."""
    line = STATE_SEED.sub(r"\1×Ld", SCI_SEED.sub(r"\2×10^\1", line))
    line = TIMES_SEED.sub(r"\1×", line).replace("×\\times×", "×")
    return SUBSCRIPT_SEED.sub(_subscript, line)


def cell_text(value: str) -> str:
    """A cell as the folded text prints it: ``2.72×10⁹`` -> ``2.72×10^9``."""
    return re.sub(r"×10([⁰¹²³⁴⁵⁶⁷⁸⁹⁻]+)", lambda m: "×10^" + m.group(1).translate(SUPERSCRIPT), value)


def label_text(label: str) -> str:
    """A label whose formula the text garbles, as its line begins: math minus signs dropped, superscripts as digits
    (``−softmax+ReLU²`` begins ``softmax``)."""
    return label.replace("−", "").translate(SUPERSCRIPT)


def words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z]{3,}", text)


def is_subsequence(needle: list[str], hay: list[str]) -> bool:
    it = iter(hay)
    return all(any(w == h for h in it) for w in needle)


def caption_index(lines: list[str], item: dict) -> int:
    """The line of an item's caption: ``Table N: ...`` / ``Figure N: ...``; a lettered part whose float lost that
    line (GSA's 3(a), 3(b)) by its own ``(x) ...`` line."""
    kind = "Table" if item["kind"] == "table" else "Figure"
    base, _, letter = item["number"].partition("(")
    if letter:
        for i, line in enumerate(lines):
            if line.startswith(f"({letter[0]}) ") and is_subsequence(words(item["caption"]), words(line)):
                return i
    found = [i for i, line in enumerate(lines) if line.startswith(f"{kind} {base}: ")]
    assert found, f"{item['id']}: no caption line '{kind} {base}:' in the text"
    return found[0]


def caption_pattern(caption: str) -> str:
    """A regex of a caption as the text prints it: its words as written, each ``$TeX$`` formula by its LaTeX copy
    among the rendered and alt-text copies around it (which hold no full stop: the captions' formulas have none)."""
    parts = FORMULA.split(" ".join(caption.split()))
    text = [r"\s+".join(map(re.escape, p.split(" "))) for p in parts[::2]]
    tex = ["[^.]*?" + re.escape(p) + "[^.]*?" for p in parts[1::2]]
    return "".join(t + f for t, f in zip(text, [*tex, ""], strict=True))


def caption_mismatch(lines: list[str], item: dict) -> str | None:
    """The caption against the whole of its line; a lettered part sharing its float's ``Figure N:`` line against the
    whole line too (GCA's 3(a) and 3(b)), or against the stretch from its ``N(x)`` to the next (GSA's 4(a))."""
    line = lines[caption_index(lines, item)]
    text = REPEATED_NUMBER.sub(r"\1", CAPTION.sub("", line)).strip()
    pattern = caption_pattern(item["caption"])
    found = re.fullmatch(pattern, text)
    if not found and "(" in item["number"] and not line.startswith("("):
        found = re.search(rf"{re.escape(item['number'])} {pattern}(?=\s+\d+\([a-z]\)\s|$)", text)
    return None if found else f"{item['id']}: caption {item['caption']!r} is not the text's {line!r}"


@dataclass(frozen=True)
class TextQuirks:
    """Where a paper's text departs from the printed tables, set once per paper (its test file says why).

    caption_below: ids of the items whose caption line follows their rows (else it precedes them). unlabelled: (item
    id, row index) -> a regex ending where the cells begin, for a row whose line lost its label. kept: (item id, row
    index) -> the keys of the columns whose cells the text kept, for a row that lost the others. headless: (item id,
    row index) of a row opening a row group whose header line the text lost.
    """

    caption_below: frozenset[str] = frozenset()
    unlabelled: dict[tuple[str, int], str] = field(default_factory=dict)
    kept: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    headless: frozenset[tuple[str, int]] = frozenset()


def table_region(lines: list[str], item: dict, quirks: TextQuirks) -> list[str]:
    """The lines between the item's caption and the next caption, or the previous one when its caption follows the
    rows."""
    at = caption_index(lines, item)
    bounds = [i for i, line in enumerate(lines) if CAPTION.match(line)]
    if item["id"] in quirks.caption_below:
        return lines[max([b for b in bounds if b < at], default=-1) + 1 : at]
    return lines[at + 1 : min([b for b in bounds if b > at], default=len(lines))]


@dataclass(frozen=True)
class RowLine:
    """Where a row is in its table's region: its line ``at``, the folded text after its label (``cells``), whether
    that text starts right after the label (``from_label``; not so after a label the text garbles), and whether the
    row's group header shares the line (``inline``)."""

    at: int
    cells: str
    from_label: bool
    inline: bool = False


def read_row(region: list[str], at: int, row: dict, above: dict | None, pattern: str | None) -> RowLine | None:
    """Line ``at`` read as ``row`` (``above``: the row printed above it), or None when it is not that row's line.
    A row's line starts with its label; with its group's header where that opens the row group on the same line
    (Lightning's Table 1); with a number where the row has no label; with its cells where its label is the row
    above's (one label cell spanning both rows); with ``pattern`` where the text lost the label."""
    line = fold_math(region[at].strip())
    if pattern:
        m = re.search(pattern, line)
        return RowLine(at, line[m.end() :], True) if m else None
    label = row["label"]
    opens = bool(row["group"]) and (above is None or above["group"] != row["group"])
    for inline in (False, True) if opens else (False,):
        head = f"{row['group']} {label}" if inline else label
        if label and (line == head or line.startswith(head + " ")):
            return RowLine(at, line[len(head) :], True, inline)
    if not label:
        return RowLine(at, line, True) if line and NUMBER_END.match(line.split()[0]) else None
    if above is not None and above["label"] == label and line:
        return RowLine(at, line, True)
    if line.startswith(label_text(label)):
        return RowLine(at, line[len(label_text(label)) :], False)
    return None


def _lines_of(row: dict) -> int:
    """Lines a row takes: its label line, and the lines of a multi-line cell under it (GCA's Table 5)."""
    return 1 + max((v.count("\n") + 1 for v in row["values"] if v and "\n" in v), default=0)


def _text_lines(region: list[str], start: int, stop: int) -> list[int]:
    return [k for k in range(start, stop) if region[k].strip()]


def row_lines(region: list[str], item: dict, quirks: TextQuirks) -> list[RowLine]:
    """Each row's line in ``region``: the first row's by searching, each later row's the next text line but for the
    header line of a row group it opens (checked: nothing else lies between two rows)."""
    rows, found = item["rows"], []
    for i, row in enumerate(rows):
        above = rows[i - 1] if i else None
        pattern = quirks.unlabelled.get((item["id"], i))
        where = f"{item['id']} row {i} ({row['label']!r})"
        opens = bool(row["group"]) and (above is None or above["group"] != row["group"])
        header = opens and (item["id"], i) not in quirks.headless
        # the text prints no end of a row group: a row after a grouped one is under that group's header
        assert not (above and above["group"] and not row["group"]), f"{where}: no group after a grouped row"
        if i == 0:
            line = next(filter(None, (read_row(region, k, row, None, pattern) for k in range(len(region)))), None)
            assert line is not None, f"{where}: no line of the table reads as the first row"
            before = _text_lines(region, 0, line.at)
            if header and not line.inline:
                assert before and _is_header(region[before[-1]], row["group"]), f"{where}: no group line above it"
        else:
            start = found[-1].at + _lines_of(above)
            ahead = _text_lines(region, start, len(region))[:2]
            line = read_row(region, ahead[0], row, above, pattern) if ahead else None
            if header and not (line and line.inline):  # the group's header line, then the row's
                has_header = len(ahead) == 2 and _is_header(region[ahead[0]], row["group"])
                line = read_row(region, ahead[1], row, above, pattern) if has_header else None
            assert line is not None, f"{where}: the table's next lines are {[region[k] for k in ahead]!r}"
        found.append(line)
    return found


def _is_header(line: str, group: str) -> bool:
    """A row group's header line: the group, or the group then the header of a column group on the same line
    (GCA's Table 1: "Train length=16K, eval length = 2K 128M 350M")."""
    line = line.strip()
    return line == group or line.startswith(group + " ")


def row_mismatches(line: RowLine, row: dict, keys: list[str], kept: list[str] | None) -> tuple[int, list[str]]:
    """A row's cells against the text after its label: every printed cell, in order, token by token (a cell the
    paper leaves empty or marks ✓ prints nothing; one the text lost is left out by ``kept``). Cells past a ``$TeX$``
    cell are located from the line's end, and a single such cell must hold its LaTeX in the tokens between. Returns
    (cells compared, mismatches)."""
    seq = [
        v if FORMULA.fullmatch(v) else cell_text(v).split()
        for k, v in zip(keys, row["values"], strict=True)
        if v is not None and v != "✓" and (kept is None or k in kept)
    ]
    formulas = [j for j, c in enumerate(seq) if isinstance(c, str)]
    head, tail = (seq[: formulas[0]], seq[formulas[-1] + 1 :]) if formulas else (seq, [])
    if not line.from_label:  # the text garbles the label: cells are read from the line's end only
        head, tail = [], tail if formulas else seq
    flat_head, flat_tail = sum(head, []), sum(tail, [])
    tokens = line.cells.split()
    got_head = tokens if line.from_label and not formulas else tokens[: len(flat_head)]
    got_tail = tokens[-len(flat_tail) :] if flat_tail else []
    wrong = [f"text {got_head} != data {flat_head}"] if got_head != flat_head else []
    wrong += [f"text ends {got_tail} != data {flat_tail}"] if got_tail != flat_tail else []
    checked = len(head) + len(tail)
    if len(formulas) == 1 and line.from_label:
        middle = " ".join(tokens[len(flat_head) : len(tokens) - len(flat_tail)])
        checked += 1
        if FORMULA.fullmatch(seq[formulas[0]])[1] not in middle:
            wrong.append(f"formula {seq[formulas[0]]} not in {middle!r}")
    return checked, [f"row {row['label']!r}: {w}" for w in wrong]


def table_mismatches(lines: list[str], item: dict, quirks: TextQuirks, last_part: bool = True) -> list[str]:
    """Every row of a table read back out of the text; also that each row has a cell to read, that the line after
    the last row is not one more row, and, for a table whose caption follows it (and that is no earlier part of
    several under that caption: ``last_part``), that its last row is the caption's line above."""
    region = table_region(lines, item, quirks)
    found = row_lines(region, item, quirks)
    keys = [c["key"] for c in item["columns"]]
    wrong = []
    for i, (line, row) in enumerate(zip(found, item["rows"], strict=True)):
        if _lines_of(row) > 1:  # a multi-line cell: the label alone, then the cell's lines
            printed = [region[k].strip() for k in range(line.at + 1, line.at + _lines_of(row))]
            expected = next(v for v in row["values"] if v and "\n" in v).split("\n")
            wrong += [f"row {row['label']!r}: text {printed} != data {expected}"] if printed != expected else []
            continue
        checked, bad = row_mismatches(line, row, keys, quirks.kept.get((item["id"], i)))
        wrong += bad
        if checked == 0:
            wrong.append(f"row {row['label']!r}: no cell of this row can be read back")
    after = _text_lines(region, found[-1].at + _lines_of(item["rows"][-1]), len(region))[:1]
    if after and ROW_END.match(fold_math(region[after[0]]).split()[-1]):
        wrong.append(f"the line after the last row looks like one more row: {region[after[0]]!r}")
    if after and last_part and item["id"] in quirks.caption_below:
        wrong.append(f"the caption does not follow the last row but {region[after[0]]!r}")
    return [f"{item['id']} {w}" for w in wrong]


def figure_text(lines: list[str], item: dict) -> str:
    """A figure's text: what the extraction kept of its plot (axis labels, ticks, legend, bar values), between the
    previous ``Table/Figure N:`` caption and its own caption."""
    at = caption_index(lines, item)
    before = [i for i, line in enumerate(lines[:at]) if re.match(r"(?:Table|Figure) \d+: ", line)]
    return fold_math("\n".join(lines[(before[-1] + 1 if before else 0) : at]))


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
    """Subclassed once per paper (``class TestFoxTables(PaperTableChecks)``), which sets ``PAPER`` (the data file's
    stem), ``SEED`` (the text's file name), ``TABLES`` and ``FIGURES`` (how many the paper numbers) and its text's
    ``QUIRKS``: every item's shape, and its captions, rows and plotted figures read back out of the paper's text."""

    PAPER = ""
    SEED = ""
    TABLES = 0
    FIGURES = 0
    QUIRKS = TextQuirks()

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
            where = " or ".join(str(d) for d in seed_dirs())
            pytest.skip(f"the paper's text {self.SEED} is not in {where} (${SEEDS_ENV}): no read-back")
        return lines

    def test_file_names_its_paper(self):
        doc = load(self.PAPER)
        assert set(doc) == {"paper", "title", "arxiv", "items"} and doc["paper"] == self.PAPER
        assert re.fullmatch(r"\d{4}\.\d{5}", str(doc["arxiv"])) and isinstance(doc["title"], str) and doc["title"]
        assert file_problems(doc, self.PAPER) == []

    def test_file_loads_through_the_loader(self):
        """`evalsuite paper` reads the file through the same rules, with every item and row intact."""
        paper = load_paper(DATA / f"{self.PAPER}.yaml")
        assert [i.id for i in paper.items] == [i["id"] for i in load(self.PAPER)["items"]]
        assert [len(i.rows) for i in paper.items] == [len(i["rows"]) for i in load(self.PAPER)["items"]]

    def test_item_shape(self, item):
        problems = item_problems(item, self.PAPER, card_names())
        assert not problems, "\n".join(problems)

    def test_ids_are_unique_and_parts_lettered(self):
        items = load(self.PAPER)["items"]
        ids = [i["id"] for i in items]
        assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)
        assert not part_problems(items), part_problems(items)

    def test_every_table_and_figure_of_the_paper_is_an_item(self):
        numbered = {(i["kind"], int(re.match(r"\d+", i["number"])[0])) for i in load(self.PAPER)["items"]}
        tables, figures = range(1, self.TABLES + 1), range(1, self.FIGURES + 1)
        assert numbered == {("table", n) for n in tables} | {("figure", n) for n in figures}

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

    def test_items_follow_the_texts_captions_in_order(self):
        """Every ``Table N:`` / ``Figure N:`` line of the text is an item's caption, and the items are in the text's
        order."""
        lines = self.seed()
        at = [caption_index(lines, i) for i in load(self.PAPER)["items"]]
        printed = {k for k, line in enumerate(lines) if re.match(r"(?:Table|Figure) \d+: ", line)}
        assert printed <= set(at), f"captions without an item: {[lines[k][:40] for k in sorted(printed - set(at))]}"
        assert at == sorted(at), "the items are not in the order of their captions in the text"

    def test_caption_reads_back(self, item):
        problem = caption_mismatch(self.seed(), item)
        assert problem is None, problem

    def test_table_rows_read_back(self, table):
        items = load(self.PAPER)["items"]
        later = items[items.index(table) + 1 :]
        last_part = not any((i["kind"], i["number"]) == (table["kind"], table["number"]) for i in later)
        problems = table_mismatches(self.seed(), table, self.QUIRKS, last_part)
        assert not problems, "\n".join(problems)

    def test_figure_reads_back(self, plotted):
        problems = figure_mismatches(self.seed(), plotted)
        assert not problems, "\n".join(problems)
