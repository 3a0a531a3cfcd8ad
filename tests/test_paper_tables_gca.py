"""The GCA / DRT paper's published tables as data (evalsuite/papers/data/gca.yaml; Hu et al., arXiv:2410.01651):
every item's shape, and its captions and rows read back out of the paper's text (tests/paper_tables.py)."""

from paper_tables import PaperTableChecks, TextQuirks, load


class TestGcaTables(PaperTableChecks):
    PAPER = "gca"
    SEED = "gca-grouped-cross-attention.txt"
    TABLES, FIGURES = 5, 7
    # Captions follow their tables in this text. Table 1's third row block (rows 16-23) has no header line; Table 4
    # prints one OOM across Block Recurrent TFM's two 3B cells.
    QUIRKS = TextQuirks(
        caption_below=frozenset(f"gca:table{n}" for n in ("1", "2a", "2b", "3", "4", "5")),
        headless=frozenset({("gca:table1", 16)}),
        kept={("gca:table4", 2): ["thr_350m", "mem_350m", "thr_760m", "mem_760m", "thr_1_5b", "mem_1_5b", "thr_3b"]},
    )


def test_the_spanning_oom_is_a_cell_of_each_column_it_spans():
    """Table 4 prints one OOM across Block Recurrent TFM's two 3B cells; the read-back sees one, the data holds two."""
    table4 = next(i for i in load("gca")["items"] if i["id"] == "gca:table4")
    assert table4["rows"][2]["values"][-2:] == ["OOM", "OOM"]
