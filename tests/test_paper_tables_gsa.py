"""The GSA paper's published tables as data (evalsuite/papers/data/gsa.yaml, arXiv:2409.07146): every item's
shape, and its captions and cells read back out of the paper's text (tests/paper_tables.py)."""

from paper_tables import PaperTableChecks, load


class TestGsaTables(PaperTableChecks):
    PAPER = "gsa"
    SEED = "gsa-gated-slot-attention.txt"


def test_recall_table_is_part_b_of_figure_3_beside_the_mqar_plot():
    """The prose calls the recall table "Table 3(b)" and the MQAR plot "Table 3(a)"; both are parts of the paper's
    Figure 3, apart from its Table 3 (the 7B models)."""
    items = {i["id"]: i for i in load("gsa")["items"]}
    assert items["gsa:table3b"]["number"] == "3(b)" and items["gsa:figure3a"]["number"] == "3(a)"
    assert items["gsa:table3"]["rows"][0]["values"][:2] == ["7B", "1.4T"]
