"""The Lightning Attention / TransNormerLLM paper's published tables as data (evalsuite/papers/data/lightning.yaml;
Qin et al., arXiv:2405.17381): the file's shape, every table and figure of the paper present, and every row read
back out of the paper's text."""

import pytest
from paper_tables import ReadBack, caption_mismatches, captions, format_problems, load, numbered, seed_text

DOC = load("lightning")
TEXT = seed_text("lightning-attention-tnl.txt")
needs_text = pytest.mark.skipif(TEXT is None, reason="the paper's text (shared/seeds/) is not here")

NUMBERS = {("table", str(n)) for n in range(1, 12)} | {("figure", str(n)) for n in range(1, 8)}

BAICHUAN1 = 13  # Table 2's row the text lost but for "59 42.30 42.80" (its MMLU and C-Eval)

# Captions precede their tables in this text. Table 9 prints two tabulars side by side, one after the other here.
READ = ReadBack(
    side="after",
    parts={
        "lightning:table9a": (r"^Dataset Epochs", r"^\s*Language\s"),
        "lightning:table9b": (r"^\s*Language\s", None),
    },
    lines={("lightning:table2", BAICHUAN1): (r"^59 ", 0)},
    kept={("lightning:table2", BAICHUAN1): ["mmlu", "c_eval"]},
)


def test_the_file_has_the_format_of_docs_paper_tables():
    assert format_problems(DOC, "lightning") == []


def test_every_table_and_figure_of_the_paper_is_an_item():
    assert set(numbered(DOC)) == NUMBERS


@needs_text
def test_the_papers_captions_are_the_items_in_the_papers_order():
    assert list(captions(TEXT)) == numbered(DOC)
    assert caption_mismatches(TEXT, DOC) == []


@needs_text
@pytest.mark.parametrize("item", [i for i in DOC["items"] if i["rows"]], ids=lambda i: i["id"])
def test_every_row_reads_back_out_of_the_papers_text(item):
    assert READ.mismatches(TEXT, item) == []


def test_the_tnl_card_marks_the_tnl_385m_rows_which_are_one_run():
    """The tnl card is TNL-385M's shape: Table 2's 0.39B row and the default row of Tables 3-8, 10 and 11, which
    are one run (Loss 2.248, PPL 4.770) in every table that repeats it."""
    rows = [(item["id"], row) for item in DOC["items"] for row in item["rows"] if row["model"] == "tnl"]
    assert [i for i, _ in rows] == [f"lightning:table{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 11)]
    assert {tuple(r["values"][-2:]) for i, r in rows if i != "lightning:table2"} == {("2.248", "4.770")}
