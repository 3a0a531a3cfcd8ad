"""The claims report (evalsuite/papers/data/claims.yaml, results/claims/): every number it states comes from the
committed records, and a claim's evaluation runs on the shipped zoo models."""

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import assert_one_line_error

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.papers.claims import VERDICTS, load_claims, loss_bins, measure, render_markdown, render_text
from evalsuite.tasks.loss import LossConfig, LossTask
from evalsuite.tasks.runner import run_task

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"


def test_claims_cover_the_four_papers_with_verdicts_and_evidence():
    claims = load_claims()
    assert len(claims) >= 8 and len({c.id for c in claims}) == len(claims)
    assert {c.paper for c in claims} == {"fox", "gsa", "gca", "lightning"}
    for c in claims:
        assert c.verdict in VERDICTS, c.id
        assert c.statement and c.experiment and c.result and "arXiv:" in c.source, c.id
        assert all((ROOT / path).exists() for path in c.evidence), c.id


@pytest.mark.parametrize("claim", [c for c in load_claims() if c.numbers], ids=lambda c: c.id)
def test_claim_numbers_are_the_committed_records(claim):
    for kind, by_model in claim.numbers.items():
        for model, per_seed in by_model.items():
            for seed, stated in enumerate(per_seed):
                assert measure(kind, model, seed, RESULTS) == pytest.approx(stated, abs=6e-4), (kind, model, seed)


def test_results_readme_is_the_rendered_claims():
    assert render_markdown(load_claims()) in (RESULTS / "claims" / "README.md").read_text()


def _loss_run(model: str, out: Path) -> list[float]:
    adapter = NativeAdapter(load_card(model), device="cpu", dtype="float32")
    results = run_task(LossTask(LossConfig(data="books", length=1024, max_docs=2)), adapter, out, progress=False)
    return loss_bins(Path(results["run_dir"]), bins=((1, 512), (512, 1024)))


def test_fox_flat_beyond_training_on_the_shipped_zoo(tmp_path):
    """fox-flat-beyond-training at 2x on the built-in books: the shipped weights, loader and loss task together."""
    fox_within, fox_beyond = _loss_run("zoo-fox-pro", tmp_path / "fox")
    rope_within, rope_beyond = _loss_run("zoo-transformer-llama", tmp_path / "rope")
    assert fox_within < 2.0 and rope_within < 2.0  # trained weights: far below ln 258 = 5.55
    assert fox_beyond < fox_within  # FoX keeps improving past its 512-byte training context
    assert rope_beyond > rope_within + 0.5  # the RoPE Transformer falls apart there


def test_paper_claims_prints_the_readmes_table(run_cli, tmp_path):
    """`evalsuite paper claims --format md` (the command in its own process) prints exactly the claims table of
    results/claims/README.md; the default is the terminal's text, one block per claim; another format is refused."""
    md = subprocess.run([sys.executable, "-m", "evalsuite", "paper", "claims", "--format", "md"], capture_output=True,
                        text=True, check=True, timeout=120).stdout  # fmt: skip
    assert md.startswith("| claim | the paper says |") and md == render_markdown(load_claims())
    assert md in (RESULTS / "claims" / "README.md").read_text()
    code, text, err = run_cli(["paper", "claims"], tmp_path)
    assert code == 0 and text == render_text(load_claims()) and text.count("\n\n") == len(load_claims()) - 1, err
    code, _, err = run_cli(["paper", "claims", "--format", "latex"], tmp_path)
    assert_one_line_error(code, err, "--format must be text or md, got 'latex'")
