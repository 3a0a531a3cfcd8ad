"""The papers' figures from our runs, in their styles, through the report's plotting functions.

* per-token loss L(i) and P(l) with the training length marked (FoX Figure 2):
  :func:`evalsuite.report.plots.plot_loss`;
* NIAH heatmaps, needle depth against context length, red to green (FoX Figure 4):
  :func:`evalsuite.report.niah.plot_niah`;
* MQAR accuracy against model width, best over learning rates (GSA Figure 3(a)):
  :func:`evalsuite.report.mqar.plot_accuracy_vs_dmodel`, from the run directories' or the committed MQAR records;
* kernel time against sequence length, one line per implementation, a panel per (op, mode, head dim):
  :func:`speed_figure`, from ``evalsuite bench attention`` / ``bench linear`` records;
* the Lightning Attention paper's Figure 4 (forward ms, backward ms, forward GB, backward GB against sequence length
  for Lightning, Vanilla and Flash2): :func:`speed_memory_figure`, from one ``bench linear`` run of
  :data:`~evalsuite.papers.recipes.BENCH_COMMANDS` ``["lightning:figure4"]`` (:func:`figure4_records`), with the
  paper's §5.1 claims checked on it (:func:`figure_notes`,
  :func:`evalsuite.bench.lightning_claims.check_claims`);
* the speed figures of :data:`evalsuite.papers.speed_figures.SPEED_FIGURES` (Lightning Figures 1(a), 5 and 7, GCA
  Figure 3(a)), each from its bench command's records, with the text's claims about it checked;
  :func:`bench_source` names the file a figure drawn from bench records is read from.

A figure's style comes from its columns' recipes, or from :data:`FIGURES` for the figures the papers give no
numbers for (their items have no columns).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from evalsuite.bench import lightning_claims as claims
from evalsuite.bench.linear_ops import VANILLA
from evalsuite.errors import UserError
from evalsuite.papers import speed_figures
from evalsuite.papers.found import Results, find
from evalsuite.papers.published import Item
from evalsuite.papers.recipes import BENCH_COMMANDS

# Figures without columns (the text gives nothing to tabulate): (style, filter).
FIGURES = {
    "fox:figure2": ("loss", {}),
    "fox:figure4": ("niah", {"modes": ["easy", "standard"]}),
    "lightning:figure4": ("speed_memory", {}),
}
STYLE_OF_RECIPE = {"loss": "loss", "niah": "niah", "mqar": "mqar", "bench": "speed"}
KERNEL_OPS = {"attention", "linear"}  # bench ops whose records time kernels against the sequence length
MODE_TITLES = {"fwd": "forward", "fwdbwd": "forward + backward", "bwd": "backward", "decode": "decode step"}


def style(item: Item) -> tuple[str, dict] | None:
    """(style, filter) of a figure item, or None when it is not one we draw."""
    if item.id in FIGURES:
        return FIGURES[item.id]
    if item.id in speed_figures.SPEED_FIGURES:
        return "speed_claims", {}
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
        ops = sorted({r["op"] for r in recipes if r["kind"] == "bench"})  # beside card columns (FoX Table 6)
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


def _bench_files(root: Path) -> list[tuple[Path, list[dict]]]:
    """``(path, timing records)`` of every JSON file under ``root`` holding kernel timings: ``bench attention``'s (a
    list of records; their op is ``attention``) and ``bench linear``'s (``{"records": [...]}``), every status."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(f for f in files if f.endswith(".json")):
            path = Path(folder) / name
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            data = data.get("records") if isinstance(data, dict) else data
            if not isinstance(data, list):
                continue
            found = [{**r, "op": r.get("op", "attention"), "file": str(path)} for r in data
                     if isinstance(r, dict) and r.get("kind") in ("timing", "op") and "T" in r]  # fmt: skip
            if found:
                out.append((path, found))
    return out


def bench_records(root: Path, ops: Iterable[str] | None = None) -> list[dict]:
    """Timing records (with ``ms``) of every ``bench attention`` / ``bench linear`` JSON file under ``root``; an
    attention record's op is ``attention``."""
    ops = set(ops) if ops else None
    return [r for _, records in _bench_files(root) for r in records if "ms" in r and (ops is None or r["op"] in ops)]


def figure4_records(root: Path) -> list[dict]:
    """The records of the newest ``bench linear`` file under ``root`` that times Vanilla or Lightning's backward alone
    (a run of ``BENCH_COMMANDS["lightning:figure4"]``), every status; UserError when there is none."""
    runs = [(path, records) for path, records in _bench_files(root)
            if any(r.get("provider") == VANILLA or (r["op"] == "lightning" and r.get("mode") == "bwd")
                   for r in records)]  # fmt: skip
    if not runs:
        raise UserError(f"no Lightning Figure 4 records under {root}: run {BENCH_COMMANDS['lightning:figure4']}")
    return max(runs, key=lambda run: run[0].stat().st_mtime)[1]


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


PANELS = (("fwd", "ms", "Forward pass"), ("bwd", "ms", "Backward pass"), ("fwd", "GiB", "Forward memory"),
          ("bwd", "GiB", "Backward memory"))  # fmt: skip


def speed_memory_figure(records: list[dict], out_stem: Path | str) -> list[Path]:
    """The Lightning paper's Figure 4 layout: forward ms, backward ms, forward GiB, backward GiB against sequence
    length (log-log), a line per series (:func:`evalsuite.bench.lightning_claims.figure4_series`), the length where
    a series ran out of memory in its label. PNG + PDF."""
    from matplotlib.figure import Figure

    from evalsuite.report.plots import save_figure

    series = claims.figure4_series(records)
    if not series:
        raise UserError("no Lightning, Vanilla or Flash2 records of the fwd / bwd modes to plot")
    fig = Figure(figsize=(18, 4.2), layout="constrained")
    for ax, (mode, unit, title) in zip(fig.subplots(1, len(PANELS)), PANELS, strict=True):
        for k, s in enumerate(series.values()):
            if unit == "ms":
                pts = [(r["T"], r["ms"]) for r in s[mode] if "ms" in r]
            else:
                pts = [(r["T"], claims.memory_mib(r) / 1024) for r in s[mode] if claims.memory_mib(r) is not None]
            oom = [r["T"] for r in s[mode] if r.get("status", "").startswith("oom")]
            if pts:
                label = s["label"] + (f" (out of memory from {min(oom)})" if oom else "")
                ax.plot(*zip(*pts, strict=True), marker="o", color=f"C{k}", label=label)
        if not ax.lines:
            ax.set(title=title, xticks=[], yticks=[])
            ax.text(0.5, 0.5, "not measured (CUDA runs record memory)", ha="center", transform=ax.transAxes)
            continue
        ax.set(yscale="log", title=title, xlabel="Sequence length", ylabel=unit)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    first = next(r for s in series.values() for mode in claims.MODES for r in s[mode])
    fig.suptitle(f"Lightning Attention, Figure 4: B = {first['B']}, H = {first['H']}, D = {first['D']}, "
                 f"{first['dtype']}, {first.get('device', first.get('device_type', ''))}")  # fmt: skip
    return save_figure(fig, out_stem)


BENCH_STYLES = ("speed_memory", "speed_claims")  # the figures drawn from one bench command's records


def bench_source(item: Item, root: Path) -> str | None:
    """The bench file under ``root`` that a figure of :data:`BENCH_STYLES` is drawn from, None while there is none."""
    try:
        if item.id in speed_figures.SPEED_FIGURES:
            return str(speed_figures.figure_records(item.id, root)[1])
        return figure4_records(root)[0]["file"]
    except UserError:
        return None


def figure_notes(item: Item, results: Results) -> list[str]:
    """Lines for a rendered figure that is measured by a bench command: the command and, where its records are under
    the results folder, the paper's claims against them (the Lightning paper's Figure 4)."""
    kind = (style(item) or ("",))[0]
    if kind == "speed_claims":
        return speed_figures.notes(item.id, results.root)
    if kind != "speed_memory":
        return []
    notes = [f"measured by: {BENCH_COMMANDS[item.id]} (Flash2: PyTorch SDPA causal on its FlashAttention-2 backend, "
             "a stand-in; memory beyond the inputs)"]  # fmt: skip
    try:
        records = figure4_records(results.root)
    except UserError:
        return [*notes, f"no records of that command under {results.root} yet"]
    notes.append(f"our records: {records[0]['file']}")
    notes += [f"claim (§5.1) \"{c['claim']}\": ours {c['ours']}: {claims.verdict(c['agrees'])}"
              for c in claims.check_claims(records)]  # fmt: skip
    return notes


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
    if kind == "speed_memory":
        return speed_memory_figure(figure4_records(results.root), stem)
    if kind == "speed_claims":
        return speed_figures.draw(item.id, results.root, stem)
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
