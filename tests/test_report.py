"""Tests for the report layer: reading run dirs, smoothing, plots and tables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.colors import to_hex

from evalsuite.errors import UserError
from evalsuite.report import tables
from evalsuite.report.palette import FAMILIES, model_color, model_styles
from evalsuite.report.plots import cumulative_perplexity, moving_average, plot_loss
from evalsuite.report.records import find_runs, gather_records, load_loss_curve, load_run, run_labels
from evalsuite.report.tables import pivot_loss, write_table


def naive_moving_average(x: np.ndarray, window: int) -> np.ndarray:
    """The obvious loop: mean over [i - w//2, i + w//2] clipped to the array."""
    half = window // 2
    return np.array([x[max(0, i - half) : min(len(x), i + half + 1)].mean() for i in range(len(x))])


def write_loss_run(
    run_dir: Path, model: str, train_length: int | None, length: int = 64, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """A finished loss run as the loss task writes it: loss_per_token.npz + results.json."""
    rng = np.random.default_rng(seed)
    loss = 3.0 + 2.0 / np.sqrt(np.arange(1, length + 1)) + 0.05 * rng.standard_normal(length)
    count = np.full(length, 4, dtype=np.int64)
    run_dir.mkdir(parents=True)
    np.savez(run_dir / "loss_per_token.npz", loss_per_token=loss, count=count)
    lengths = [2**k for k in range(int(np.log2(length)) + 1)]
    if lengths[-1] != length:
        lengths.append(length)
    records = []
    for n_tokens in lengths:
        mean = float(loss[:n_tokens].mean())
        for metric, value in (("loss", mean), ("perplexity", float(np.exp(mean)))):
            records.append(
                {"model": model, "task": "loss", "subtask": "", "length": n_tokens, "metric": metric, "value": value}
                | {"n": 4}
            )
    results = {
        "task": "loss",
        "model": model,
        "train_length": train_length,
        "config": {"length": length, "seed": seed},
        "config_hash": f"hash{seed}",
        "provenance": {
            "evalsuite": "0.1.0",
            "git_commit": "abc123",
            "checkpoint_sha256": "f" * 64,
            "tokenizer": "gpt2-json",
            "device": "cpu",
            "dtype": "float32",
            "seed": seed,
            "created": "2025-01-01T00:00:00",
        },
        "records": records,
    }
    (run_dir / "results.json").write_text(json.dumps(results))
    return loss, count


# --- smoothing and perplexity ------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 3, 4, 7, 10, 101])
@pytest.mark.parametrize("n", [1, 5, 50, 300])
def test_moving_average_matches_naive(window: int, n: int) -> None:
    x = np.random.default_rng(n * 1000 + window).standard_normal(n)
    np.testing.assert_allclose(moving_average(x, window), naive_moving_average(x, window), rtol=1e-12, atol=1e-12)


def test_moving_average_edges_shrink_without_padding() -> None:
    x = np.arange(10, dtype=float)
    y = moving_average(x, 5)
    assert y[0] == pytest.approx(np.mean([0, 1, 2]))
    assert y[1] == pytest.approx(np.mean([0, 1, 2, 3]))
    assert y[5] == pytest.approx(5.0)
    assert y[-1] == pytest.approx(np.mean([7, 8, 9]))


def test_moving_average_window_longer_than_array() -> None:
    x = np.array([1.0, 2.0, 6.0])
    # Every window covers the whole array.
    np.testing.assert_allclose(moving_average(x, 101), [3.0, 3.0, 3.0])


def test_moving_average_rejects_bad_window() -> None:
    with pytest.raises(UserError):
        moving_average(np.ones(3), 0)


def test_cumulative_perplexity() -> None:
    loss = np.array([2.0, 4.0, 0.0, 1.0])
    expected = [np.exp(2.0), np.exp(3.0), np.exp(2.0), np.exp(7.0 / 4)]
    np.testing.assert_allclose(cumulative_perplexity(loss), expected)
    # Constant loss gives a constant perplexity.
    np.testing.assert_allclose(cumulative_perplexity(np.full(5, np.log(7.0))), np.full(5, 7.0))


# --- reading run directories ----------------------------------------------------------------------------


def test_load_run_and_curve(tmp_path: Path) -> None:
    loss, count = write_loss_run(tmp_path / "run", "fox-pro-tiny", 16)
    assert load_run(tmp_path / "run")["model"] == "fox-pro-tiny"
    got_loss, got_count = load_loss_curve(tmp_path / "run")
    np.testing.assert_array_equal(got_loss, loss)
    np.testing.assert_array_equal(got_count, count)


def test_missing_results_json_is_user_error(tmp_path: Path) -> None:
    (tmp_path / "unfinished").mkdir()
    with pytest.raises(UserError, match="results.json not found"):
        load_run(tmp_path / "unfinished")
    with pytest.raises(UserError, match="loss_per_token.npz not found"):
        load_loss_curve(tmp_path / "unfinished")


def test_corrupt_results_json_is_user_error(tmp_path: Path) -> None:
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "results.json").write_text('{"task": "loss", ')
    with pytest.raises(UserError, match="cannot read"):
        load_run(tmp_path / "bad")


def test_find_runs_recurses_and_accepts_run_dirs(tmp_path: Path) -> None:
    write_loss_run(tmp_path / "a" / "run1", "fox-pro-tiny", 16)
    write_loss_run(tmp_path / "b" / "deep" / "run2", "transformer-pro-tiny", 32)
    (tmp_path / "empty").mkdir()
    expected = [(tmp_path / "a" / "run1").resolve(), (tmp_path / "b" / "deep" / "run2").resolve()]
    assert find_runs([tmp_path]) == expected
    assert find_runs([tmp_path / "a" / "run1", tmp_path]) == expected  # de-duplicated
    assert find_runs([tmp_path / "a" / "run1" / "results.json"]) == expected[:1]
    assert find_runs([tmp_path / "empty"]) == []
    with pytest.raises(UserError):
        find_runs([tmp_path / "nope"])


def test_gather_records(tmp_path: Path) -> None:
    write_loss_run(tmp_path / "runs" / "fox", "fox-pro-tiny", 16, length=64, seed=0)
    write_loss_run(tmp_path / "runs" / "tf", "transformer-pro-tiny", 32, length=48, seed=1)
    niah = tmp_path / "runs" / "niah"
    niah.mkdir()
    lines = [
        {"model": "fox-pro-tiny", "task": "niah", "length": 1024, "depth": 0.5, "scores": {"gpt4o": 10}},  # no metric
        {"model": "fox-pro-tiny", "task": "niah", "subtask": "easy", "length": 1024, "depth": 0.5}
        | {"metric": "score", "value": 9.0, "n": 1, "config_hash": "nh1", "provenance": {"git_commit": "def456"}},
        {"model": "fox-pro-tiny", "task": "niah", "metric": "accuracy", "value": 0.75},  # minimal record
    ]
    text = "\n".join(json.dumps(line) for line in lines) + "\n\n" + '{"model": "trunc'  # killed mid-write
    (niah / "records.jsonl").write_text(text)

    df = gather_records([tmp_path / "runs"])  # the torn last line is dropped

    for column in ("model", "task", "subtask", "length", "depth", "metric", "value", "n", "config_hash", "run_dir"):
        assert column in df.columns
    for key in ("evalsuite", "git_commit", "checkpoint_sha256", "tokenizer", "device", "dtype", "seed"):
        assert f"provenance.{key}" in df.columns

    loss = df[df["task"] == "loss"]
    # fox: lengths 1..64 (7 powers of two); tf: 1..32 (6) plus the full length 48; two metrics each.
    assert len(loss) == 2 * 7 + 2 * 7
    tf = loss[(loss["model"] == "transformer-pro-tiny") & (loss["metric"] == "perplexity")]
    assert sorted(tf["length"]) == [1, 2, 4, 8, 16, 32, 48]
    assert set(loss["config_hash"]) == {"hash0", "hash1"}
    assert set(loss["provenance.git_commit"]) == {"abc123"}
    assert set(loss["train_length"]) == {16, 32}

    niah_rows = df[df["task"] == "niah"].sort_values("metric")
    assert list(niah_rows["metric"]) == ["accuracy", "score"]
    minimal, full = niah_rows.iloc[0], niah_rows.iloc[1]
    assert full["value"] == 9.0 and full["depth"] == 0.5 and full["length"] == 1024 and full["subtask"] == "easy"
    assert full["provenance.git_commit"] == "def456" and full["config_hash"] == "nh1"
    # Missing fields: "" for strings, NaN/NA for numbers.
    assert minimal["subtask"] == "" and minimal["config_hash"] == ""
    assert pd.isna(minimal["length"]) and pd.isna(minimal["depth"]) and pd.isna(minimal["n"])
    assert all(Path(p).name in {"fox", "tf", "niah"} for p in df["run_dir"])


def test_gather_records_empty(tmp_path: Path) -> None:
    df = gather_records([tmp_path])
    assert df.empty and "metric" in df.columns


# --- plots --------------------------------------------------------------------------------------------


def test_model_colors_follow_paper_and_stay_fixed() -> None:
    """The FoX paper's colours for its models; a model of no family keeps one colour whatever else is plotted, and
    never takes a family's colour."""
    paper = {"fox-pro-tiny": "C0", "transformer-pro": "C1", "fox-llama": "C2", "transformer-llama-360m": "C3"}
    for model, slot in paper.items():
        assert model_color(model) == to_hex(slot)
    families = {look.color for look in FAMILIES}
    for model in ("zeta", "alpha", "foxy", "SmolLM2-135M-Instruct.Q4_1"):  # "fox" is no prefix of "foxy"
        assert model_color(model) not in families
        assert model_styles([model, "fox-pro-tiny"])[model].color == model_styles([model, "gsa"])[model].color
    assert model_color("my-model", architecture="gsa") == model_color("gsa")  # a card's architecture decides


def test_plot_loss_writes_png_and_pdf(tmp_path: Path) -> None:
    write_loss_run(tmp_path / "runs" / "fox", "fox-pro-tiny", 2048, length=8192, seed=0)
    write_loss_run(tmp_path / "runs" / "tf", "transformer-pro-tiny", 4096, length=8192, seed=1)
    paths = plot_loss([tmp_path / "runs" / "fox", tmp_path / "runs" / "tf"], tmp_path / "out" / "loss", start=16)
    assert [p.suffix for p in paths] == [".png", ".pdf"]
    for path in paths:
        assert path.is_file() and path.stat().st_size > 1000
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert paths[1].read_bytes()[:5] == b"%PDF-"
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]  # no temp files left


def test_plot_loss_same_model_twice_and_labels(tmp_path: Path) -> None:
    write_loss_run(tmp_path / "seed0", "fox-pro-tiny", None, seed=0)
    write_loss_run(tmp_path / "seed1", "fox-pro-tiny", None, seed=1)
    paths = plot_loss([tmp_path], tmp_path / "seeds", window=5)
    assert all(p.stat().st_size > 0 for p in paths)
    with pytest.raises(UserError, match="labels"):
        plot_loss([tmp_path], tmp_path / "bad", labels=["only one"])


def test_labels_tell_runs_of_one_model_apart(tmp_path: Path) -> None:
    """Two runs of one model are labelled by what differs in their configs (data, length), not by a hash."""
    write_loss_run(tmp_path / "a", "fox-pro-tiny", None, length=64, seed=0)
    write_loss_run(tmp_path / "b", "fox-pro-tiny", None, length=128, seed=0)
    write_loss_run(tmp_path / "c", "fox-pro-tiny", None, length=128, seed=0)
    write_loss_run(tmp_path / "d", "transformer-pro-tiny", None, length=64, seed=0)
    for name, data in (("a", "/x/books"), ("b", "/x/books"), ("c", "/y/essays.jsonl")):
        path = tmp_path / name / "results.json"
        results = json.loads(path.read_text())
        results["config"]["data"] = data
        path.write_text(json.dumps(results))
    labels = run_labels(["fox-pro-tiny"] * 3 + ["transformer-pro-tiny"], [tmp_path / n for n in "abcd"])
    assert labels == [
        "fox-pro-tiny (data=books, length=64)",
        "fox-pro-tiny (data=books, length=128)",
        "fox-pro-tiny (data=essays.jsonl, length=128)",
        "transformer-pro-tiny",
    ]
    table = pivot_loss(gather_records([tmp_path / n for n in "ab"]))
    assert list(table.index) == ["fox-pro-tiny (length=64)", "fox-pro-tiny (length=128)"]  # only what differs


def test_labels_of_runs_with_one_config_name_the_folder_that_differs(tmp_path: Path) -> None:
    """Runs of one model under one config (two trainings evaluated alike) are told apart by their paths."""
    runs = [tmp_path / "drt" / "passkey", tmp_path / "drt-rows16" / "passkey"]
    for run in runs:
        write_loss_run(run, "drt-bytes", None, length=64, seed=0)
    assert run_labels(["drt-bytes"] * 2, runs) == ["drt-bytes (drt)", "drt-bytes (drt-rows16)"]


def test_plot_loss_without_loss_runs_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no loss runs"):
        plot_loss([tmp_path], tmp_path / "nothing")


# --- tables -------------------------------------------------------------------------------------------


def test_write_table_all_formats_and_csv_roundtrip(tmp_path: Path) -> None:
    df = pd.DataFrame({"model": ["fox_pro", "transformer-pro"], "length": [1024, 2048], "value": [4.25, float("nan")]})
    paths = write_table(df, tmp_path / "tables" / "ppl_v0.1")
    assert [p.name for p in paths] == ["ppl_v0.1.csv", "ppl_v0.1.md", "ppl_v0.1.tex"]
    pd.testing.assert_frame_equal(pd.read_csv(paths[0]), df)
    markdown = paths[1].read_text()
    assert "fox_pro" in markdown and "4.25" in markdown and "nan" not in markdown
    latex = paths[2].read_text()
    assert "tabular" in latex and r"fox\_pro" in latex and "4.25" in latex


def test_write_table_latex_fallback_without_jinja2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_jinja(*args, **kwargs):
        raise ImportError("Missing optional dependency 'Jinja2'")

    monkeypatch.setattr(pd.DataFrame, "to_latex", no_jinja)
    wide = pd.DataFrame({1024: [4.5], 2048: [np.nan]}, index=pd.Index(["fox_pro"], name="model"))
    (path,) = write_table(wide, tmp_path / "wide", formats=["tex"])
    text = path.read_text()
    assert text.startswith("\\begin{tabular}{lrr}") and r"fox\_pro & 4.50 &  \\" in text
    assert tables.simple_tabular(wide).endswith("\\end{tabular}\n")


def test_write_table_rejects_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown table format"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path / "t", formats=["xlsx"])


def test_pivot_loss(tmp_path: Path) -> None:
    write_loss_run(tmp_path / "fox0", "fox-pro-tiny", 16, length=16, seed=0)
    write_loss_run(tmp_path / "fox1", "fox-pro-tiny", 16, length=16, seed=1)
    write_loss_run(tmp_path / "tf", "transformer-pro-tiny", 16, length=8, seed=2)
    df = gather_records([tmp_path])
    wide = pivot_loss(df)
    assert list(wide.index) == ["fox-pro-tiny (seed=0)", "fox-pro-tiny (seed=1)", "transformer-pro-tiny"]
    assert list(wide.columns) == [1, 2, 4, 8, 16]
    assert np.isnan(wide.loc["transformer-pro-tiny", 16])
    expected = df[(df["run_dir"].str.endswith("tf")) & (df["metric"] == "perplexity") & (df["length"] == 8)]
    assert wide.loc["transformer-pro-tiny", 8] == pytest.approx(expected["value"].item())
    assert list(pivot_loss(df, lengths=[16, 4, 32]).columns) == [16, 4, 32]
    # The wide table writes too, with its model index.
    csv, md = write_table(wide, tmp_path / "wide", formats=("csv", "md"))
    assert pd.read_csv(csv, index_col=0).shape == wide.shape
    with pytest.raises(UserError):
        pivot_loss(df[df["task"] == "niah"])
