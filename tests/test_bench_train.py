"""``evalsuite bench train`` on a CPU at tiny shapes: records, per-round ratios, resume, one model at a time, bad
input; and ``paper render fox:table6`` filling its throughput column from such records."""

import csv
import io
import json
import statistics
from pathlib import Path

import pytest
import torch
import yaml
from conftest import assert_one_line_error

from evalsuite.bench import train_speed as bench
from evalsuite.cards import count_params, load_card
from evalsuite.errors import UserError
from evalsuite.papers.published import DATA_DIR
from evalsuite.papers.recipes import bench_command

BASE, OTHER = "llama-v97", "fox-v97"
TWINS = {BASE: "transformer-llama-tiny", OTHER: "fox-pro-tiny"}


def _cards(folder, twins: dict[str, str]) -> list[Path]:
    """``{name: tiny card}`` saved as ``folder/<name>.yaml`` with a 97-token vocabulary (the LM head of 50257 would
    be most of a step); returns their paths."""
    folder.mkdir()
    for name, tiny in twins.items():
        card = yaml.safe_load(load_card(tiny).path.read_text())
        card["config"]["vocab_size"] = 97
        (folder / f"{name}.yaml").write_text(yaml.safe_dump(card))
    return [folder / f"{name}.yaml" for name in twins]


@pytest.fixture
def tiny(tmp_path):
    """:func:`bench.bench_train`'s arguments for the two small-vocabulary twins at 64x2, three rounds."""
    return dict(models=_cards(tmp_path / "cards", TWINS), shapes=[(64, 2)], rounds=3, verbose=False)


def _lines(path) -> int:
    return len((path / "records.jsonl").read_text().splitlines())


def _check_ratios(by: dict, shape: str) -> None:
    """Each round's ratio is the baseline's time over the model's in that round; the ratio is their median."""
    base, other = by[(BASE, shape)], by[(OTHER, shape)]
    assert other["baseline_round_ms"] == base["round_ms"] and len(other["round_ms"]) == other["rounds"] == 3
    expected = [b / m for b, m in zip(base["round_ms"], other["round_ms"], strict=True)]
    assert other["ratio_to_baseline"] == pytest.approx(statistics.median(expected))
    assert other["ratio_to_baseline_p20"] <= other["ratio_to_baseline"] <= other["ratio_to_baseline_p80"]
    assert other["ratio_to_baseline_pairs"] == 3 and base["ratio_to_baseline"] == 1.0


def test_records_ratios_table_and_resume(tmp_path, tiny):
    out = tmp_path / "out"
    records = bench.bench_train(out, **tiny)
    doc = json.loads((out / bench.JSON_NAME).read_text())
    assert doc["env"]["device"] == "cpu" and doc["env"]["git_commit"] and len(doc["records"]) == len(records) == 2
    by = {(r["model"], f"{r['length']}x{r['batch']}"): r for r in records}
    for name in (BASE, OTHER):
        r = by[(name, "64x2")]
        assert r["status"] == "ok" and r["op"] == "train_step" and r["interleaved"] and r["baseline"] == BASE
        card = load_card(str(tmp_path / "cards" / f"{name}.yaml"))
        assert r["params"] == count_params(card, non_embedding=False) and r["tokens_per_step"] == 128
        assert r["tokens_per_s"] == pytest.approx(statistics.median(128e3 / ms for ms in r["round_ms"]))
        assert r["ms_per_step_p20"] <= r["ms_per_step"] <= r["ms_per_step_p80"] and r["first_step_s"] > 0
        assert r["env"] == doc["env"] and "peak_memory_gib" not in r  # memory is measured on CUDA only
    _check_ratios(by, "64x2")
    table = (out / bench.MD_NAME).read_text()
    assert f"| {OTHER} | 64x2 | 0.2M |" in table and f"] {BASE} | - | 3 rounds, interleaved | ok |" in table

    # a rerun skips the pairs it holds; a new shape times the baseline again beside the model
    assert bench.bench_train(out, **tiny) == records and _lines(out) == 2
    again = bench.bench_train(out, **{**tiny, "shapes": [(64, 2), (32, 3)]})
    by = {(r["model"], f"{r['length']}x{r['batch']}"): r for r in again}
    assert len(again) == 4 and _lines(out) == 4 and by[(OTHER, "64x2")] == records[1]
    _check_ratios(by, "32x3")
    with pytest.raises(UserError, match="holds a run with other settings"):
        bench.bench_train(out, **{**tiny, "amp": "none"})


def test_models_built_one_at_a_time_are_timed_in_turn(tmp_path, tiny, capsys):
    records = bench.bench_train(tmp_path / "out", **{**tiny, "models": tiny["models"][::-1], "baseline": BASE,
                                                     "together": False, "verbose": True})  # fmt: skip
    by = {(r["model"], f"{r['length']}x{r['batch']}"): r for r in records}
    assert not any(r["interleaved"] for r in records)
    _check_ratios(by, "64x2")
    out = capsys.readouterr().out
    assert "the models built one at a time, timed in turn" in out
    assert out.index(f"tokens/s, 1.000x {BASE}") < out.index(f"{OTHER}: built")  # the baseline first, alone
    assert f"{OTHER} 64x2: first step" in out and f"x {BASE}" in out


def test_checkpointed_blocks_give_the_same_gradients():
    from evalsuite.training.train import build_model

    grads = []
    for wrap in (False, True):
        model = build_model(load_card("tnl-tiny"), seed=0).double()
        if wrap:
            bench.checkpoint_blocks(model)
            assert all(isinstance(b, bench._Checkpointed) for b in model.blocks)
        ids = torch.randint(0, 100, (2, 24), generator=torch.Generator().manual_seed(0))
        model.logits(model(ids)).square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(UserError, match="--checkpoint needs a model with a `blocks` layer stack"):
        bench.checkpoint_blocks(build_model(load_card("drt-tiny"), seed=0))


def test_a_backend_per_model_and_checkpointing(tmp_path, tiny):
    base = tiny["models"][0]
    records = bench.bench_train(tmp_path / "out", **{**tiny, "models": [f"{base}@sdpa", base], "checkpoint": True})
    by = {r["model"]: r for r in records}
    assert by[f"{BASE}@sdpa"]["attention"] == "sdpa" and by[BASE]["attention"] == "auto"
    assert all(r["status"] == "ok" and r["checkpoint"] for r in records)
    assert by[BASE]["baseline"] == f"{BASE}@sdpa" and by[BASE]["ratio_to_baseline_pairs"] == 3


def test_bad_input_is_one_line(run_cli, tmp_path):
    train = ["bench", "train", "--out", tmp_path / "out", "--model", "transformer-llama-tiny,fox-pro-tiny"]
    code, _, err = run_cli([*train, "--shape", "64by2"], tmp_path)
    assert_one_line_error(code, err, "--shape takes LENGTHxBATCH")
    code, _, err = run_cli([*train, "--shape", "64x2", "--baseline", "gsa-tiny"], tmp_path)
    assert_one_line_error(code, err, "--baseline gsa-tiny is not one of the models")
    code, _, err = run_cli([*train, "--model", "fox-pro-tiny", "--shape", "64x2"], tmp_path)
    assert_one_line_error(code, err, "model fox-pro-tiny is named twice")
    code, _, err = run_cli([*train[:-2], "--model", "fox-pro-tiny@sdpa", "--shape", "64x2"], tmp_path)
    assert_one_line_error(code, err, "attention backend 'sdpa' has no forget gate")
    assert not (tmp_path / "out").exists()
    assert bench_command({"kind": "bench", "op": "train_step", "metric": "throughput"}) == "evalsuite bench train"
    assert bench_command({"kind": "bench", "op": "train_step", "metric": "time"}).startswith("no `evalsuite bench`")


def _table6_at(length: int, folder) -> Path:
    """A papers folder holding FoX Table 6 as ``demo:table6`` with its throughput measured at ``length`` tokens:
    16K-token steps of even the tiny twins take minutes on a CPU's reference attention (tests/gpu runs the item
    itself at 16K)."""
    fox = yaml.safe_load((DATA_DIR / "fox.yaml").read_text())
    item = next(i for i in fox["items"] if i["id"] == "fox:table6")
    item["id"] = "demo:table6"
    next(c for c in item["columns"] if c["key"] == "throughput")["recipe"]["length"] = length
    folder.mkdir()
    paper = {"paper": "demo", "title": "Demo", "arxiv": "0000.00000", "items": [item]}
    (folder / "demo.yaml").write_text(yaml.safe_dump(paper, allow_unicode=True, sort_keys=False))
    return folder


def test_paper_render_fills_fox_table6_throughput(run_cli, tmp_path):
    """Tiny twins saved under the paper rows' card names stand in for the 760M models: the render's throughput
    cells are our records', each noted with its ratio to the baseline beside the paper's ratio of the same rows."""
    cards = tmp_path / "cards"
    _cards(cards, {"fox-pro": "fox-pro-tiny", "transformer-llama": "transformer-llama-tiny"})
    out = tmp_path / "results" / "bench" / "train"
    code, text, err = run_cli(["bench", "train", "--out", out, "--model", cards / "fox-pro.yaml", "--model",
                               cards / "transformer-llama.yaml", "--baseline", "transformer-llama", "--shape", "64x2",
                               "--rounds", "2"], tmp_path)  # fmt: skip
    assert code == 0, err
    assert "fox-pro 64x2: first step" in text and f"wrote {out}/{bench.JSON_NAME}" in text
    records = {r["model"]: r for r in json.loads((out / bench.JSON_NAME).read_text())["records"]}
    render = ["paper", "render", "demo:table6", "--results", "results", "--papers", _table6_at(64, tmp_path / "p")]
    code, table, err = run_cli([*render, "--format", "csv"], tmp_path)
    assert code == 0, err
    cells = {row[1]: row[2:] for row in csv.reader(io.StringIO(table)) if len(row) > 2 and row[0]}
    for name in ("fox-pro", "transformer-llama"):
        assert cells[f"{name} (ours)"][3] == f"{records[name]['tokens_per_s'] / 1e3:.0f}k"
    code, md, err = run_cli(render, tmp_path)
    ratio = records["fox-pro"]["ratio_to_baseline"]
    assert (f"- Throughput (tokens/sec): fox-pro at 64x2: {ratio:.3f}× transformer-llama's tokens/s (median of 2 "
            "interleaved rounds") in md  # fmt: skip
    assert "the paper's 27k / 38k = 0.71×" in md and "the paper's 38k / 38k = 1.00×" in md
    assert "Throughput (tokens/sec): needs a GPU run" not in md
    code, listed, err = run_cli(["paper", "list", "--results", "results", "--papers", tmp_path / "p"], tmp_path)
    assert code == 0 and "fox-pro 1/1; transformer-llama 1/1; from the cards" in listed, err
    code, md, err = run_cli(["paper", "render", "fox:table6", "--results", "results"], tmp_path)  # measured at 16K
    assert "- Throughput (tokens/sec): needs a GPU run (evalsuite bench train)" in md
