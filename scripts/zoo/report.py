"""Tables and plots of the zoo's training runs (results/zoo/) and its claims report (results/claims/).

    python scripts/zoo/report.py            # writes results/zoo/training_curves.png, prints the tables

The claims table of results/claims/README.md is `evalsuite paper claims --format md`; tests/test_claims.py checks
that it and every number in it match the committed records.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from evalsuite.papers.claims import loss_bins  # noqa: E402
from evalsuite.report.palette import display_name, model_color  # noqa: E402

RESULTS = Path(__file__).resolve().parents[2] / "results"


def runs() -> dict[str, list[dict]]:
    """``{model: [train.json of seed 0, seed 1, ...]}`` of results/zoo/runs/."""
    out: dict[str, list[dict]] = {}
    for path in sorted((RESULTS / "zoo" / "runs").glob("*-seed*/train.json")):
        model = path.parent.name.rsplit("-seed", 1)[0]
        out.setdefault(model, []).append(json.loads(path.read_text()))
    return out


def training_curves(by_model: dict[str, list[dict]], path: Path) -> None:
    """Held-out loss against training bytes, each model in its colour of every figure, seed 0 solid and seed 1
    dashed."""
    fig, ax = plt.subplots(figsize=(8, 5))
    for model, seeds in by_model.items():
        for seed, run in enumerate(seeds):
            tokens = run["config"]["batch_size"] * run["config"]["seq_len"]
            points = [(h["step"] * tokens / 1e6, h["eval_loss"]) for h in run["history"] if "eval_loss" in h]
            ax.plot(*zip(*points, strict=True), color=model_color(model), ls="-" if seed == 0 else "--",
                    label=display_name(model).removesuffix(", zoo") if seed == 0 else None)  # fmt: skip
    ax.set(xlabel="training bytes (millions)", ylabel="held-out loss (nats/byte)", ylim=(1.2, 1.9),
           title="The zoo: held-out loss while training (seed 0 solid, seed 1 dashed)")  # fmt: skip
    ax.legend(ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main() -> None:
    by_model = runs()
    training_curves(by_model, RESULTS / "zoo" / "training_curves.png")
    print("| model | parameters | held-out loss, seed 0 / 1 | training time (s), seed 0 / 1 |")
    print("|---|---:|---|---|")
    for model, seeds in by_model.items():
        losses = " / ".join(f"{r['final_eval']['loss']:.4f}" for r in seeds)
        times = " / ".join(f"{r['seconds']:.0f}" for r in seeds)
        print(f"| {model} | {seeds[0]['params'] / 1e6:.2f}M | {losses} | {times} |")
    print("\n| model | L(i), i in [1, 512): seed 0 / 1 | i in [8192, 16384): seed 0 / 1 |\n|---|---|---|")
    for model in by_model:
        bins = [loss_bins(RESULTS / "claims" / "loss" / f"{model}-seed{s}") for s in range(len(by_model[model]))]
        print(f"| {model} | {' / '.join(f'{b[0]:.3f}' for b in bins)} | {' / '.join(f'{b[1]:.3f}' for b in bins)} |")


if __name__ == "__main__":
    main()
