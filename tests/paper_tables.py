"""Checks shared by the tests of the papers' published tables (``evalsuite/papers/data/<paper>.yaml``, the format of
docs/paper-tables.md): the shape of a data file, and its cells read back out of the paper's text.

The paper texts are HTML-to-text renders (``shared/seeds/``, beside or inside the checkout; absent in CI, where the
read-back skips). A table's rows are lines of its text region, the lines between its caption and the nearest
blank line or other caption, on the side of the caption the render puts the table. Each formula in a render comes
three times (Unicode, LaTeX, alt text): ``1.22×1.22\\times1.22 ×`` is the printed ``1.22×``, and
``2.91×1052.91superscript1052.91\\times 10^{5}2.91 × 10 start_POSTSUPERSCRIPT 5 end_POSTSUPERSCRIPT`` the printed
2.91×10⁵, written ``2.91×10^5`` in the data files.
"""

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "evalsuite" / "papers" / "data"
CARDS = REPO / "models"
SEED_DIRS = (REPO / "shared" / "seeds", REPO.parent / "shared" / "seeds")

ITEM_KEYS = {"id", "kind", "number", "caption", "columns", "rows", "averages", "footnotes", "marks", "needs"}
COLUMN_KEYS = {"key", "label", "group", "better", "recipe"}
ROW_KEYS = {"label", "group", "model", "scale", "source", "values"}
MARKS = {"best_second", "bold_best", "none"}
NEEDS = {"cards", "gpu", "weights", "dataset", "training", "none"}
# The fields a recipe of each kind must name. A loss recipe may leave its length to the row (a table whose row groups
# are evaluation lengths); a passkey recipe names its test `mode`, as `kind` is the recipe's own.
RECIPE_FIELDS = {
    "lm-eval": {"task", "metric", "shots"},
    "longbench": {"dataset"},
    "loss": {"metric"},
    "niah": {"mode", "length"},
    "passkey": {"mode", "length"},
    "mqar": {"preset"},
    "summarize": {"metric"},
    "params": {"what"},
    "flops": {"formula"},
    "bench": {"op", "metric"},
}
BENCH_OPS = {"attention", "linear", "decode", "train_step"}
BENCH_METRICS = {"time", "memory", "throughput"}
CAPTION = re.compile(r"^(Table|Figure) (\d+):\s*(.*)$")


def load(paper: str) -> dict:
    return yaml.safe_load((DATA / f"{paper}.yaml").read_text(encoding="utf-8"))


def seed_text(name: str) -> str | None:
    """The paper's text, or None where no ``shared/seeds`` holds it."""
    for folder in SEED_DIRS:
        if (folder / name).is_file():
            return (folder / name).read_text(encoding="utf-8")
    return None


def _recipe_problems(where: str, recipe) -> list[str]:
    if recipe is None:
        return []
    if not isinstance(recipe, dict) or recipe.get("kind") not in RECIPE_FIELDS:
        return [f"{where}: recipe {recipe!r} is not one of the kinds {sorted(RECIPE_FIELDS)}"]
    missing = sorted(RECIPE_FIELDS[recipe["kind"]] - set(recipe))
    problems = [f"{where}: {recipe['kind']} recipe lacks {f}" for f in missing]
    if "length" in recipe and not (isinstance(recipe["length"], int) and recipe["length"] > 0):
        problems.append(f"{where}: length {recipe['length']!r} is not a token count")
    if recipe["kind"] == "lm-eval" and not isinstance(recipe.get("shots"), int):
        problems.append(f"{where}: shots {recipe.get('shots')!r} is not an integer")
    if recipe["kind"] == "bench" and (recipe.get("op") not in BENCH_OPS or recipe.get("metric") not in BENCH_METRICS):
        problems.append(f"{where}: bench op/metric {recipe.get('op')!r}/{recipe.get('metric')!r} unknown")
    return problems


def _column_problems(item_id: str, columns: list) -> list[str]:
    problems, keys = [], [c.get("key") for c in columns]
    for c in columns:
        where = f"{item_id} column {c.get('key')!r}"
        if missing := COLUMN_KEYS - set(c):
            problems.append(f"{where}: lacks {sorted(missing)}")
        if not re.fullmatch(r"[a-z0-9_]+", str(c.get("key"))):
            problems.append(f"{where}: key is not [a-z0-9_]+")
        if c.get("better") not in ("higher", "lower", None):
            problems.append(f"{where}: better {c.get('better')!r}")
        if not isinstance(c.get("label"), str) or not c["label"]:
            problems.append(f"{where}: label {c.get('label')!r}")
        problems += _recipe_problems(where, c.get("recipe"))
    if len(set(keys)) != len(keys):
        problems.append(f"{item_id}: column keys repeat: {keys}")
    return problems


def _row_problems(item_id: str, rows: list, width: int) -> list[str]:
    problems = []
    for i, r in enumerate(rows):
        where = f"{item_id} row {i} ({r.get('label')!r})"
        if missing := ROW_KEYS - set(r):
            problems.append(f"{where}: lacks {sorted(missing)}")
        if not isinstance(r.get("label"), str) or not r["label"]:
            problems.append(f"{where}: label is not a string")
        if r.get("model") is not None and not (CARDS / f"{r['model']}.yaml").is_file():
            problems.append(f"{where}: model {r['model']!r} is no card in models/")
        values = r.get("values")
        if not isinstance(values, list) or len(values) != width:
            problems.append(f"{where}: {len(values or [])} values for {width} columns")
            continue
        for v in values:
            if v is not None and not (isinstance(v, str) and v and v == v.strip()):
                problems.append(f"{where}: value {v!r} is not a non-empty string as printed")
    return problems


def format_problems(doc: dict, paper: str) -> list[str]:
    """Everything in one paper's data file that breaks docs/paper-tables.md, as lines (none: the file is right)."""
    problems = [f"{k}: {doc.get(k)!r}" for k in ("title", "arxiv") if not isinstance(doc.get(k), str)]
    if doc.get("paper") != paper:
        problems.append(f"paper: {doc.get('paper')!r} is not the file's stem {paper!r}")
    ids = [item.get("id") for item in doc.get("items", [])]
    if len(set(ids)) != len(ids):
        problems.append(f"ids repeat: {ids}")
    for item in doc.get("items", []):
        item_id = item.get("id")
        if missing := ITEM_KEYS - set(item):
            problems.append(f"{item_id}: lacks {sorted(missing)}")
            continue
        m = re.fullmatch(rf"{paper}:(table|figure)(\d+)[a-z]?", str(item_id))
        if not m or m[1] != item["kind"] or not str(item["number"]).startswith(m[2]):
            problems.append(f"{item_id}: id, kind {item['kind']!r} and number {item['number']!r} disagree")
        if not isinstance(item["caption"], str) or len(item["caption"]) < 15:
            problems.append(f"{item_id}: caption {item['caption']!r}")
        if item["marks"] not in MARKS or item["needs"] not in NEEDS:
            problems.append(f"{item_id}: marks {item['marks']!r} / needs {item['needs']!r}")
        if item["marks"] != "none" and not any(c.get("better") for c in item["columns"]):
            problems.append(f"{item_id}: marks {item['marks']!r} without a column that has a better side")
        if item["kind"] == "table" and not item["rows"]:
            problems.append(f"{item_id}: a table without rows")
        keys = {c.get("key") for c in item["columns"]}
        for avg in item["averages"]:
            if avg.get("column") not in keys or not set(avg.get("of") or []) <= keys or not avg.get("how"):
                problems.append(f"{item_id}: average {avg!r} names unknown columns")
        if not all(isinstance(f, str) for f in item["footnotes"]):
            problems.append(f"{item_id}: footnotes are not strings")
        problems += _column_problems(item_id, item["columns"])
        problems += _row_problems(item_id, item["rows"], len(item["columns"]))
    return problems


def numbered(doc: dict) -> list[tuple[str, str]]:
    """(kind, number) of the items in their order, parts folded into their table: ("figure", "3") for "3(a)"."""
    return list(dict.fromkeys((item["kind"], re.match(r"\d+", item["number"])[0]) for item in doc["items"]))


def captions(text: str) -> dict[tuple[str, str], str]:
    """(kind, number) -> the caption's text, for every ``Table N:`` / ``Figure N:`` line of a paper's text, in the
    text's order."""
    found = {}
    for line in text.splitlines():
        if m := CAPTION.match(line):
            found[(m[1].lower(), m[2])] = m[3]
    return found


def caption_region(text: str, kind: str, number: str, side: str) -> list[str]:
    """The lines of a table's text region: from its caption line (``Table N:``) toward ``side`` ("after" or
    "before") up to the nearest blank line or other caption line, in reading order."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"{kind.capitalize()} {number}:"))
    step = 1 if side == "after" else -1
    region, i = [], at + step
    while 0 <= i < len(lines) and lines[i].strip() and not CAPTION.match(lines[i]):
        region.append(lines[i])
        i += step
    return region if side == "after" else region[::-1]


def part(region: list[str], start: str | None, end: str | None) -> list[str]:
    """The lines of ``region`` from the first matching ``start`` up to (not with) the next matching ``end``."""
    first = next(i for i, line in enumerate(region) if re.search(start, line)) if start else 0
    rest = region[first + 1 :]
    last = next((first + 1 + i for i, line in enumerate(rest) if end and re.search(end, line)), len(region))
    return region[first:last]


def cells(text: str) -> list[str]:
    """A row's printed cells from its text after the label: the render's formula triplets folded back to the
    printed form, then one cell per blank-separated token (a number with its unit B/GB/TB kept whole: "200 B")."""
    text = re.sub(
        r"(\d+(?:\.\d+)?)×10(\d+)\S*?\\times 10\^\{\2\}\1 × 10 start_POSTSUPERSCRIPT \2 end_POSTSUPERSCRIPT",
        r"\1×10^\2",
        text,
    )
    text = re.sub(r"(\d+(?:\.\d+)?)×\1\\times\1 ×", r"\1×", text)
    text = text.replace("×\\times×", "×")
    return re.findall(r"\d+(?:\.\d+)? (?:B|GB|TB)\b|\S+", text)


@dataclass
class ReadBack:
    """How one paper's rows are found in its text. A row's line is, by default, the n-th line of the item's region
    holding the row's label (n: how many earlier rows of the item share the label), its cells the text after the
    label, compared with the row's non-null values in column order (a cell the paper leaves empty prints nothing);
    rows placed by ``lines`` do not count toward n.

    side: where the render puts a table, "after" or "before" its caption. parts: item id -> (start, end) regexes
    cutting the region of a table printed as several tabulars. anchors: label -> regex finding the row's line when
    the label is printed otherwise (a subscript). lines: (item id, row index) -> (regex, occurrence) for a row whose
    line does not print its label. kept: (item id, row index) -> the column keys whose cells the text kept, for a
    row the text lost cells of.
    """

    side: str
    parts: dict = field(default_factory=dict)
    anchors: dict = field(default_factory=dict)
    lines: dict = field(default_factory=dict)
    kept: dict = field(default_factory=dict)

    def region(self, text: str, item: dict) -> list[str]:
        number = re.match(r"\d+", item["number"])[0]
        return part(caption_region(text, item["kind"], number, self.side), *self.parts.get(item["id"], (None, None)))

    def _line(self, region: list[str], item: dict, index: int) -> tuple[int, int]:
        """(the row's line index in ``region``, where its cells start on that line)."""
        if (item["id"], index) in self.lines:
            pattern, occurrence = self.lines[item["id"], index]
        else:
            label = item["rows"][index]["label"]
            pattern = self.anchors.get(label) or rf"(?:^|\s){re.escape(label)}(?=\s|$)"
            earlier = [i for i, r in enumerate(item["rows"][:index]) if r["label"] == label]
            occurrence = sum((item["id"], i) not in self.lines for i in earlier)
        hits = [(i, m.end()) for i, line in enumerate(region) if (m := re.search(pattern, line))]
        assert len(hits) > occurrence, f"{item['id']} row {index}: no line {occurrence} matching {pattern!r}"
        return hits[occurrence]

    def mismatches(self, text: str, item: dict) -> list[str]:
        """Each row of ``item`` whose values are not the cells its line of the paper's text prints."""
        region, found = self.region(text, item), []
        keys = [c["key"] for c in item["columns"]]
        for index, row in enumerate(item["rows"]):
            at, start = self._line(region, item, index)
            kept = self.kept.get((item["id"], index))
            pairs = zip(keys, row["values"], strict=True)
            expected = [v for k, v in pairs if v is not None and (kept is None or k in kept)]
            if len(expected) == 1 and "\n" in expected[0]:  # a multi-line cell: the lines under the label
                lines = expected[0].split("\n")
                printed = [line.strip() for line in region[at + 1 : at + 1 + len(lines)]]
                expected = lines
            else:
                printed = cells(region[at][start:])
            if printed != expected:
                found.append(f"{item['id']} row {index} ({row['label']!r}): text {printed} != data {expected}")
        return found


def caption_mismatches(text: str, doc: dict) -> list[str]:
    """Items whose caption is not the text's caption of that number (compared up to the first formula, written
    ``$...$`` in the data: the render garbles formulas)."""
    found, texts = [], captions(text)
    for item in doc["items"]:
        seed = texts.get((item["kind"], re.match(r"\d+", item["number"])[0]))
        mine = " ".join(item["caption"].split())
        cut = mine.index("$") if "$" in mine else len(mine)
        seed = " ".join((seed or "").replace("\\downarrow", "↓").replace("\\uparrow", "↑").split())
        if not (seed.startswith(mine[:cut]) and (cut < len(mine) or seed == mine)):
            found.append(f"{item['id']}: caption {mine[:cut]!r} is not how the text's opens: {seed[:cut]!r}")
    return found
