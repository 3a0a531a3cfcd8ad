"""The seed papers' long-context claims tested at small scale (``evalsuite/papers/data/claims.yaml``).

Each claim carries the paper's statement (cited), the experiment that tests it here, the measured result, a
verdict and the evidence's paths under ``results/``. Its ``numbers`` are the measurements the verdict rests on,
in a form :func:`measure` recomputes from the committed records, so the report cannot drift from them:

* ``loss_bins``: ``{model: [[within, beyond], ...] per seed}``, the mean per-token loss over positions
  :data:`WITHIN` (inside the 512-byte training context) and :data:`BEYOND` (16-32x) of
  ``results/claims/loss/<model>-seed<s>/loss_per_token.npz``;
* ``held_out``: ``{model: [loss, ...] per seed}``, the final held-out loss of
  ``results/zoo/runs/<model>-seed<s>/train.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalsuite.resources import read_yaml

CLAIMS_FILE = Path(__file__).resolve().parent / "data" / "claims.yaml"
WITHIN = (1, 512)  # position 0 is the first token after BOS: no context at all
BEYOND = (8192, 16384)
VERDICTS = ("reproduced", "reproduced at small scale", "partly reproduced", "not reproduced",
            "not testable at this scale")  # fmt: skip


@dataclass(frozen=True)
class Claim:
    id: str
    paper: str
    source: str
    statement: str
    experiment: str
    result: str
    verdict: str
    evidence: tuple[str, ...]
    why: str = ""
    numbers: dict = field(default_factory=dict)


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """Every claim of ``path``, in order."""
    claims = []
    for raw in read_yaml(path, "claims file")["claims"]:
        claims.append(Claim(**{**raw, "evidence": tuple(raw["evidence"])}))
    return claims


def loss_bins(run_dir: Path, bins=(WITHIN, BEYOND)) -> list[float]:
    """Mean per-token loss of a loss run over each ``[start, stop)`` position range of ``bins``."""
    with np.load(Path(run_dir) / "loss_per_token.npz") as curve:
        loss = curve["loss_per_token"]
    return [float(loss[a:b].mean()) for a, b in bins]


def measure(kind: str, model: str, seed: int, results: Path) -> float | list[float]:
    """The committed measurement ``kind`` (``loss_bins`` or ``held_out``) of ``model``'s seed ``seed``."""
    if kind == "loss_bins":
        return loss_bins(results / "claims" / "loss" / f"{model}-seed{seed}")
    if kind == "held_out":
        train = json.loads((results / "zoo" / "runs" / f"{model}-seed{seed}" / "train.json").read_text())
        return float(train["final_eval"]["loss"])
    raise ValueError(f"unknown measurement {kind!r}")


def render_markdown(claims: list[Claim]) -> str:
    """The claims as a Markdown table (claim, paper's statement, result, verdict), then each one's details."""
    lines = ["| claim | the paper says | measured here | verdict |", "|---|---|---|---|"]
    for c in claims:
        lines.append(f"| `{c.id}` | {c.statement} ({c.source}) | {c.result} | **{c.verdict}** |")
    for c in claims:
        lines += ["", f"### `{c.id}` ({c.paper})", "", f"- **Paper**: {c.statement} ({c.source})",
                  f"- **Experiment**: {c.experiment}", f"- **Result**: {c.result}",
                  f"- **Verdict**: {c.verdict}" + (f". {c.why}" if c.why else ""),
                  "- **Evidence**: " + ", ".join(f"`{e}`" for e in c.evidence)]  # fmt: skip
    return "\n".join(lines) + "\n"


def render_text(claims: list[Claim]) -> str:
    """One block per claim for a terminal."""
    blocks = []
    for c in claims:
        blocks.append(f"{c.id} [{c.verdict}]\n  paper: {c.statement} ({c.source})\n  here:  {c.result}"
                      + (f"\n  why:   {c.why}" if c.why else ""))  # fmt: skip
    return "\n\n".join(blocks) + "\n"
