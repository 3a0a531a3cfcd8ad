"""The Lightning Attention / TransNormerLLM paper's published tables as data (evalsuite/papers/data/lightning.yaml;
Qin et al., arXiv:2405.17381): every item's shape, and its captions and rows read back out of the paper's text
(tests/paper_tables.py)."""

from paper_tables import PaperTableChecks, TextQuirks, load

BAICHUAN1 = 13  # Table 2's row the text lost but for "59 42.30 42.80" (its MMLU and C-Eval)


class TestLightningTables(PaperTableChecks):
    PAPER = "lightning"
    SEED = "lightning-attention-tnl.txt"
    TABLES, FIGURES = 11, 7
    QUIRKS = TextQuirks(
        unlabelled={("lightning:table2", BAICHUAN1): r"^59 "},
        kept={("lightning:table2", BAICHUAN1): ["mmlu", "c_eval"]},
    )


def test_the_tnl_card_marks_the_tnl_385m_rows_which_are_one_run():
    """The tnl card is TNL-385M's shape: Table 2's 0.39B row and the default row of Tables 3-8, 10 and 11, which
    are one run (Loss 2.248, PPL 4.770) in every table that repeats it."""
    rows = [(item["id"], row) for item in load("lightning")["items"] for row in item["rows"] if row["model"] == "tnl"]
    assert [i for i, _ in rows] == [f"lightning:table{n}" for n in (2, 3, 4, 5, 6, 7, 8, 10, 11)]
    assert {tuple(r["values"][-2:]) for i, r in rows if i != "lightning:table2"} == {("2.248", "4.770")}
