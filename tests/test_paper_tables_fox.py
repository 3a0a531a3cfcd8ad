"""The FoX paper's published tables as data (evalsuite/papers/data/fox.yaml, arXiv:2503.02130): every item's
shape, and its captions and cells read back out of the paper's text (tests/paper_tables.py)."""

import re
from itertools import pairwise

from paper_tables import PaperTableChecks, TextQuirks, load

COMPONENTS = {  # Table 3's column keys by the names its row labels use
    "RoPE": "rope",
    "forget gate": "forget_gate",
    "QK-norm": "qk_norm",
    "output gate": "output_gate",
    "output norm": "output_norm",
    "KV-shift": "kv_shift",
}


class TestFoxTables(PaperTableChecks):
    PAPER = "fox"
    SEED = "fox-forgetting-transformer.txt"
    TABLES, FIGURES = 9, 28
    # The appendix's hyperparameter, learning-rate and FLOPs tables print their captions below the rows.
    QUIRKS = TextQuirks(caption_below=frozenset({"fox:table4", "fox:table5", "fox:table6"}))


def _ticked(row: dict, keys: list[str]) -> set[str]:
    return {k for k, v in zip(keys, row["values"], strict=True) if v == "✓"}


def test_table3_ticks_follow_the_row_labels():
    """The ✓ matrix of Table 3 is lost in the text (taken from the paper's HTML): each bottom-half row is FoX (Pro)
    with the components its label adds (+) or removes (-); each unnamed top-half row adds one component to the
    row above it, the first (FoX (LLaMA) + RoPE) RoPE to FoX (LLaMA)."""
    table = next(i for i in load("fox")["items"] if i["id"] == "fox:table3")
    keys = [c["key"] for c in table["columns"]]
    rows = {r["label"]: r for r in table["rows"] if r["label"]}
    pro = _ticked(rows["FoX (Pro)"], keys)
    assert pro == set(keys[1:6])
    assert _ticked(rows["Transformer (LLaMA)"], keys) == {"rope"}
    assert _ticked(rows["FoX (LLaMA)"], keys) == {"forget_gate"}
    for label, row in rows.items():
        changes = re.findall(r"([+-]) (RoPE|forget gate|QK-norm|output gate|output norm|KV-shift)", label)
        if label.startswith(("+", "-")):
            expected = set(pro)
            for sign, name in changes:
                (expected.add if sign == "+" else expected.discard)(COMPONENTS[name])
            assert _ticked(row, keys) == expected, label
    ordered = table["rows"]
    for above, row in pairwise(ordered):
        if row["label"] == "":
            grown = _ticked(row, keys) - _ticked(above, keys)
            assert len(grown) == 1 and _ticked(above, keys) - _ticked(row, keys) <= {"rope"}, ordered.index(row)
