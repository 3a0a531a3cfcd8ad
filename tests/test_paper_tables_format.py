"""The checks of tests/paper_tables.py against docs/paper-tables.md: the doc's example file passes them, the doc's
recipe table is the fields and values they accept, each rule of the doc fails a file that breaks it, and the
read-back finds a table and its caption in a text rendered as the papers' texts are (these run without the seeds)."""

import copy
import re
from pathlib import Path

import pytest
import yaml
from paper_tables import (
    CHOICES,
    RECIPES,
    TextQuirks,
    caption_mismatch,
    card_names,
    item_problems,
    part_problems,
    table_mismatches,
)

DOC = (Path(__file__).resolve().parent.parent / "docs" / "paper-tables.md").read_text(encoding="utf-8")


def _example() -> dict:
    return yaml.safe_load(re.search(r"```yaml\n(.*?)```", DOC, re.S)[1])


def _recipe_table() -> dict[str, tuple[dict[str, set[str]], dict[str, set[str]]]]:
    """kind -> ({field: the backticked values in its parentheses}, the same of the optional fields)."""
    table = {}
    for kind, required, optional in re.findall(r"^\| `([\w-]+)` \|\s*(.*?)\s*\|\s*(.*?)\s*\|.*\|$", DOC, re.M):
        fields = [
            {name: set(re.findall(r"`([^`]+)`", note or "")) for name, note in
             re.findall(r"`([^`]+)`\s*(?:\(([^()]*)\))?", cell) if re.fullmatch(r"[a-z_]+", name)}
            for cell in (required, optional)
        ]  # fmt: skip
        table[kind] = (fields[0], fields[1])
    return table


def test_the_docs_example_file_passes_the_checks():
    doc = _example()
    assert set(doc) == {"paper", "title", "arxiv", "items"}
    for item in doc["items"]:
        assert item_problems(item, doc["paper"], card_names()) == []


def test_the_docs_recipe_table_is_what_the_checks_accept():
    table = _recipe_table()
    assert set(table) == set(RECIPES)
    for kind, (required, optional) in table.items():
        assert (set(required), set(optional)) == RECIPES[kind], kind
        for (choice_kind, name), allowed in CHOICES.items():
            if choice_kind == kind:
                printed = {str(v).lower() if isinstance(v, bool) else v for v in allowed}  # YAML's true, false
                assert {**required, **optional}.get(name) == printed, (kind, name)


def _item(**changes) -> dict:
    item = copy.deepcopy(_example()["items"][0])
    item.update(changes)
    return item


def _with_recipe(recipe: dict, **column) -> dict:
    item = _item()
    item["columns"][0] = {**item["columns"][0], "recipe": recipe, **column}
    return item


def _row_length(item: dict, length) -> dict:
    item["rows"][0]["length"] = length
    return item


BROKEN = {  # each breaks one rule of the doc; the checks name what is wrong
    "passkey variant named kind": (_with_recipe({"kind": "passkey", "length": 1024}), "lacks ['mode']"),
    "a field the doc does not list": (_with_recipe({"kind": "longbench", "dataset": "qasper", "split": "x"}), "names"),
    "a value the doc does not list": (_with_recipe({"kind": "niah", "mode": "hard", "length": 1024}), "mode"),
    "a printed length for tokens": (_with_recipe({"kind": "niah", "mode": "easy", "length": "16K"}), "token count"),
    "length from the row, rows without": (
        _with_recipe({"kind": "loss", "dataset": "pg19-test", "length": "row", "metric": "ppl"}),
        "has fields",
    ),
    "a row length without a recipe taking it": (_row_length(_item(), 2048), "has fields"),
    "length from a column the item lacks": (
        _with_recipe({"kind": "bench", "op": "decode", "metric": "time", "length": {"column": "prompt"}}),
        "not a token count",
    ),
    "length from a column that prints no length": (
        _with_recipe({"kind": "bench", "op": "decode", "metric": "time", "length": {"column": "qasper"}}),
        "'18.88' is no length",
    ),
    "offload on a train step": (
        _with_recipe({"kind": "bench", "op": "train_step", "metric": "time", "length": 1, "offload": True}),
        "for op decode",
    ),
    "shots not a count": (_with_recipe({"kind": "lm-eval", "task": "piqa", "metric": "acc", "shots": "0"}), "shots"),
    "an id lettered unlike its number": (_item(id="fox:table2b", number="2(a)"), "does not match"),
    "a formula left open": (_item(caption="Results with $L layers of the model."), "left open"),
    "scale null in a measured item": (_item(rows=[{**_item()["rows"][0], "scale": None}]), "scale"),
    "a number not quoted": (_item(rows=[{**_item()["rows"][0], "values": [13.38, "18.88"]}]), "not a non-empty"),
    "a value per column": (_item(rows=[{**_item()["rows"][0], "values": ["13.38"]}]), "values for 2 columns"),
    "marks without a better side": (
        _item(columns=[{**c, "better": None} for c in _item()["columns"]]),
        "without a column that has a better side",
    ),
    "a table without columns": (_item(columns=[], rows=[]), "without columns or rows"),
    "a figure with x values but no series": (_item(kind="figure", id="fox:figure2", rows=[]), "must have rows"),
    "an average of a column the item lacks": (
        _item(averages=[{"column": "avg", "of": ["qasper"], "how": "mean"}]),
        "not a mean",
    ),
}


@pytest.mark.parametrize("broken", BROKEN, ids=list(BROKEN))
def test_each_rule_fails_a_file_that_breaks_it(broken):
    item, message = BROKEN[broken]
    problems = item_problems(item, "fox", card_names())
    assert any(message in p for p in problems), problems


def test_parts_are_lettered_a_b_in_order():
    def items(*ids):
        return [{"id": f"gca:{i}", "kind": "table", "number": "2"} for i in ids]

    assert part_problems(items("table2a", "table2b")) == []
    assert part_problems(items("table2")) == []
    assert part_problems(items("table2a")) and part_problems(items("table2b", "table2a"))
    assert part_problems(items("table2", "table2a"))


# A table as the arXiv HTML-to-text renders print it: formulas in three copies, a subscripted label, a row group's
# header line, a label cell spanning two rows, and prose after the table.
TEXT = """\
Table 1: Throughput of 760760760760M models with L𝐿Litalic_L layers. DRT is ours.
Model Time Throughput Memory
Train length=16K 128M
DRTretrieval×1retrieval1{}_{\\text{retrieval}\\times 1}start_FLOATSUBSCRIPT retrieval × 1 end_FLOATSUBSCRIPT \
1.22×1.22\\times1.22 × 2.91×1052.91superscript1052.91\\times 10^{5}2.91 × 10 start_POSTSUPERSCRIPT 5 \
end_POSTSUPERSCRIPT 50G
1.5×1.5\\times1.5 × 56G
Results.
""".splitlines()


def _text_item() -> dict:
    row = {"label": "DRT_retrieval×1", "group": "Train length=16K", "model": None, "scale": "128M", "source": None}
    return {
        "id": "gca:table1",
        "kind": "table",
        "number": "1",
        "caption": "Throughput of 760M models with $L$ layers. DRT is ours.",
        "columns": [{"key": k} for k in ("time", "throughput", "memory")],
        "rows": [{**row, "values": ["1.22×", "2.91×10⁵", "50G"]}, {**row, "values": ["1.5×", None, "56G"]}],
    }


def test_the_read_back_finds_a_rendered_table_and_its_caption():
    item = _text_item()
    assert table_mismatches(TEXT, item, TextQuirks()) == []
    assert caption_mismatch(TEXT, item) is None


@pytest.mark.parametrize(
    "change, quirks",
    [
        (lambda i: i["rows"][0]["values"].__setitem__(1, "2.91×10⁴"), TextQuirks()),  # a slipped cell
        (lambda i: i["rows"][1]["values"].__setitem__(1, "39G"), TextQuirks()),  # a cell the text lacks
        (lambda i: i["rows"].pop(), TextQuirks()),  # a row left out: the next line is one more row
        (lambda i: i["rows"][0].__setitem__("group", None), TextQuirks()),  # the group header unaccounted for
        (lambda i: i["rows"][1].__setitem__("label", "BaseLM"), TextQuirks()),  # a label the line does not print
        (lambda i: None, TextQuirks(caption_below=frozenset({"gca:table1"}))),  # the caption on the wrong side
    ],
)
def test_the_read_back_fails_a_slip(change, quirks):
    item = _text_item()
    change(item)
    try:
        problems = table_mismatches(TEXT, item, quirks)
    except AssertionError as e:  # the row walk stops at the first row it cannot place
        problems = [str(e)]
    assert problems


@pytest.mark.parametrize("caption", ["Throughput of 760M models with L layers. DRT is ours.", "Throughput of 76M"
                                     " models with $L$ layers. DRT is ours.", "Throughput of 760M models with $L$ "
                                     "layers. DRT is ours"])  # fmt: skip
def test_the_caption_check_fails_a_slip(caption):
    assert caption_mismatch(TEXT, {**_text_item(), "caption": caption}) is not None
