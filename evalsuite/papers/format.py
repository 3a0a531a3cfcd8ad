"""The rules of the papers' data files (``papers/data/<paper>.yaml``), as docs/paper-tables.md states them.

Each check takes a file's parsed YAML (plain dicts and lists) and returns what is wrong as readable lines, empty
when all is well: :mod:`evalsuite.papers.published` refuses a file on its first problem, and the data tests
(``tests/paper_tables.py``) report them all. The doc's recipe table is :data:`RECIPES` and :data:`CHOICES`
(``tests/test_paper_tables_format.py`` compares them).
"""

from __future__ import annotations

import re

from evalsuite.resources import builtin_dir, read_yaml, task_presets

FILE_FIELDS = {"paper", "title", "arxiv", "items"}
ITEM_FIELDS = {"id", "kind", "number", "caption", "columns", "rows", "averages", "footnotes", "marks", "needs"}
ITEM_OPTIONAL = {"notes", "row_header"}
COLUMN_FIELDS = {"key", "label", "group", "better", "unit", "recipe"}
ROW_FIELDS = {"label", "group", "model", "scale", "source", "values"}
ROW_OPTIONAL = {"length"}  # present on every row, and only then, when a recipe of the item says `length: row`
RECIPES = {  # kind -> (the fields it must name, the fields it may name), "kind" aside
    "lm-eval": ({"task", "metric", "shots"}, set()),
    "longbench": ({"dataset"}, {"first_line"}),
    "loss": ({"dataset", "length", "metric"}, set()),
    "niah": ({"mode", "length"}, set()),
    "passkey": ({"mode", "length"}, set()),
    "mqar": ({"preset", "d_model", "length", "num_kv_pairs"}, set()),
    "summarize": ({"dataset", "metric"}, set()),
    "params": ({"what"}, set()),
    "flops": ({"formula"}, set()),
    "card": ({"field"}, set()),
    "bench": ({"op", "metric", "length"}, {"new_tokens", "offload"}),
}
# The model facts a `card` column reads (evalsuite.papers.recipes.CARD_VALUES computes each): sizes, and the
# components the FoX paper's ablations switch (arXiv:2503.02130 §4.5, Table 3).
CARD_FIELDS = ("n_layer", "d_model", "n_head", "d_head", "rope", "forget_gate", "qk_norm", "output_gate",
               "output_norm", "kv_shift")  # fmt: skip
CHOICES = {  # (kind, field) -> the values the doc allows
    ("longbench", "first_line"): {"upstream", "fox"},
    ("loss", "metric"): {"ppl"},
    ("niah", "mode"): {"easy", "standard", "2hop"},
    ("passkey", "mode"): {"passkey", "2hop"},
    ("summarize", "metric"): {"rouge1", "rouge2", "rougeL"},
    ("params", "what"): {"total", "non_embedding"},
    ("card", "field"): set(CARD_FIELDS),
    ("bench", "op"): {"attention", "linear", "decode", "train_step"},
    ("bench", "metric"): {"time", "memory", "throughput"},
    ("bench", "offload"): {True, False},
}
LENGTH_FIELDS = ("length", "new_tokens")  # token counts: an int, null (not stated), "row" or {column: KEY}
MQAR_CELL = {"d_model": "d_models", "length": "seq_lens", "num_kv_pairs": "num_kv_pairs"}  # tasks/mqar.yaml
MARKS = {"best_second", "bold_best", "none"}
NEEDS = {"cards", "gpu", "weights", "dataset", "training", "none"}
PRINTED_LENGTH = re.compile(r"(\d+)([KM]?)")  # "16K" in a length column: 16 x 1024 tokens


def printed_length(cell: str | None) -> int | None:
    """Tokens of a printed length ("16K" -> 16384, K = 1024), None when the cell is not one."""
    m = PRINTED_LENGTH.fullmatch(cell or "")
    return int(m[1]) * {"": 1, "K": 1024, "M": 1024**2}[m[2]] if m else None


def _length_problems(value, columns: dict[str, int], rows: list) -> list[str]:
    if value is None or value == "row" or (type(value) is int and value > 0):
        return []
    if isinstance(value, dict) and set(value) == {"column"} and value["column"] in columns:
        at = columns[value["column"]]
        cells = [r["values"][at] for r in rows if isinstance(r, dict) and len(r.get("values") or []) > at]
        return [f"the cell {cell!r} is no length" for cell in cells if printed_length(cell) is None]
    return [f"length {value!r} is not a token count, null, 'row' or {{column: KEY}}"]


def recipe_problems(recipe, columns: dict[str, int], rows: list) -> list[str]:
    """What is wrong with one column's recipe (None: the column has none); ``columns`` maps keys to indices."""
    if recipe is None:
        return []
    if not isinstance(recipe, dict) or recipe.get("kind") not in RECIPES:
        return [f"recipe {recipe!r} has no known kind"]
    required, optional = RECIPES[recipe["kind"]]
    named = set(recipe) - {"kind"}
    out = [f"recipe {recipe} lacks {sorted(required - named)}"] if required - named else []
    out += [f"recipe {recipe} names {sorted(named - required - optional)}"] if named - required - optional else []
    for (kind, name), allowed in CHOICES.items():
        value = recipe.get(name)  # compared with its type: YAML's true is no 1
        if kind == recipe["kind"] and name in recipe and not any((type(a), a) == (type(value), value) for a in allowed):
            out.append(f"recipe {recipe}: {name} is not one of {sorted(map(str, allowed))}")
    if recipe["kind"] == "lm-eval" and not (type(recipe.get("shots")) is int and recipe["shots"] >= 0):
        out.append(f"recipe {recipe}: shots is not a count")
    if recipe["kind"] == "bench" and recipe.get("op") != "decode" and {"new_tokens", "offload"} & named:
        out.append(f"recipe {recipe}: new_tokens and offload are for op decode")
    for name in LENGTH_FIELDS:
        out += [f"recipe {name}: {p}" for p in _length_problems(recipe.get(name), columns, rows)]
    return out


def column_problems(columns: list, rows: list) -> list[str]:
    out = []
    keys = [c.get("key") if isinstance(c, dict) else None for c in columns]
    if len(set(keys)) != len(keys):
        out.append(f"column keys repeat: {keys}")
    index = {k: j for j, k in enumerate(keys)}
    for c in columns:
        if not isinstance(c, dict) or set(c) != COLUMN_FIELDS:
            out.append(f"column {c.get('key') if isinstance(c, dict) else c!r} has fields "
                       f"{sorted(c) if isinstance(c, dict) else '(none)'}, not {sorted(COLUMN_FIELDS)}")  # fmt: skip
            continue
        if not re.fullmatch(r"[a-z0-9_]+", str(c["key"])) or not (isinstance(c["label"], str) and c["label"]):
            out.append(f"column {c['key']!r}: bad key or label")
        if c["better"] not in ("higher", "lower", None) or not isinstance(c["group"], (str, type(None))):
            out.append(f"column {c['key']}: better {c['better']!r}, group {c['group']!r}")
        if not isinstance(c["unit"], (str, type(None))):
            out.append(f"column {c['key']}: unit {c['unit']!r} is not a string or null")
        out += [f"column {c['key']}: {p}" for p in recipe_problems(c["recipe"], index, rows)]
    return out


def uses_row_length(item: dict) -> bool:
    """Whether a recipe of the item takes a token count from each row (``length: row``)."""
    recipes = [c.get("recipe") for c in item["columns"] if isinstance(c, dict)]
    return any(isinstance(r, dict) and r.get(name) == "row" for r in recipes for name in LENGTH_FIELDS)


def row_problems(item: dict, cards: set[str] | None) -> list[str]:
    """The rows' shapes; ``cards``: the model cards a row's ``model`` may name (None: not checked)."""
    out, width = [], len(item["columns"])
    fields = ROW_FIELDS | ROW_OPTIONAL if uses_row_length(item) else ROW_FIELDS
    for r in item["rows"]:
        where = f"row {r.get('label') if isinstance(r, dict) else r!r}"
        if not isinstance(r, dict) or set(r) != fields:
            out.append(f"{where} has fields {sorted(r) if isinstance(r, dict) else '(none)'}, not {sorted(fields)}")
            continue
        values = r["values"]
        if not isinstance(values, list) or len(values) != width:
            out.append(f"{where}: {len(values or [])} values for {width} columns")
            continue
        if any(v is not None and not (isinstance(v, str) and v and v == v.strip()) for v in values):
            out.append(f"{where}: a value is not a non-empty string as printed (quote it)")
        if item["kind"] == "table" and all(v is None for v in values):
            out.append(f"{where}: a table row without a printed cell")
        if r["model"] is not None and cards is not None and r["model"] not in cards:
            out.append(f"{where}: model {r['model']!r} is not a model card")
        if not isinstance(r["label"], str) or not isinstance(r["group"], (str, type(None))):
            out.append(f"{where}: label and group must be strings")
        if not (isinstance(r["scale"], str) and r["scale"]) and not (r["scale"] is None and item["needs"] == "none"):
            out.append(f"{where}: scale must be a string (null only in an item that needs nothing)")
        if "length" in r and r["length"] is not None and not (type(r["length"]) is int and r["length"] > 0):
            out.append(f"{where}: length {r['length']!r} is not a token count or null")
    return out


def id_problems(item: dict, paper: str) -> list[str]:
    """The id is ``<paper>:<kind><N>``, lettered by the number's own letter ("3(b)": 3b) or, for one of several
    parts of an item printed under one caption, by its part's letter (checked across the file by part_problems)."""
    m = re.fullmatch(rf"{re.escape(paper)}:(table|figure)(\d+)([a-z]?)", str(item["id"]))
    n = re.fullmatch(r"(\d+)(?:\(([a-z])\))?", item["number"]) if isinstance(item["number"], str) else None
    if not (m and n and m[1] == item["kind"] and m[2] == n[1] and (n[2] is None or m[3] == n[2])):
        return [f"id {item['id']!r} does not match kind {item['kind']!r} and number {item['number']!r}"]
    return []


def item_problems(item, paper: str, cards: set[str] | None = None) -> list[str]:
    """Everything wrong with one item's shape, as readable lines each naming the item (empty when it is well
    formed); ``cards``: the model card names a row's ``model`` may take (None: not checked)."""
    if not isinstance(item, dict):
        return [f"an item is {type(item).__name__}, not a mapping"]
    if not ITEM_FIELDS <= set(item) <= ITEM_FIELDS | ITEM_OPTIONAL:
        return [f"{item.get('id')}: fields {sorted(item)}, not {sorted(ITEM_FIELDS)} (and optionally "
                f"{sorted(ITEM_OPTIONAL)})"]  # fmt: skip
    if not all(isinstance(item[k], list) for k in ("columns", "rows", "averages", "footnotes")):
        return [f"{item['id']}: columns, rows, averages and footnotes must be lists"]
    out = id_problems(item, paper)
    caption = item["caption"]
    if not (isinstance(caption, str) and len(caption.strip()) >= 15 and caption.count("$") % 2 == 0):
        out.append(f"caption {caption!r}: not a caption, or a $formula$ left open")
    if item["kind"] == "table" and not (item["columns"] and item["rows"]):
        out.append("a table without columns or rows")
    if item["kind"] == "figure" and bool(item["columns"]) != bool(item["rows"]):
        out.append("a figure with columns must have rows (its series), and rows columns (its x values)")
    if item["marks"] not in MARKS or item["needs"] not in NEEDS:
        out.append(f"marks {item['marks']!r}, needs {item['needs']!r}")
    if item["marks"] != "none" and not any(isinstance(c, dict) and c.get("better") for c in item["columns"]):
        out.append(f"marks {item['marks']!r} without a column that has a better side")
    keys = {c.get("key") for c in item["columns"] if isinstance(c, dict)}
    for a in item["averages"]:
        if (
            not isinstance(a, dict)
            or set(a) != {"column", "of", "how"}
            or a["how"] != "mean"
            or not (isinstance(a["of"], list) and {a["column"], *a["of"]} <= keys)
        ):
            out.append(f"average {a} is not a mean of columns the item has")
    if not all(isinstance(f, str) for f in item["footnotes"]):
        out.append("footnotes must be strings")
    for name in ("notes", "row_header"):
        if name in item and not (isinstance(item[name], str) and item[name]):
            out.append(f"{name} {item[name]!r} is not a non-empty string")
    out += column_problems(item["columns"], item["rows"]) + row_problems(item, cards)
    return [f"{item['id']}: {p}" for p in out]


def part_problems(items: list[dict]) -> list[str]:
    """Items sharing an unlettered number are its parts: two or more, lettered a, b, ... in print order."""
    parts: dict[tuple[str, str], list[str]] = {}
    for item in items:
        parts.setdefault((item["kind"], item["number"]), []).append(str(item["id"]))
    out = []
    for (kind, number), ids in parts.items():
        if "(" in number or ids == [ids[0].rstrip("abcdefghijklmnopqrstuvwxyz")]:
            continue
        stem = ids[0].partition(":")[0] + f":{kind}{number}"
        if len(ids) < 2 or ids != [stem + chr(ord("a") + i) for i in range(len(ids))]:
            out.append(f"{kind} {number}: parts {ids} are not lettered a, b, ... in order")
    return out


def file_problems(doc, stem: str) -> list[str]:
    """A whole file: its head (``paper`` its file's stem), unique ids and lettered parts (each item's shape aside)."""
    if not isinstance(doc, dict) or set(doc) != FILE_FIELDS:
        return [f"fields {sorted(doc) if isinstance(doc, dict) else '(none)'}, not {sorted(FILE_FIELDS)}"]
    out = [] if doc["paper"] == stem else [f"paper {doc['paper']!r} is not the file's stem {stem!r}"]
    if not re.fullmatch(r"\d{4}\.\d{4,5}", str(doc["arxiv"])) or not (isinstance(doc["title"], str) and doc["title"]):
        out.append(f"arxiv {doc['arxiv']!r} or title {doc['title']!r} is not an arXiv id or a title")
    if not isinstance(doc["items"], list):
        return [*out, "items must be a list"]
    ids = [i.get("id") for i in doc["items"] if isinstance(i, dict)]
    if len(ids) != len(set(ids)):
        out.append(f"duplicate item id(s) {', '.join(sorted({str(i) for i in ids if ids.count(i) > 1}))}")
    return out


def suite_recipe_problems(item: dict) -> list[str]:
    """LongBench datasets and MQAR preset cells that this suite's task specs (``tasks/*.yaml``) have."""
    out = []
    for c in item["columns"]:
        r = c["recipe"] or {}
        if r.get("kind") == "longbench":
            longbench = read_yaml(builtin_dir("tasks") / "longbench.yaml", "longbench task spec")["tasks"]
            if r["dataset"] not in longbench:
                out.append(f"{item['id']} {c['key']}: LongBench has no {r['dataset']!r}")
        if r.get("kind") == "mqar":
            p = task_presets("mqar").get(r["preset"], {})
            if any(r.get(name) not in p.get(values, [None]) for name, values in MQAR_CELL.items()):
                out.append(f"{item['id']} {c['key']}: preset {r['preset']!r} has no cell {r}")
    return out
