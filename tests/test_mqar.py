"""MQAR: the sweep (grid, resume, workers), state sizes, the report, and the ``ci`` preset end to end on a
CPU (the generator: test_mqar_data.py)."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from evalsuite.cards import architecture_card
from evalsuite.errors import UserError
from evalsuite.report.mqar import best_over_lr, best_table, load_mqar, records_frame, write_mqar_report
from evalsuite.runs.store import config_hash
from evalsuite.tasks.mqar import (
    MQARSweep,
    MQARTask,
    cell_config,
    check_best,
    decode_state_size,
    default_run_dir,
    load_preset,
    run_mqar,
    sweep_cells,
    sweep_from_options,
)
from evalsuite.training.train import build_model

ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------------------------- sweep


def test_gsa_paper_preset_grid():
    sweep = load_preset("gsa-paper")
    cells = sweep_cells(sweep)
    # the four FoX-paper blocks, GSA, TNL and FoX with Appendix D gate init
    archs = {"fox-pro", "fox-llama", "transformer-pro", "transformer-llama", "gsa", "tnl"}
    assert {c.model for c in cells} == archs | {"fox-pro-timescale-init", "fox-llama-timescale-init"}
    assert len(cells) == 7 * 4 * 2 + 4 * 3 and sweep.max_steps == 16000
    assert {(c.seq_len, c.num_kv_pairs) for c in cells} == {(512, 64)}
    assert sorted({c.d_model for c in cells}) == [64, 128, 256, 512]
    assert sorted({c.lr for c in cells if c.model != "gsa"}) == [3e-4, 1e-3]
    assert sorted({c.lr for c in cells if c.model == "gsa"}) == [1e-3, 3e-3, 1e-2]  # GSA's own band
    assert cells[0].lr == 1e-3 and cells[0].d_model == 512  # likeliest-best lr first, widest first
    overrides = sweep.overrides("fox-pro", 256)
    assert overrides == dict(vocab_size=8192, hidden_size=256, num_layers=4, num_heads=4, use_mlp=False,
                             tie_word_embeddings=True)  # fmt: skip
    # GSA as the authors' Zoology fork builds its MQAR mixer: 4 heads, d_model / 4 slots, tau 16, scale 1/sqrt(dh)
    for d in (64, 128, 256, 512):
        gsa = sweep.overrides("gsa", d)
        assert (gsa["num_heads"], gsa["num_slots"], gsa["gate_logit_normalizer"], gsa["scale"]) == (4, d // 4, 16, None)
    assert len({json.dumps(cell_config(sweep, c), sort_keys=True) for c in cells}) == len(cells)
    # Zoology's recipe: no warmup, a cosine stepped per epoch of 100k / 128 steps over 64 epochs,
    # decay on every parameter, no clipping; bf16 autocast (ours, measured against fp32 in the ablation)
    train = cell_config(sweep, cells[0])["train"]
    assert train["schedule"] == "epoch-cosine" and train["steps_per_epoch"] == 781 and train["warmup_steps"] == 0
    assert train["decay_all_params"] and train["grad_clip"] is None and train["amp"] == "auto"


def test_forget_gate_stats():
    """Per layer: the mean forget gate and its time scale; the Appendix D init opens the gates (longer time
    scales than the zero bias's sigmoid(0) = 0.5, i.e. 1/ln 2 = 1.44 tokens); models without a gate give {}."""
    from evalsuite.tasks.mqar.cell import forget_gate_stats
    from evalsuite.tasks.mqar.sweep import resolve_model
    from evalsuite.training.train import build_model

    over = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2, use_mlp=False)
    ids = torch.randint(0, 64, (4, 16))
    zero = forget_gate_stats(build_model(resolve_model("fox-pro"), over), ids)
    opened = forget_gate_stats(build_model(resolve_model("fox-pro-timescale-init"), over), ids)
    assert len(zero["forget_gate_mean"]) == len(opened["forget_time_scale"]) == 3
    assert all(abs(g - 0.5) < 0.05 and abs(t - 1 / math.log(2)) < 0.2
               for g, t in zip(zero["forget_gate_mean"], zero["forget_time_scale"], strict=True))  # fmt: skip
    assert all(t > 30 for t in opened["forget_time_scale"]) and all(g > 0.95 for g in opened["forget_gate_mean"])
    assert forget_gate_stats(build_model(resolve_model("transformer-llama"), over), ids) == {}
    # GSA's slot gates, log alpha = logsigmoid(W x) / tau: near W x = 0 the time scale is tau / ln 2 (fork: tau = 16)
    gsa = build_model(resolve_model("gsa"), {**over, "num_slots": 8, "gate_logit_normalizer": 16.0})
    with torch.no_grad():
        for layer in gsa.modules():
            if hasattr(layer, "forget_gate"):
                layer.forget_gate()[0].weight.mul_(1e-3)
    slots = forget_gate_stats(gsa, ids)
    assert len(slots["forget_time_scale"]) == 3
    assert all(abs(t - 16 / math.log(2)) < 0.5 for t in slots["forget_time_scale"]), slots


def test_recipe_fields_keep_old_cell_hashes():
    """Fields added for the recipe are absent from a cell's config at their defaults, so run directories written
    before them (results/mqar/...) still resume; set, they change the hash."""
    sweep = MQARSweep(**TINY_SWEEP)
    cell = sweep_cells(sweep)[0]
    config = cell_config(sweep, cell)
    assert not {"schedule", "steps_per_epoch", "cosine_epochs", "decay_all_params"} & set(config["train"])
    assert "tie_word_embeddings" not in config["model"]["overrides"]
    tied = MQARSweep(**{**TINY_SWEEP, "tie_head": True})
    assert cell_config(tied, cell)["model"]["overrides"]["tie_word_embeddings"] is True


def test_pairing_and_overrides():
    sweep = MQARSweep(seq_lens=[64, 128], num_kv_pairs=[4, 32], pairing="product", models=["fox-pro"])
    assert sweep.settings() == [(64, 4), (128, 4), (128, 32)]  # (64, 32) cannot fit and is skipped
    with pytest.raises(UserError, match="zip"):
        MQARSweep(seq_lens=[64, 128], num_kv_pairs=[4])
    sweep = sweep_from_options("gsa-paper", num_heads=2, models=["fox-pro-tiny"], d_models=[64])
    assert sweep.head_dim is None and sweep.overrides("fox-pro-tiny", 64)["num_heads"] == 2
    with pytest.raises(UserError, match="unknown MQAR sweep key"):
        MQARSweep.from_dict({"d_model": 3})
    # a model override given per width; JSON round trips turn the widths into strings
    sweep = MQARSweep(models=["gsa"], d_models=[64, 128], model_overrides={"gsa": {"num_slots": {64: 16, "128": 32}}})
    assert [sweep.overrides("gsa", d)["num_slots"] for d in (64, 128)] == [16, 32]
    with pytest.raises(UserError, match="no entry for d_model 256"):
        sweep.overrides("gsa", 256)
    with pytest.raises(UserError, match="unknown MQAR preset"):
        load_preset("nope")


def test_run_mqar_starts_from_the_commands_preset():
    """`evalsuite run mqar --set ...` starts from the preset `evalsuite mqar` does (ci), and takes its run options."""
    task = MQARTask.from_options({"device": "cpu", "max_steps": 7})
    assert task.preset == "ci" and task.device == "cpu"
    assert task.config.to_dict() == {**load_preset("ci").to_dict(), "max_steps": 7}
    with pytest.raises(UserError, match="task mqar: unknown option"):
        MQARTask.from_options({"bogus": 1})


def test_default_run_dir():
    assert default_run_dir(load_preset("ci"), "ci") == Path("results/runs/mqar/ci")
    changed = sweep_from_options("ci", lrs=[1e-2])
    assert default_run_dir(changed, "ci").name.startswith("ci-")


def test_state_sizes():
    tiny = dict(vocab_size=64, hidden_size=32, num_layers=3, num_heads=2, use_mlp=False)
    llama = build_model(architecture_card("transformer-llama"), tiny)
    s = decode_state_size(llama, 512, torch.bfloat16)
    assert s == {"kind": "kv-cache", "elements": 3 * 2 * 512 * 32, "bytes": 3 * 2 * 512 * 32 * 2, "dtype": "bfloat16"}
    fox = build_model(architecture_card("fox-pro"), tiny)  # + cumulative log-forget [T, H] fp32 + two KV-shift rows
    s = decode_state_size(fox, 512, torch.float32)
    assert s["elements"] == 3 * (2 * 512 * 32 + 512 * 2 + 2 * 32) and s["bytes"] == 4 * s["elements"]
    assert decode_state_size(torch.nn.Linear(2, 2), 8, torch.float32) is None


TINY_SWEEP = dict(
    models=["transformer-llama"],
    d_models=[16],
    seq_lens=[16],
    num_kv_pairs=[2],
    lrs=[1e-3],
    num_layers=1,
    head_dim=8,
    vocab_size=64,
    num_train=64,
    num_test=16,
    batch_size=16,
    eval_batch_size=16,
    max_steps=3,
    warmup_steps=1,
    eval_every=2,
    cpu_threads=1,
)


def test_resume_skips_finished_cells(tmp_path):
    sweep = MQARSweep(**TINY_SWEEP)
    out = run_mqar(sweep, tmp_path, device="cpu", progress=False)
    assert out["summary"]["cells"] == {"total": 1, "finished": 1, "pending": []}
    assert out["task"] == "mqar" and out["config"] == {} and out["summary"]["sweep"] == sweep.to_dict()
    first = (tmp_path / "records.jsonl").read_text()
    run_mqar(sweep, tmp_path, device="cpu", progress=False)
    assert (tmp_path / "records.jsonl").read_text() == first  # nothing retrained
    wider = MQARSweep(**{**TINY_SWEEP, "lrs": [1e-3, 1e-2]})
    out = run_mqar(wider, tmp_path, device="cpu", progress=False)
    lines = (tmp_path / "records.jsonl").read_text().splitlines()
    assert len(lines) == 2 and lines[0] == first.strip()
    record = json.loads(lines[1])
    for key in ("model", "task", "subtask", "length", "metric", "value", "n", "d_model", "lr", "num_kv_pairs"):
        assert key in record
    assert record["task"] == "mqar" and record["metric"] == "accuracy" and record["length"] == 16
    assert record["state_kind"] == "kv-cache" and record["provenance"]["device"] and record["config_hash"]
    assert record["key"] == record["config_hash"]  # the runner's record key is the cell's config hash
    assert [r["metric"] for r in out["records"]] == ["accuracy_best_lr"]  # one (model, setting, d) point
    assert out["records"][0]["lrs_tried"] == 2 and out["records"][0]["n"] == 16
    assert out["provenance"]["dtype"] == "float32" and "summary" in out["provenance"]  # shared by the records
    # a spent time limit starts nothing and lists what is pending
    more = MQARSweep(**{**TINY_SWEEP, "lrs": [1e-3, 1e-2, 3e-2]})
    out = run_mqar(more, tmp_path, device="cpu", progress=False, time_limit=0)
    assert out["summary"]["cells"]["finished"] == 2 and out["summary"]["cells"]["pending"][0]["lr"] == 3e-2


def test_raising_the_budget_retrains_only_unsolved_cells(tmp_path):
    """Under the epoch-stepped schedule a cell that stopped early within a smaller budget is what the larger budget
    would train, so its record is reused (naming its origin); a cell that ran out of steps trains again."""
    zoology = dict(TINY_SWEEP, schedule="epoch-cosine", warmup_steps=0, max_steps=4)
    solved = MQARSweep(**{**zoology, "early_stop": -1.0})  # stops at its first evaluation: "solved"
    unsolved = MQARSweep(**{**zoology, "early_stop": None, "lrs": [1e-2]})
    for sweep in (solved, unsolved):
        run_mqar(sweep, tmp_path, device="cpu", progress=False)
    first = [json.loads(line) for line in (tmp_path / "records.jsonl").read_text().splitlines()]
    assert [r["stopped_early"] for r in first] == [True, False] and first[0]["steps"] == 2
    bigger = MQARSweep(**{**zoology, "early_stop": -1.0, "max_steps": 8})
    out = run_mqar(bigger, tmp_path, device="cpu", progress=False, time_limit=0)  # trains nothing
    assert out["summary"]["cells"]["pending"] == []
    reused = json.loads((tmp_path / "records.jsonl").read_text().splitlines()[-1])
    assert reused["reused_from"] == {"key": first[0]["key"], "max_steps": 4}
    assert reused["key"] == config_hash(cell_config(bigger, sweep_cells(bigger)[0])) != first[0]["key"]
    assert reused["config"]["train"]["max_steps"] == 8 and reused["value"] == first[0]["value"]
    bigger_unsolved = MQARSweep(**{**zoology, "early_stop": None, "lrs": [1e-2], "max_steps": 8})
    out = run_mqar(bigger_unsolved, tmp_path, device="cpu", progress=False, time_limit=0)
    assert len(out["summary"]["cells"]["pending"]) == 1  # ran out of steps before: it must train on
    by_run = MQARSweep(**{**zoology, "early_stop": -1.0, "max_steps": 8, "schedule": "warmup-cosine"})
    out = run_mqar(by_run, tmp_path, device="cpu", progress=False, time_limit=0)
    assert len(out["summary"]["cells"]["pending"]) == 1  # a schedule over max_steps changes the trajectory


def test_model_lrs():
    sweep = MQARSweep(
        **{**TINY_SWEEP, "models": ["transformer-llama", "gsa"], "lrs": [1e-3], "model_lrs": {"gsa": [1e-2, 3e-2]}}
    )
    assert {(c.model, c.lr) for c in sweep_cells(sweep)} == {("transformer-llama", 1e-3), ("gsa", 1e-2), ("gsa", 3e-2)}
    assert sweep_from_options("gsa-paper", lrs=[1e-3]).model_lrs == {}  # --lr applies to every model
    with pytest.raises(UserError, match="model_lrs"):
        MQARSweep(**{**TINY_SWEEP, "model_lrs": {"gsa": []}})


def test_cells_in_threads_match_one_process(tmp_path):
    """Cells trained in two threads of a worker process (``threads=2``: each cell its own stream on a GPU) give the
    records a plain in-process run gives: one per cell, the same accuracies."""
    sweep = MQARSweep(**{**TINY_SWEEP, "lrs": [1e-3, 1e-2]})
    plain = run_mqar(sweep, tmp_path / "plain", device="cpu", progress=False)
    threaded = run_mqar(sweep, tmp_path / "threads", device="cpu", progress=False, threads=2)
    assert (
        threaded["summary"]["cells"] == {"total": 2, "finished": 2, "pending": []} and not threaded["summary"]["errors"]
    )

    def by_key(run):
        return {
            r["key"]: r["value"] for r in map(json.loads, (tmp_path / run / "records.jsonl").read_text().splitlines())
        }

    assert by_key("threads") == pytest.approx(by_key("plain"), abs=1e-6)
    assert threaded["records"][0]["value"] == pytest.approx(plain["records"][0]["value"], abs=1e-6)


# --------------------------------------------------------------------------------------------- report


def fake_records(run_dir: Path, history: bool = False) -> None:
    """Records of a 2-model x 2-width x 2-lr sweep; ``history``: with training histories (FoX's with gate stats)."""
    run_dir.mkdir(parents=True)
    lines = []
    for model, d, lr in itertools.product(["fox-pro", "transformer-llama"], [64, 128], [1e-3, 1e-2]):
        acc = {1e-3: 0.5, 1e-2: 0.9}[lr] if model == "fox-pro" else 0.7  # llama: a tie over lrs
        lines.append(
            dict(
                model=model,
                task="mqar",
                subtask=f"kv64/d{d}/lr{lr:g}",
                length=512,
                metric="accuracy",
                value=acc + d / 1000,
                n=3000,
                d_model=d,
                num_kv_pairs=64,
                lr=lr,
                state_kind="kv-cache",
                state_bytes=2 * 512 * d * 4 * 2,
                steps=600,
                train_seconds=d + lr,
                config_hash=f"{model}{d}{lr}",
                provenance={"device": "NVIDIA H100 80GB HBM3"},
            )
        )
        if history:
            gated = model == "fox-pro"
            lines[-1]["history"] = [
                {"step": t, "loss": 8.0 / t, "eval_accuracy": acc * t / 3}
                | ({"eval_forget_time_scale": [1.4, 2.0 + t]} if gated else {})
                for t in (1, 2, 3)
            ]
    (run_dir / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def test_best_over_lr_and_table(tmp_path):
    fake_records(tmp_path / "run")
    best = best_over_lr(load_mqar([tmp_path]))
    assert len(best) == 4
    fox = best[best["model"] == "fox-pro"].set_index("d_model")
    assert fox.loc[64, "lr"] == 1e-2 and fox.loc[64, "accuracy"] == pytest.approx(0.964) and fox.loc[64, "lrs"] == 2
    llama = best[best["model"] == "transformer-llama"]
    assert (llama["lr"] == 1e-3).all()  # ties go to the smaller learning rate
    wide = best_table(best)
    assert list(wide.columns) == ["d=64", "d=128"] and list(wide.index) == ["fox-pro", "transformer-llama"]
    assert wide.loc["transformer-llama", "d=128"] == pytest.approx(0.828)


def test_report_files(tmp_path):
    fake_records(tmp_path / "run")
    written = write_mqar_report([tmp_path / "run"], tmp_path / "out")
    names = sorted(p.name for p in written)
    assert names == sorted(
        ["best.csv", "best.md", "best.tex", "best_long.csv", "cells.csv"]
        + [f"accuracy_vs_{k}.{e}" for k in ("dmodel", "state") for e in ("png", "pdf")]
    )
    assert pd.read_csv(tmp_path / "out" / "best.csv", index_col=0).shape == (2, 2)
    cells = pd.read_csv(tmp_path / "out" / "cells.csv")  # every cell, with its training time
    assert len(cells) == 8 and list(cells["train_seconds"][:2]) == [64.001, 64.01]
    best = pd.read_csv(tmp_path / "out" / "best_long.csv").set_index(["model", "d_model"])
    assert best.loc[("fox-pro", 64), "train_seconds"] == 64.01 and best.loc[("fox-pro", 64), "steps"] == 600
    with pytest.raises(UserError, match="no MQAR records"):
        load_mqar([tmp_path / "out"])


def test_family_variants_get_their_own_marker():
    """Both FoX inits share the paper's FoX colour; the plots tell them apart by marker (and line style)."""
    from evalsuite.report.palette import model_styles

    styles = model_styles(["fox-llama-timescale-init", "transformer-llama", "fox-llama", "gsa"])
    assert styles["fox-llama"].color == styles["fox-llama-timescale-init"].color
    assert styles["fox-llama"].marker == "o" and styles["fox-llama-timescale-init"].marker == "s"
    assert styles["gsa"].marker == styles["transformer-llama"].marker == "o"
    assert len({(styles[m].color, styles[m].marker) for m in styles}) == 4
    assert styles["fox-llama"].linestyle != styles["fox-llama-timescale-init"].linestyle


def test_variants_and_seeds_grid_and_hashes():
    """Seeds and recipe variants multiply the cells; the base recipe at the sweep's seed keeps its old hash; a
    variant changes only its fields; variants may not touch the grid or the data."""
    base = MQARSweep(**TINY_SWEEP)
    sweep = MQARSweep(**{**TINY_SWEEP, "seeds": [123, 7], "variants": {"untied": {"tie_head": False},
                                                                      "clip": {"grad_clip": 0.5}}})  # fmt: skip
    cells = sweep_cells(sweep)
    assert len(cells) == 3 * 2 and {(c.variant, c.seed) for c in cells} == {
        (v, s) for v in ("", "untied", "clip") for s in (123, 7)
    }
    hashes = {(c.variant, c.seed): config_hash(cell_config(sweep, c)) for c in cells}
    assert hashes[("", 123)] == config_hash(cell_config(base, sweep_cells(base)[0]))
    assert len(set(hashes.values())) == 6
    untied = cell_config(sweep, next(c for c in cells if c.variant == "untied" and c.seed == 7))
    assert untied["model"]["overrides"]["tie_word_embeddings"] is False and untied["init_seed"] == 7
    assert untied["data"] == cell_config(base, sweep_cells(base)[0])["data"]  # seeds train differently, same data
    for bad in ({"lrs": [1e-3]}, {"seed": 5}, {"vocab_size": 32}):
        with pytest.raises(UserError, match="may not change"):
            MQARSweep(**{**TINY_SWEEP, "variants": {"x": bad}})
    with pytest.raises(UserError, match="unknown MQAR sweep key"):
        MQARSweep(**{**TINY_SWEEP, "variants": {"x": {"nope": 1}}})
    with pytest.raises(UserError, match="seeds"):
        MQARSweep(**{**TINY_SWEEP, "seeds": []})


def test_ablation_run_and_table(tmp_path):
    """A sweep with a variant and two seeds trains every cell once, records variant and seed, and its report adds
    ablation.{csv,md}: per model, variant and width, accuracy over seeds and how many solved."""
    sweep = MQARSweep(**{**TINY_SWEEP, "seeds": [1, 2], "variants": {"untied": {"tie_head": False}}})
    out = run_mqar(sweep, tmp_path / "run", device="cpu", progress=False)
    assert out["summary"]["cells"]["finished"] == 4
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert sorted((r["variant"] or "", r["seed"]) for r in records) == [("", 1), ("", 2), ("untied", 1), ("untied", 2)]
    assert {r["model"] for r in out["records"]} == {"transformer-llama", "transformer-llama [untied]"}
    written = write_mqar_report([tmp_path / "run"], tmp_path / "out")
    assert {"ablation.csv", "ablation.md"} <= {p.name for p in written}
    table = pd.read_csv(tmp_path / "out" / "ablation.csv")
    assert list(table["variant"]) == ["base", "untied"] and (table["seeds"] == 2).all()
    by_variant = {r["variant"]: r for r in records if r["seed"] == 1}
    frame = records_frame(records)
    assert (frame.groupby("model")["seed"].nunique() == 2).all()
    best = best_over_lr(frame).set_index("model")
    seed_values = [r["value"] for r in records if r["variant"] is None]
    assert best.loc["transformer-llama", "accuracy"] == pytest.approx(sum(seed_values) / 2)
    assert best.loc["transformer-llama", "accuracy_min"] == pytest.approx(min(seed_values))
    assert table.set_index("variant").loc["untied", "min"] <= by_variant["untied"]["value"]


def test_training_curves(tmp_path):
    """Records with histories add training_curves.{png,pdf} (accuracy, loss, FoX's gate time scale per step)."""
    fake_records(tmp_path / "run", history=True)
    names = {p.name for p in write_mqar_report([tmp_path / "run"], tmp_path / "out")}
    assert {"training_curves.png", "training_curves.pdf"} <= names
    assert (tmp_path / "out" / "training_curves.png").stat().st_size > 10_000


def test_check_best():
    results = {"records": [{"model": "a", "value": 0.95}, {"model": "b", "value": 0.5}]}
    with pytest.raises(UserError, match="b 0.500"):
        check_best(results, 0.9)
    check_best(results, 0.4)


# ------------------------------------------------------------------------------------------------ CLI


def cli(*args, cwd):
    """The command line in a fresh interpreter (``python -m evalsuite.cli``)."""
    return subprocess.run(
        [sys.executable, "-m", "evalsuite.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=600
    )


def cli_in_process(args, cwd, monkeypatch, capsys) -> tuple[int, str, str]:
    """The console entry point (:func:`evalsuite.cli.main`) in this process: (exit status, stdout, stderr). Same
    code path as :func:`cli` without an interpreter start per call."""
    from evalsuite.cli import main

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["evalsuite", *args])
    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_ci_preset_learns_on_cpu(tmp_path, monkeypatch, capsys):
    """The ``ci`` preset end to end through the CLI, two cells at a time (the worker pool, training/pool.py), each
    cell stopping once above 0.92 (the LLaMA blocks by step 500 of the preset's 1,000; the check asks > 0.9)."""
    args = ("mqar", "--preset", "ci", "--device", "cpu", "--out", "run", "--no-progress", "--workers", "2")
    args += ("--set", "early_stop=0.92")
    out = cli(*args, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    records = [json.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 4 and "cells in run" in out.stdout and "d=64 |" in out.stdout
    assert len({r["config_hash"] for r in records}) == 4  # every cell recorded once, by the parent alone
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["summary"]["errors"] == [] and results["summary"]["cells"]["finished"] == 4
    best = {}
    for r in records:
        best[r["model"]] = max(best.get(r["model"], 0.0), r["value"])
    assert min(best.values()) > 0.9  # all four attention blocks learn the task (LLaMA ones too)
    assert len(best) == 4 and {"transformer-llama", "fox-llama-timescale-init"} <= set(best)
    assert (tmp_path / "run" / "accuracy_vs_dmodel.png").is_file()
    assert (tmp_path / "run" / "best.md").is_file()
    code, _, _ = cli_in_process(["plot", "mqar", "run", "--out", "plots"], tmp_path, monkeypatch, capsys)
    assert code == 0 and (tmp_path / "plots" / "accuracy_vs_state.pdf").is_file()


@pytest.mark.parametrize(
    "args, message",
    [
        (["mqar", "--preset", "nope"], "unknown MQAR preset"),
        (["mqar", "--d-model", "big"], "--d-model takes comma-separated numbers"),
        (["mqar", "--models", "no-such-model"], "unknown model 'no-such-model'"),
        (["mqar", "--attention", "magic"], "attention backend 'magic' is not offered"),
        (["mqar", "--set", "tie_heads=true"], "unknown MQAR sweep key(s): tie_heads"),
        (["mqar", "--set", "schedule=linear"], "schedule must be one of"),
        (["plot", "mqar", "/nonexistent"], "does not exist"),
    ],
)
def test_cli_errors_are_one_line(args, message, tmp_path, monkeypatch, capsys):
    code, _, err = cli_in_process(args, tmp_path, monkeypatch, capsys)
    assert code == 2, err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert not any(tmp_path.iterdir())  # a refused command leaves nothing behind


@pytest.mark.parametrize("preset", ["gsa-paper", "recipe-ablation", "fox-timescales", "zoology-fig2"])
def test_every_preset_builds_its_models(preset, tmp_path):
    """Each GPU preset's models build at every width and accept its attention backend (checked before any cell
    trains), so a new family with constraints of its own (DRT x2's two retrieval groups) cannot break a preset."""
    out = run_mqar(load_preset(preset), tmp_path, device="cpu", progress=False, time_limit=0)
    assert out["summary"]["cells"]["finished"] == 0 and len(out["summary"]["cells"]["pending"]) > 0


def test_a_cell_cut_short_resumes_from_its_snapshot(tmp_path):
    """The MQAR worker's handler snapshots a cell in training (here at every log step) under
    ``<run>/partial/<key>.pt``; a cell cut short (a GPU lease ending) resumes from it and ends with the uninterrupted
    cell's record; the snapshot goes."""
    from evalsuite.tasks.mqar.stack import Unit, unit_handler

    sweep = MQARSweep(**{**TINY_SWEEP, "max_steps": 40, "eval_every": 20, "early_stop": None})
    unit = Unit(tuple(sweep_cells(sweep)[:1]), (True,))
    partial = tmp_path / "partial"
    handler = unit_handler(sweep.to_dict(), "cpu", "auto", snapshot_dir=str(partial), snapshot_every_s=0.0)
    [want] = unit_handler(sweep.to_dict(), "cpu", "auto")(unit, lambda n: None)

    reported = []

    def cut_at_30(n):
        reported.append(n)
        if sum(reported) == 30:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        handler(unit, cut_at_30)
    assert [p.name for p in partial.iterdir()] == [f"{want['key']}.pt"]
    [got] = handler(unit, lambda n: None)
    assert not list(partial.iterdir()) and got["steps"] == want["steps"] == 40
    assert got["value"] == want["value"] and got["test_loss"] == want["test_loss"]
    assert [h["loss"] for h in got["history"]] == [h["loss"] for h in want["history"]]
