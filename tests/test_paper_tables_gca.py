"""The GCA / DRT paper's published tables as data (evalsuite/papers/data/gca.yaml; Hu et al., arXiv:2410.01651):
the file's shape, every table and figure of the paper present, and every row read back out of the paper's text."""

import pytest
from paper_tables import ReadBack, caption_mismatches, captions, format_problems, load, numbered, seed_text

DOC = load("gca")
TEXT = seed_text("gca-grouped-cross-attention.txt")
needs_text = pytest.mark.skipif(TEXT is None, reason="the paper's text (shared/seeds/) is not here")

# The paper's numbered tables and figures (its text's "Table N:" / "Figure N:" captions).
NUMBERS = {("table", n) for n in "12345"} | {("figure", n) for n in "1234567"}

# Captions follow their tables in this text. Subscripted labels print as LaTeX ("DRTretrieval×1...{}_{...}
# start_FLOATSUBSCRIPT retrieval × 1 end_FLOATSUBSCRIPT"): their rows are found by the alt text's tail. A label
# spanning two rows prints once (Table 1's W=768 BaseLM, Table 3's 48K rows).
READ = ReadBack(
    side="before",
    parts={"gca:table2a": (r"^Models Retrieval", r"^Models XSum"), "gca:table2b": (r"^Models XSum", None)},
    anchors={
        "RPT_contriever(our impl.)": r"contriever end_FLOATSUBSCRIPT\(our impl\.\)",
        "RPT_Contriever": r"Contriever end_FLOATSUBSCRIPT",
        "RPT_Our_impl": r"Our_impl end_FLOATSUBSCRIPT",
        "Transformer_SW": r"SW end_FLOATSUBSCRIPT",
        "Transformer_full_attn": r"full_attn end_FLOATSUBSCRIPT",
        "DRT_retrieval×1": r"retrieval × 1 end_FLOATSUBSCRIPT",
        "DRT_retrieval×2": r"retrieval × 2 end_FLOATSUBSCRIPT",
        "DRT_retrieval×1 / Base LM": r"retrieval × 1 end_FLOATSUBSCRIPT / Base LM",
    },
    lines={
        **{("gca:table1", 8 * block + 1): (r"^(?=1\.03×)", block) for block in range(3)},
        **{("gca:table3", 2 * model + 1): (r"^(?=48K )", model) for model in range(3)},
    },
    # Block Recurrent TFM at 3B prints one OOM spanning its two cells.
    kept={("gca:table4", 2): ["thr_350m", "mem_350m", "thr_760m", "mem_760m", "thr_1_5b", "mem_1_5b", "thr_3b"]},
)


def test_the_file_has_the_format_of_docs_paper_tables():
    assert format_problems(DOC, "gca") == []


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


def test_the_spanning_oom_is_a_cell_of_each_column_it_spans():
    """Table 4 prints one OOM across Block Recurrent TFM's two 3B cells; the read-back sees one, the data holds two."""
    table4 = next(i for i in DOC["items"] if i["id"] == "gca:table4")
    assert table4["rows"][2]["values"][-2:] == ["OOM", "OOM"]
