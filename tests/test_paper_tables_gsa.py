"""The GSA paper's published tables as data (evalsuite/papers/data/gsa.yaml, arXiv:2409.07146): every item's
shape, and its captions and cells read back out of the paper's text (tests/paper_tables.py)."""

from paper_tables import PaperTableChecks, load


class TestGsaTables(PaperTableChecks):
    PAPER = "gsa"
    SEED = "gsa-gated-slot-attention.txt"
    TABLES, FIGURES = 4, 5


def _column(item_id: str, key: str) -> dict[str, float]:
    """``{row label (with its group): value}`` of one numeric column."""
    item = next(i for i in load("gsa")["items"] if i["id"] == item_id)
    j = [c["key"] for c in item["columns"]].index(key)
    return {f"{r['group']}: {r['label']}": float(r["values"][j]) for r in item["rows"]}


def test_figure4b_bars_read_so_that_recomputation_saves_memory():
    """The text gives Figure 4(b)'s bars as Y1..Y5 beside the five labels; reading Yk as the k-th label is the order
    in which recomputing the hidden states lowers GSA's training memory, as Section 4.1.4 says it does."""
    memory = _column("gsa:figure4b", "memory")
    assert memory["None: GSA"] < memory["None: GSA w/o recomp."]


def test_table3b_averages_rank_as_the_prose_says():
    """Section 4.1.2 on "Table 3(b)": Xfmr++ has the best average, and GSA beats every other subquadratic model,
    at both sizes."""
    avg = _column("gsa:table3b", "avg")
    for size in ("1.3B params / 100B tokens, L=24, d=2048", "2.7B params / 100B tokens, L=32, d=2560"):
        scores = {label.split(": ")[1]: v for label, v in avg.items() if label.startswith(size)}
        assert max(scores, key=scores.get) == "Xfmr++"
        assert max((m for m in scores if m != "Xfmr++"), key=scores.get) == "GSA"
