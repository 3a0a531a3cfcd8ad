"""The papers' figures from our runs, in their styles, through the report's plotting functions.

* per-token loss L(i) and P(l) with the training length marked (FoX Figure 2):
  :func:`evalsuite.report.plots.plot_loss`;
* NIAH heatmaps, needle depth against context length, red to green (FoX Figure 4):
  :func:`evalsuite.report.niah.plot_niah`;
* MQAR accuracy against model width, best over learning rates (GSA Figure 3(a)):
  :func:`evalsuite.report.mqar.plot_accuracy_vs_dmodel`, from the run directories' or the committed MQAR records;
* kernel time against sequence length, one line per implementation, forward and forward+backward panels (the
  Lightning Attention paper's Figure 4): :func:`speed_figure`, from ``evalsuite bench attention`` / ``bench linear``
  records.

A figure's style comes from its columns' recipes, or from :data:`FIGURES` for the figures the papers give no
numbers for (their items have no columns).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from evalsuite.errors import UserError
from evalsuite.papers.found import Results, find
from evalsuite.papers.published import Item

# Figures without columns (the text gives nothing to tabulate): (style, filter).
FIGURES = {
    "fox:figure2": ("loss", {}),
    "fox:figure4": ("niah", {"modes": ["easy", "standard"]}),
    "lightning:figure4": ("speed", {"ops": ["lightning"]}),
}
STYLE_OF_RECIPE = {"loss": "loss", "niah": "niah", "mqar": "mqar", "bench": "speed"}
KERNEL_OPS = {"attention", "linear"}  # bench ops whose records time kernels against the sequence length
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward", "bwd": "backward", "decode": "decode step"}


def style(item: Item) -> tuple[str, dict] | None:
    """(style, filter) of a figure item, or None when it is not one we draw."""
    if item.id in FIGURES:
        return FIGURES[item.id]
    kinds = {c.recipe["kind"] for c in item.columns if c.recipe}
    styles = {STYLE_OF_RECIPE[k] for k in kinds if k in STYLE_OF_RECIPE}
    if len(styles) != 1:
        return None
    found = styles.pop()
    recipes = [c.recipe for c in item.columns if c.recipe]
    if found == "niah":
        return found, {"modes": sorted({r["mode"] for r in recipes})}
    if found == "mqar":
        return found, {"preset": recipes[0]["preset"]}
    if found == "speed":
        ops = sorted({r["op"] for r in recipes})
        return (found, {"ops": ops}) if set(ops) <= KERNEL_OPS else None
    return found, {}


def _runs_of(results: Results, task: str, models: list[str], keep=lambda config: True) -> list[Path]:
    """Per model, its run of ``task`` with the most records (then the newest) that ``keep`` accepts."""
    out = []
    for model in models:
        runs = [r for r in results.of(task, model) if keep(r.get("config") or {})]
        if runs:
            out.append(Path(max(runs, key=lambda r: (len(r.get("records", [])), r["mtime"]))["run_dir"]))
    return out


def mqar_figure(item: Item, models: list[str], results: Results, preset: str, out_stem: Path) -> list[Path]:
    """Accuracy against d_model for ``models`` at the preset's widths (the item's columns, else the preset's)."""
    import pandas as pd

    from evalsuite.report.mqar import plot_accuracy_vs_dmodel
    from evalsuite.tasks.mqar.sweep import load_preset

    sweep = load_preset(preset)
    (length, kv), *_ = sweep.settings()
    recipes = [c.recipe for c in item.columns if c.recipe and c.recipe["kind"] == "mqar"]
    recipes = recipes or [{"kind": "mqar", "preset": preset, "d_model": d, "length": length, "num_kv_pairs": kv}
                          for d in sweep.d_models]  # fmt: skip
    rows = [{"model": m, "length": r["length"], "num_kv_pairs": r["num_kv_pairs"], "d_model": r["d_model"],
             "accuracy": found.value / 100}
            for m in models for r in recipes if (found := find(results, r, m)) is not None]  # fmt: skip
    if not rows:
        raise UserError(f"{item.id}: no MQAR records of preset {preset} for {', '.join(models) or 'any model'} "
                        f"under {results.root}")  # fmt: skip
    return plot_accuracy_vs_dmodel(pd.DataFrame(rows), out_stem)


def bench_records(root: Path, ops: Iterable[str] | None = None) -> list[dict]:
    """Timing records (with ``ms``) of every ``bench attention`` / ``bench linear`` JSON file under ``root``; an
    attention record's op is ``attention``."""
    ops = set(ops) if ops else None
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".json")):
            try:
                data = json.loads((Path(folder) / name).read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(data, list):
                continue
            for r in data:
                if isinstance(r, dict) and r.get("kind") in ("timing", "op") and "ms" in r and "T" in r:
                    r = {**r, "op": r.get("op", "attention"), "file": str(Path(folder) / name)}
                    if ops is None or r["op"] in ops:
                        out.append(r)
    return out


def speed_figure(records: list[dict], out_stem: Path | str) -> list[Path]:
    """Milliseconds per call against sequence length (log-log), one panel per (op, mode, head dim), one line per
    implementation (provider). PNG + PDF."""
    import numpy as np
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    if not records:
        raise UserError("no kernel timing records to plot")
    panels = sorted({(r["op"], r["mode"], r.get("D")) for r in records}, key=str)
    providers = list(dict.fromkeys(r["provider"] for r in records))
    fig = Figure(figsize=(4.4 * len(panels) + 0.6, 3.8))
    axes = np.atleast_1d(fig.subplots(1, len(panels), squeeze=False)[0])
    for ax, (op, mode, d) in zip(axes, panels, strict=True):
        for k, provider in enumerate(providers):
            rs = sorted((r for r in records if (r["op"], r["mode"], r.get("D"), r["provider"]) == (op, mode, d,
                        provider)), key=lambda r: r["T"])  # fmt: skip
            if rs:
                ax.plot([r["T"] for r in rs], [r["ms"] for r in rs], marker="o", color=f"C{k}", label=provider)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"{op}, {MODE_TITLES.get(mode, mode)}" + (f", head dim {d}" if d else ""))
        ax.set_xlabel("Sequence length")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("Time (ms)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(4, len(labels)),
               frameon=False)  # fmt: skip
    return save_figure(fig, out_stem)


def draw(item: Item, models: list[str], results: Results, out_dir: Path | str) -> list[Path]:
    """The figure ``item`` from the runs of ``models`` under the results folder, as ``<out>/<paper>-<figure>.png``
    (and ``.pdf``); UserError when the results hold nothing to draw it from."""
    found = style(item)
    if found is None:
        raise UserError(f"{item.id} is not a figure this suite draws (its columns name no loss, niah, mqar or bench)")
    kind, filters = found
    stem = Path(out_dir) / item.id.replace(":", "-")
    if kind == "mqar":
        return mqar_figure(item, models, results, filters["preset"], stem)
    if kind == "speed":
        return speed_figure(bench_records(results.root, filters.get("ops")), stem)
    if kind == "loss":
        runs = _runs_of(results, "loss", models)
        if runs:
            from evalsuite.report.plots import plot_loss

            return plot_loss(runs, stem)
    else:
        runs = [
            run
            for mode in filters.get("modes") or [None]
            for run in _runs_of(results, "niah", models, lambda c, mode=mode: mode in (None, c.get("mode")))
        ]
        if runs:
            from evalsuite.report.niah import plot_niah

            return plot_niah(runs, stem)[0]
    raise UserError(f"{item.id}: no {kind} runs of {', '.join(models) or 'any model'} under {results.root} "
                    f"(evalsuite paper run {item.id} --models ...)")  # fmt: skip
