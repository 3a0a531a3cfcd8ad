"""`evalsuite paper run` to `paper render`, end to end on tiny models: a LongBench table on a local fixture, an
lm-eval table on local task files (through the real lm-eval bridge, offline), a per-token loss figure; a rerun
does no new work; the refusals (a text-only model for token-level columns, a GPU column on a CPU, missing data);
and the figures drawn from the committed MQAR and kernel records."""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import assert_one_line_error

from evalsuite.papers.figures import bench_records, speed_figure
from evalsuite.papers.numbers import NumberFormat

ROOT = Path(__file__).resolve().parent.parent
TINY = "fox-pro-tiny"
LONGBENCH = ["trec", "triviaqa", "hotpotqa"]  # short generations (64, 32, 32 tokens): seconds on a CPU


def item(item_id: str, columns: list[dict], rows: list[dict], **fields) -> dict:
    """An item of a demo paper in the format of docs/paper-tables.md."""
    return {"id": item_id, "kind": item_id.split(":")[1].rstrip("0123456789"), "number": "1",
            "caption": "A demo item for the tests.", "columns": columns, "rows": rows, "averages": [],
            "footnotes": [], "marks": "best_second", "needs": "dataset", **fields}  # fmt: skip


def column(key: str, label: str, better: str | None, recipe: dict | None = None, group: str | None = None) -> dict:
    return {"key": key, "label": label, "group": group, "better": better, "unit": None, "recipe": recipe}


def row(label: str, values: list, model: str | None = None) -> dict:
    return {"label": label, "group": None, "model": model, "scale": "tiny", "source": None, "values": values}


def write_papers(root: Path, items: list[dict]) -> Path:
    folder = root / "papers"
    folder.mkdir(exist_ok=True)
    paper = {"paper": "demo", "title": "Demo", "arxiv": "0000.00000", "items": items}
    (folder / "demo.yaml").write_text(yaml.safe_dump(paper, allow_unicode=True, sort_keys=False))
    return folder


def rows_of(csv_text: str) -> dict[str, list[str]]:
    """label -> cells of a rendered CSV (its columns: source, row label, cells)."""
    return {row[1]: row[2:] for row in csv.reader(io.StringIO(csv_text)) if len(row) > 2 and row[0]}


def longbench_fixture(root: Path) -> Path:
    root.mkdir()
    for task in LONGBENCH:
        trec = task == "trec"
        for i in range(2):
            record = {"input": f"Question {i}?", "context": f"The answer is beacon{i}. " * 4, "length": 40,
                      "answers": ["Location"] if trec else [f"beacon{i}"], "all_classes": ["Location", "Entity"]
                      if trec else None, "dataset": task, "language": "en", "_id": f"{task}-{i}"}  # fmt: skip
            with (root / f"{task}.jsonl").open("a") as f:
                f.write(json.dumps(record) + "\n")
    return root


def test_a_longbench_table_from_run_to_render_and_a_rerun_does_nothing_new(run_cli, tmp_path):
    columns = [column(t, t.upper(), "higher", {"kind": "longbench", "dataset": t, "first_line": "fox"},
                      "Few-shot" if t != "hotpotqa" else "Multi-Doc") for t in LONGBENCH]  # fmt: skip
    rows = [row("Tiny twin", ["10.5", "2.0", "1.25"], TINY), row("Other", ["20.0", None, "0.5"])]
    papers = write_papers(tmp_path, [item("demo:table1", columns, rows)])
    data = longbench_fixture(tmp_path / "lb")
    run = ["paper", "run", "demo:table1", "--models", TINY, "--longbench-data", data, "--results", "res", "--limit",
           "1", "--papers", papers, "--device", "cpu"]  # fmt: skip
    code, out, err = run_cli(run, tmp_path)
    assert code == 0, err
    (run_dir,) = (tmp_path / "res" / "runs" / "longbench").iterdir()
    assert f"{TINY} longbench: res/runs/longbench/{run_dir.name}" in out
    results = json.loads((run_dir / "results.json").read_text())
    assert results["config"]["first_line"] == "fox" and results["config"]["tasks"] == LONGBENCH
    scores = results["summary"]["scores"]
    records = (run_dir / "records.jsonl").read_bytes()
    assert len(records.splitlines()) == 3  # --limit 1: one record per task

    code, out, err = run_cli(run, tmp_path)  # the rerun finds the directory by its config hash: no new record
    assert code == 0, err
    assert (run_dir / "records.jsonl").read_bytes() == records

    render = ["paper", "render", "demo:table1", "--results", "res", "--papers", papers]
    code, out, err = run_cli([*render, "--format", "csv"], tmp_path)
    assert code == 0, err
    cells = rows_of(out)
    fmt = NumberFormat(decimals=2, trim=True)  # the fixture's printed cells: "10.5" beside "1.25"
    assert cells[f"{TINY} (ours)"] == [fmt.format(scores[t]) for t in LONGBENCH]
    assert cells[f"{TINY} − Tiny twin"] == [fmt.format(scores[t] - p, signed=True)
                                           for t, p in zip(LONGBENCH, (10.5, 2.0, 1.25), strict=True)]  # fmt: skip
    assert cells["Other"] == ["20.0", "", "0.5"]
    code, md, err = run_cli([*render, "--models", TINY, "--out", "out"], tmp_path)
    assert code == 0, err
    assert f"{TINY}: FoX (Pro) block, tiny CPU twin" in md and "beside the paper's row 'Tiny twin': tiny" in md
    assert f"{TINY} values from {run_dir.relative_to(tmp_path)}" in md
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["demo-table1.csv", "demo-table1.md",
                                                                   "demo-table1.tex"]  # fmt: skip


def test_an_lm_eval_table_from_run_to_render_through_the_bridge(run_cli, tmp_path):
    """Local task files (lm-eval's own YAML format over JSONL), the lm-eval recipes of a table, `paper run` in a
    subprocess with no network, then `paper render`: our cells are lm-eval's metrics (accuracy ×100) and the average
    column the mean the table defines."""
    from test_lm_eval_bridge import MC_DOCS, PPL_DOCS, offline_run, task_yaml, write_jsonl

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    mc = 'output_type: multiple_choice\ndoc_to_text: "{{question}}"\ndoc_to_choice: "{{choices}}"\n'
    mc += 'doc_to_target: "{{answer}}"\ntarget_delimiter: ""\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n'
    ppl = 'output_type: loglikelihood_rolling\ndoc_to_text: ""\ndoc_to_target: "{{text}}"\nmetric_list:\n'
    ppl += "  - metric: word_perplexity\n"
    (tasks / "mc.yaml").write_text(task_yaml("es_mc", write_jsonl(tmp_path / "mc.jsonl", MC_DOCS), mc))
    (tasks / "ppl.yaml").write_text(task_yaml("es_ppl", write_jsonl(tmp_path / "ppl.jsonl", PPL_DOCS), ppl))

    def lm(task: str, metric: str, key: str, label: str, better: str) -> dict:
        return column(key, label, better, {"kind": "lm-eval", "task": task, "metric": metric, "shots": 0})

    columns = [
        lm("es_ppl", "word_perplexity", "ppl", "Wiki. ppl", "lower"),
        lm("es_mc", "acc", "acc", "acc", "higher"),
        lm("es_mc", "acc_norm", "accn", "acc-n", "higher"),
        column("avg", "Avg", "higher"),
    ]
    rows = [row("Tiny", ["12.00", "50.00", "25.00", "37.50"], TINY)]
    averages = [{"column": "avg", "of": ["acc", "accn"], "how": "mean"}]
    papers = write_papers(tmp_path, [item("demo:table1", columns, rows, averages=averages)])
    run = ["evalsuite", "paper", "run", "demo:table1", "--models", TINY, "--papers", papers, "--results", "res",
           "--lm-eval-include", tasks, "--no-lm-eval-builtin", "--device", "cpu"]  # fmt: skip
    offline_run(run, tmp_path)
    (run_dir,) = (tmp_path / "res" / "runs" / "lm-eval").iterdir()
    lines = (run_dir / "records.jsonl").read_text().splitlines()
    metrics = {json.loads(line)["subtask"]: json.loads(line)["metrics"] for line in lines}
    code, out, err = run_cli(["paper", "render", "demo:table1", "--papers", papers, "--results", "res", "--format",
                              "csv"], tmp_path)  # fmt: skip
    assert code == 0, err
    acc, accn = 100 * metrics["es_mc"]["acc"], 100 * metrics["es_mc"]["acc_norm"]
    expected = [metrics["es_ppl"]["word_perplexity"], acc, accn, (acc + accn) / 2]
    assert rows_of(out)[f"{TINY} (ours)"] == [f"{v:.2f}" for v in expected]

    # a text-only API model: refused before its run, by what the lm-eval tasks' requests need
    refused = subprocess.run(
        [sys.executable, "-m", *map(str, run[:5]), "openai:gpt-x,base_url=http://127.0.0.1:9/v1", *map(str, run[6:])],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
             "HF_DATASETS_CACHE": str(tmp_path / "hf_datasets")},
    )  # fmt: skip
    last = refused.stderr.strip().splitlines()[-1]  # lm-eval logs its own warnings about the task files first
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert last == ("error: lm-eval task es_ppl (loglikelihood_rolling) needs token-level access (logits over token "
                    "ids), which model gpt-x does not give (it offers: generate)")  # fmt: skip


def test_a_loss_figure_from_run_to_render_and_drawn(run_cli, tmp_path):
    recipe = {"kind": "loss", "dataset": "synthetic", "metric": "ppl"}  # the built-in corpus: no --loss-data
    columns = [column(f"l_{n}", str(n), "lower", {**recipe, "length": n}) for n in (64, 128)]
    papers = write_papers(tmp_path, [item("demo:figure1", columns, [row("A curve", [None, None])], needs="training")])
    code, out, err = run_cli(["paper", "run", "demo:figure1", "--models", TINY, "--results", "res", "--limit", "2",
                              "--papers", papers, "--device", "cpu"], tmp_path)  # fmt: skip
    assert code == 0, err
    (run_dir,) = (tmp_path / "res" / "runs" / "loss").iterdir()
    ppl = {r["length"]: r["value"] for r in json.loads((run_dir / "results.json").read_text())["records"]
           if r["metric"] == "perplexity"}  # fmt: skip
    code, out, err = run_cli(["paper", "render", "demo:figure1", "--results", "res", "--papers", papers, "--format",
                              "csv", "--out", "figs"], tmp_path)  # fmt: skip
    assert code == 0, err
    assert rows_of(out)[f"{TINY} (ours)"] == [f"{ppl[64]:.2f}", f"{ppl[128]:.2f}"]
    assert (tmp_path / "figs" / "demo-figure1.png").stat().st_size > 10_000
    assert "wrote figs/demo-figure1.pdf" in out


def test_loss_columns_of_two_texts_at_each_rows_length(run_cli, tmp_path):
    """Columns of two evaluation texts, measured at each row's length (GCA Table 1's form): one loss run per text
    found by its name in --loss-data, our rows one per row length, each cell that text's P(l) at that length, and the
    difference against the paper's row of the same model and length."""
    texts = tmp_path / "texts"
    texts.mkdir()
    for name, word in (("alpha", "river"), ("beta", "stone lantern")):
        (texts / f"{name}.jsonl").write_text("".join(json.dumps({"text": f"The {word} {i}. " * 80}) + "\n"
                                                     for i in range(2)))  # fmt: skip
    columns = [column(n, n, "lower", {"kind": "loss", "dataset": n, "length": "row", "metric": "ppl"})
               for n in ("alpha", "beta")]  # fmt: skip
    rows = [{**row(f"Tiny at {n}", ["5.00", "6.00"], TINY), "length": n} for n in (64, 128)]
    papers = write_papers(tmp_path, [item("demo:table1", columns, rows, needs="training")])
    code, out, err = run_cli(["paper", "run", "demo:table1", "--models", TINY, "--results", "res", "--papers", papers,
                              "--loss-data", texts, "--device", "cpu"], tmp_path)  # fmt: skip
    assert code == 0, err
    ppl = {}
    for run_dir in (tmp_path / "res" / "runs" / "loss").iterdir():
        results = json.loads((run_dir / "results.json").read_text())
        assert results["config"]["length"] == 128  # the longest row length: P(64) is on the same curve
        ppl[Path(results["config"]["data"]).stem] = {r["length"]: r["value"] for r in results["records"]
                                                     if r["metric"] == "perplexity"}  # fmt: skip
    assert sorted(ppl) == ["alpha", "beta"] and ppl["alpha"][64] != ppl["beta"][64]
    code, out, err = run_cli(["paper", "render", "demo:table1", "--results", "res", "--papers", papers, "--format",
                              "csv"], tmp_path)  # fmt: skip
    assert code == 0, err
    cells = rows_of(out)
    for n in (64, 128):
        assert cells[f"{TINY} (ours, {n} tokens)"] == [f"{ppl['alpha'][n]:.2f}", f"{ppl['beta'][n]:.2f}"]
        expected = [f"{ppl['alpha'][n] - 5:+.2f}", f"{ppl['beta'][n] - 6:+.2f}"]
        assert cells[f"{TINY} − Tiny at {n}"] == expected


def test_refusals_are_one_line(run_cli, tmp_path):
    text_only = "openai:gpt-x,base_url=http://127.0.0.1:9/v1"  # never contacted: refused before any request
    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "longcrawl64-heldout.txt").write_text("A held-out document. " * 50)
    table3 = ["paper", "run", "fox:table3", "--results", "res"]
    code, _, err = run_cli([*table3, "--models", text_only, "--loss-data", texts], tmp_path)
    assert_one_line_error(code, err, "fox:table3: model gpt-x gives no token-level scores (a text-only model)")
    assert not (tmp_path / "res").exists()
    code, _, err = run_cli(["paper", "run", "fox:table6", "--models", "fox-pro", "--device", "cpu"], tmp_path)
    assert_one_line_error(code, err, "column 'Throughput (tokens/sec)' (bench train_step throughput) is measured on a")
    code, _, err = run_cli(["paper", "run", "fox:table2", "--models", TINY], tmp_path)
    assert_one_line_error(code, err, "fox:table2 needs longbench data: --longbench-data DIR")
    code, _, err = run_cli(["paper", "run", "fox:table3"], tmp_path)
    assert_one_line_error(code, err, "fox:table3: name the models to run with --models")
    code, _, err = run_cli([*table3, "--models", TINY], tmp_path)  # the paper's text, LongCrawl64, is not given
    assert_one_line_error(code, err, "fox:table3 needs the loss text 'longcrawl64-heldout': --loss-data DIR")
    (texts / "longcrawl64-heldout.jsonl").write_text("")
    code, _, err = run_cli([*table3, "--models", TINY, "--loss-data", texts], tmp_path)
    assert_one_line_error(
        code, err, "holds 2 files named longcrawl64-heldout/ or longcrawl64-heldout.<suffix>, not one"
    )
    code, _, err = run_cli(["paper", "run", "gca:table2b", "--models", TINY, "--summarize-data", texts], tmp_path)
    assert_one_line_error(code, err, f"gca:table2b needs the summarize text 'xsum': {texts} holds 0 files named xsum")
    assert not (tmp_path / "res").exists()
    code, out, err = run_cli(["paper", "run", "fox:table4", "--models", "fox-pro"], tmp_path)
    assert code == 0 and "fox:table4: nothing to run (its columns come from the model cards)" in out


@pytest.mark.skipif(not (ROOT / "results" / "mqar").is_dir(), reason="the committed MQAR records are absent")
def test_gsa_figure_3a_from_the_committed_mqar_sweep(run_cli, tmp_path):
    """The best accuracy over learning rates of each model and width, from the preset's own cells, equals the
    committed sweep's table (results/mqar/gsa-paper-zoology-recipe/best.csv), as a percentage."""
    committed = list(csv.DictReader((ROOT / "results/mqar/gsa-paper-zoology-recipe/best.csv").open()))
    code, out, err = run_cli(["paper", "render", "gsa:figure3a", "--results", ROOT / "results", "--format", "csv",
                              "--out", "figs"], tmp_path)  # fmt: skip
    assert code == 0, err
    cells = rows_of(out)
    series = ["GSA", "Mamba", "GLA", "RetNet", "HGRN2"]  # the paper's, printed without a point: nothing to subtract
    assert sorted(cells) == sorted([f"{r['model']} (ours)" for r in committed] + ["Model", *series])
    assert all(cells[name] == [""] * 4 for name in series)
    for row in committed:
        ours = [float(v) for v in cells[f"{row['model']} (ours)"]]
        assert ours == pytest.approx([100 * float(row[f"d={d}"]) for d in (64, 128, 256, 512)], abs=0.006)
    assert (tmp_path / "figs" / "gsa-figure3a.png").stat().st_size > 10_000


@pytest.mark.skipif(not (ROOT / "results" / "smollm2" / "niah").is_dir(), reason="the committed NIAH run is absent")
def test_a_niah_figure_from_a_committed_run(run_cli, tmp_path):
    """A figure of NIAH columns: per length, the mean score over the needle depths of the committed SmolLM2 run, and
    the heatmaps in the FoX paper's layout."""
    columns = [column(f"l_{n}", str(n), "higher", {"kind": "niah", "mode": "easy", "length": n}) for n in (1000, 8000)]
    papers = write_papers(tmp_path, [item("demo:figure1", columns, [row("A model", [None, None])], needs="weights")])
    code, out, err = run_cli(["paper", "render", "demo:figure1", "--results", ROOT / "results" / "smollm2",
                              "--papers", papers, "--format", "csv", "--out", "figs"], tmp_path)  # fmt: skip
    assert code == 0, err
    assert rows_of(out)["SmolLM2-135M-Instruct.Q4_1 (ours)"] == ["10.00", "7.00"]  # the mean score over 9 depths
    assert (tmp_path / "figs" / "demo-figure1.png").stat().st_size > 10_000


@pytest.mark.skipif(not (ROOT / "results" / "kernels").is_dir(), reason="the committed kernel records are absent")
def test_kernel_speed_against_length_from_the_committed_bench_records(tmp_path):
    records = bench_records(ROOT / "results" / "kernels" / "fox-attention")
    assert {r["provider"] for r in records} == {"fox_triton", "triton_causal", "sdpa_causal", "fla_forgetting"}
    assert {r["T"] for r in records} == {1024, 2048, 4096, 8192, 16384, 32768, 65536}
    png, pdf = speed_figure(records, tmp_path / "speed")
    assert png.stat().st_size > 10_000 and pdf.suffix == ".pdf"
    assert bench_records(ROOT / "results" / "kernels" / "fox-attention", ops=["lightning"]) == []
