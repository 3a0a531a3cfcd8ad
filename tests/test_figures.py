"""The figures as a paper needs them, checked on the matplotlib objects (not on pixels): one colour per model in every
figure, NIAH panels on a grid without empty slots with readable titles, unit-labelled axes, the training-length line
between columns and a colour bar that names its scale; MQAR lines of equal accuracy apart and unclipped, learning
rates told apart, legends wrapped into columns."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_hex
from matplotlib.image import AxesImage
from matplotlib.lines import Line2D

from evalsuite.report.mqar import load_mqar
from evalsuite.report.mqar_figures import accuracy_vs_dmodel_figure, accuracy_vs_state_figure, training_curves_figure
from evalsuite.report.niah import line_position, load_niah_runs, niah_figure
from evalsuite.report.palette import display_name, legend_columns, model_color, separate
from evalsuite.report.plots import load_loss_runs, loss_figure
from evalsuite.tasks.mqar_summary import best_over_lr

# --- NIAH -------------------------------------------------------------------------------------------------------------


def write_niah_run(run_dir: Path, model: str, architecture: str | None, subtasks=("easy",), tokenizer="gpt2-json",
                   lengths=(512, 1024, 2048, 4096), train_length=2048, metric="score") -> None:  # fmt: skip
    """A finished NIAH run as the task writes its results.json: records per (subtask, length, depth)."""
    records = [{"model": model, "task": "niah", "subtask": s, "length": n, "depth": d, "metric": metric,
                "value": 10.0 if n <= train_length else 1.0, "n": 1}
               for s in subtasks for n in lengths for d in (0, 50, 100)]  # fmt: skip
    card = {"architecture": architecture, "name": model} if architecture else None
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({
        "task": "niah", "model": model, "config": {"mode": subtasks[0]}, "config_hash": "0123456789ab",
        "train_length": train_length, "records": records,
        "provenance": {"tokenizer": tokenizer, "card": card},
    }))  # fmt: skip


def heatmap_axes(fig) -> list:
    """The panels of a NIAH figure: the axes holding an image (colour bars hold none)."""
    return [ax for ax in fig.axes if any(isinstance(a, AxesImage) for a in ax.get_children())]


def test_niah_grid_has_no_empty_slot_and_titles_name_models(tmp_path):
    """Five panels: rows of 3 and 2 (the short row centred), every axes a heatmap or its colour bar; titles carry the
    models' display names and the subtasks, not run directories or hashes; one colour bar names its scale."""
    write_niah_run(tmp_path / "fox-pro-tiny-easy-0123456789ab", "fox-pro-tiny", "fox-pro")
    write_niah_run(tmp_path / "gsa-tiny-easy-0123456789ab", "gsa-tiny", "gsa")
    write_niah_run(tmp_path / "tnl-tiny-easy-0123456789ab", "tnl-tiny", "tnl")
    write_niah_run(tmp_path / "fox-pro-tiny-2hop-0123456789ab", "fox-pro-tiny", "fox-pro", subtasks=("2hop", "1hop"))
    fig = niah_figure(load_niah_runs([tmp_path]))
    panels = heatmap_axes(fig)
    assert len(panels) == 5 and len(fig.axes) == 6  # five heatmaps and one shared colour bar, nothing empty
    rows = sorted({round(ax.get_position().y0, 3) for ax in panels})
    assert len(rows) == 2
    centres = {row: [] for row in rows}
    for ax in panels:
        box = ax.get_position()
        centres[round(box.y0, 3)].append((box.x0 + box.x1) / 2)
    top, bottom = (sorted(centres[r]) for r in (rows[1], rows[0]))
    assert len(top) == 3 and len(bottom) == 2
    assert np.mean(bottom) == pytest.approx(np.mean(top), abs=0.02)  # the short row sits in the middle
    titles = sorted(ax.get_title() for ax in panels)
    assert titles == sorted(["FoX (Pro), tiny\nNIAH, easy", "GSA, tiny\nNIAH, easy", "TNL, tiny\nNIAH, easy",
                             "FoX (Pro), tiny\nNIAH, 2-hop", "FoX (Pro), tiny\nNIAH, 1-hop control"])  # fmt: skip
    colorbar = next(ax for ax in fig.axes if ax not in panels)
    assert colorbar.get_ylabel() == "Score (1–10: 10 = needle stated, 1 = not)"


def test_niah_training_length_line_runs_between_columns(tmp_path):
    """The dashed line separates the columns within the training length (<=) from those beyond: it lies strictly
    between two column centres, so it cuts no column; with every column on one side there is none."""
    write_niah_run(tmp_path / "run", "fox-pro-tiny", "fox-pro", train_length=2048)
    (ax,) = heatmap_axes(niah_figure(load_niah_runs([tmp_path / "run"])))
    (line,) = [line for line in ax.get_lines() if line.get_linestyle() == "--"]
    x = line.get_xdata()[0]
    assert 2 < x < 3 and x == pytest.approx(2.5)  # between the 2048 and 4096 columns (centres 2 and 3)
    assert [t.get_text() for t in ax.get_xticklabels()][2:] == ["2048", "4096"]
    assert line_position([512, 1024, 2048, 4096], 1000) == pytest.approx(0.5)
    assert line_position([512, 1024], 4096) is None and line_position([1024, 2048], 512) is None


def test_niah_x_axis_names_its_unit_and_the_judge_scale(tmp_path):
    """Tokens for a BPE tokenizer, bytes for a byte-level one; the judge's colour bar says so."""
    write_niah_run(tmp_path / "drt", "drt-gutenberg", "drt", subtasks=("passkey-drt",), tokenizer="bytes",
                   metric="accuracy", train_length=1024)  # fmt: skip
    write_niah_run(tmp_path / "fox", "fox-pro-tiny", "fox-pro", metric="judge")
    drt, fox = (heatmap_axes(niah_figure(load_niah_runs([tmp_path / name])))[0] for name in ("drt", "fox"))
    assert drt.get_xlabel().startswith("Context length (bytes)") and "training length 1,024" in drt.get_xlabel()
    assert fox.get_xlabel().startswith("Context length (tokens)")
    assert drt.get_title() == "DRT, Gutenberg\nPasskey (DRT)"
    judged = niah_figure(load_niah_runs([tmp_path / "fox"]))
    assert "LLM judge" in next(ax for ax in judged.axes if ax not in heatmap_axes(judged)).get_ylabel()


# --- MQAR -------------------------------------------------------------------------------------------------------------

SOLVED = ("fox-pro", "fox-pro-timescale-init", "transformer-pro", "transformer-llama")  # all at accuracy 1.0


def write_mqar_run(run_dir: Path, models=SOLVED + ("gsa", "tnl", "fox-llama", "drt"), lrs=(1e-3, 3e-3)) -> None:
    """Cells of ``models`` x 2 widths x ``lrs``; the first four solve every cell (1.0); histories of three evals."""
    run_dir.mkdir(parents=True)
    lines = []
    for model in models:
        for d in (64, 128):
            for lr in lrs:
                value = 1.0 if model in SOLVED else 0.3 + d / 1000 + lr * 10 * (models.index(model) % 3)
                lines.append({"model": model, "architecture": model.split("-timescale")[0], "task": "mqar",
                              "metric": "accuracy", "value": value, "n": 3000, "length": 512, "num_kv_pairs": 64,
                              "d_model": d, "lr": lr, "state_kind": "kv-cache", "state_bytes": 4096 * d, "steps": 3,
                              "config_hash": f"{model}{d}{lr}",
                              "history": [{"step": t, "loss": 8.0 / t, "eval_accuracy": value * t / 3}
                                          for t in (1, 2, 3)]})  # fmt: skip
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def lines_by_label(fig) -> dict:
    """Legend label -> the Line2D objects of the figure's axes carrying it."""
    out: dict = {}
    for ax in fig.axes:
        for line in ax.get_lines():
            out.setdefault(line.get_label(), []).append(line)
    return out


def test_mqar_equal_accuracies_stay_apart_and_unclipped(tmp_path):
    """Four models at accuracy 1.0 at every width: drawn at four different heights, all within 0.02 of 1.0, moved
    sideways by different offsets, and the y axis reaches above the highest marker."""
    write_mqar_run(tmp_path / "run")
    best = best_over_lr(load_mqar([tmp_path / "run"]))
    fig = accuracy_vs_dmodel_figure(best)
    lines = lines_by_label(fig)
    solved = [lines[display_name(m)][0] for m in SOLVED]
    for width in range(2):
        heights = [line.get_ydata()[width] for line in solved]
        assert len(set(heights)) == 4 and all(abs(h - 1.0) <= 0.02 for h in heights)
    shifts = {line.get_transform().transform((64, 1.0))[0] for line in solved}
    assert len(shifts) == 4  # each model's markers sit beside the others', not on them
    ax = fig.axes[0]
    top = max(max(line.get_ydata()) for line in solved)
    assert ax.get_ylim()[1] > 1.0 and ax.get_ylim()[1] >= top + 0.03  # a marker's radius above the highest point
    assert accuracy_vs_state_figure(best).axes[0].get_ylim()[1] > top
    assert separate([1.0, 1.0, 0.5], 0.01, 0.002) == pytest.approx([0.005, -0.005, 0.0])


def test_mqar_model_colour_is_the_same_in_every_figure(tmp_path):
    """FoX (Pro) is the FoX paper's blue in the accuracy plot, the training curves and a loss plot alike."""
    write_mqar_run(tmp_path / "mqar")
    best = best_over_lr(load_mqar([tmp_path / "mqar"]))
    records = [json.loads(line) for line in (tmp_path / "mqar" / "records.jsonl").read_text().splitlines()]
    curves = training_curves_figure(records, best)
    legend = curves.legends[0]
    by_label = dict(zip([t.get_text() for t in legend.get_texts()], legend.legend_handles, strict=True))
    accuracy = lines_by_label(accuracy_vs_dmodel_figure(best))
    for model in ("fox-pro", "gsa", "drt"):
        color = to_hex(accuracy[display_name(model)][0].get_color())
        assert color == to_hex(by_label[display_name(model)].get_color()) == model_color(model)
        assert isinstance(by_label[display_name(model)], Line2D)
    run = tmp_path / "loss"
    run.mkdir()
    np.savez(run / "loss_per_token.npz", loss_per_token=np.full(64, 3.0), count=np.ones(64, dtype=np.int64))
    (run / "results.json").write_text(json.dumps({"task": "loss", "model": "fox-pro-tiny", "train_length": 16}))
    loss = loss_figure(load_loss_runs([run]))
    assert to_hex(loss.axes[0].get_lines()[0].get_color()) == model_color("fox-pro") == to_hex("C0")
    assert loss.axes[0].get_xlabel() == "Position $i$ (tokens)"  # the loss plot names its unit too
    assert [t.get_text() for t in loss.legends[0].get_texts()] == ["FoX (Pro), tiny", "training length"]


def test_mqar_training_curves_tell_learning_rates_apart_and_wrap_the_legend(tmp_path):
    """Sixteen cells (8 models, 2 learning rates): one legend entry per model and per learning rate, in several
    columns that fit the figure's width; a model's two learning rates differ in line style."""
    write_mqar_run(tmp_path / "run")
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    frame = load_mqar([tmp_path / "run"])
    best = best_over_lr(frame)
    best.loc[best["d_model"] == 128, "lr"] = 3e-3  # the other learning rate won at d = 128
    fig = training_curves_figure(records, best)
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert len(labels) == 8 + 2 and "lr 0.001" in labels and "lr 0.003" in labels
    fig.savefig(io.BytesIO(), format="png", dpi=100)  # lays the legend out
    columns = {round(t.get_window_extent().x0) for t in legend.get_texts()}
    assert 1 < len(columns) < len(labels) and len(columns) == legend_columns(labels, fig.get_figwidth())
    assert legend.get_window_extent().width <= fig.bbox.width  # no canvas grown for a one-row legend
    fox = [line for ax in fig.axes[:1] + fig.axes[1:2] for line in ax.get_lines()
           if to_hex(line.get_color()) == model_color("fox-pro") and line.get_marker() == "o"]  # fmt: skip
    assert len({line.get_linestyle() for line in fox}) == 2  # lr 1e-3 at d = 64, 3e-3 at d = 128


@pytest.mark.parametrize(
    "model, architecture, shown",
    [
        ("fox-pro", None, "FoX (Pro)"),
        ("fox-pro-tiny", None, "FoX (Pro), tiny"),
        ("zoo-transformer-llama", "transformer-llama", "Transformer (LLaMA), zoo"),
        ("fox-llama-timescale-init [clip-1.0]", None, "FoX (LLaMA), time-scale init [clip-1.0]"),
        ("my-card", "gsa", "my-card"),  # a card named otherwise keeps its name (and takes its family's colour)
        ("foxy", None, "foxy"),
        ("SmolLM2-135M-Instruct.Q4_1", None, "SmolLM2-135M-Instruct.Q4_1"),
    ],
)
def test_display_names(model, architecture, shown):
    assert display_name(model, architecture) == shown


def test_legend_columns_fit_the_width():
    labels = [f"model number {i} (lr 0.001)" for i in range(16)]
    assert legend_columns(labels, 33.0) > legend_columns(labels, 17.4) > 1
    assert legend_columns(labels, 17.4) < 16 and legend_columns(labels[:1], 4.0) == 1
    assert legend_columns(labels, 1.0) == 1
