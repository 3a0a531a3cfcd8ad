"""The papers' decode-cost cells from `evalsuite bench`, end to end on tiny cards: whole generate calls of several
lengths (`bench generate --call-tokens`) fill a latency figure in the shape of the GSA paper's Figure 4(c); DRT
against its Base LM (`bench drt-memory`) fills a ratio table in the shape of the GCA paper's Table 3 (demo items at CPU
sizes, the real benches); the real items' rows and settings."""

import json
import statistics

import pytest
from conftest import assert_one_line_error
from test_papers_run import column, item, row, rows_of, write_papers

from evalsuite.bench import generate as bench
from evalsuite.errors import UserError
from evalsuite.papers.found import Results, find
from evalsuite.papers.found_bench import BENCH_FINDERS
from evalsuite.papers.published import find_item, load_papers
from evalsuite.papers.recipes import BENCH_COMMANDS, at_each_length, bench_command, column_settings
from evalsuite.papers.render import our_rows

MODELS = ["gsa-tiny", "transformer-llama-tiny"]


def decode(new_tokens: int, length: int = 32, **more) -> dict:
    return {"kind": "bench", "op": "decode", "metric": "time", "length": length, "new_tokens": new_tokens, **more}


def test_whole_calls_of_each_length_fill_a_latency_figure(run_cli, tmp_path):
    """`--call-tokens 2` beside the calls of 1, 4 and 8 tokens: each count timed as whole calls; the figure's cell for
    N new tokens is the fastest path's median seconds of the N-token call."""
    out = tmp_path / "res" / "bench" / "generate"
    records = bench.bench_generate(out, models=MODELS, lengths=[32], batches=[1], new_tokens=8, call_tokens=[2],
                                   paths=["eager", "static"], copy_mib=8, warmup=False, repeats=1,
                                   verbose=False)  # fmt: skip
    assert len(records) == 4 and all(set(r["call_times_s"]) == {"1", "2", "4", "8"} for r in records)
    assert "Seconds per generate call" in (out / bench.MD_NAME).read_text()
    with pytest.raises(UserError, match="call_tokens"):  # another set of calls is another run's settings
        bench.bench_generate(out, models=MODELS, lengths=[32], batches=[1], new_tokens=8, call_tokens=[2, 6])
    with pytest.raises(UserError, match="--call-tokens must lie between 1 and --new-tokens"):
        bench.bench_generate(tmp_path / "x", models=MODELS, new_tokens=8, call_tokens=[9])

    columns = [column(f"d{n}", f"{n}", "lower", decode(n), "Decoding length") for n in (2, 4, 8)]
    rows = [row("Xfmr++", [None] * 3, "transformer-llama-tiny"), row("GSA", [None] * 3, "gsa-tiny"),
            row("GLA", [None] * 3)]  # fmt: skip
    papers = write_papers(tmp_path, [item("demo:figure1", columns, rows, needs="gpu")])
    code, text, err = run_cli(["paper", "render", "demo:figure1", "--papers", papers, "--results", "res", "-f", "csv"],
                              tmp_path)  # fmt: skip
    assert code == 0, err
    cells = rows_of(text)
    for model in MODELS:
        mine = [r for r in records if r["model"] == model]
        best = [min(statistics.median(r["call_times_s"][str(n)]) for r in mine) for n in (2, 4, 8)]
        assert cells[f"{model} (ours)"] == [f"{s:.2f}" for s in best]
    code, md, _ = run_cli(["paper", "render", "demo:figure1", "--papers", papers, "--results", "res"], tmp_path)
    assert "generate_bench.json (" in md and " path)" in md  # the source names the file and the path


def test_drt_against_its_base_lm_fills_a_ratio_table(run_cli, tmp_path):
    """`bench drt-memory` with the Base LM in the same run: rows of both models, the ratios DRT / Base LM per length
    and placement of the chunk store, and a table in Table 3's shape rendered from them."""
    args = ["bench", "drt-memory", "--model", "drt-tiny", "--base", "drt-base-lm-tiny", "--device", "cpu",
            "--lengths", "256,512", "--new-tokens", "4", "--rounds", "3", "--out", "res/bench/drt"]  # fmt: skip
    code, out, err = run_cli(args, tmp_path)
    assert code == 0, err
    doc = json.loads((tmp_path / "res" / "bench" / "drt" / "drt_memory.json").read_text())
    assert (doc["model"], doc["base"], doc["new_tokens"], doc["rounds"]) == ("drt-tiny", "drt-base-lm-tiny", 4, 3)
    rows = {(r["model"], r["length"], r["offload"]): r for r in doc["rows"]}
    assert len(rows) == 6 and doc["provenance"]["git_commit"]
    for length in (256, 512):
        base = rows[("drt-base-lm-tiny", length, False)]
        assert base["state_host_mib"] == 0 and base["state_device_bytes"] == 2 * 4 * 128 * 64 * 2  # windows, bf16
        for offload in (False, True):
            drt = rows[("drt-tiny", length, offload)]
            (ratio,) = [r for r in doc["ratios"] if (r["length"], r["offload"]) == (length, offload)]
            per_round = [a / b for a, b in zip(drt["ms_per_token_rounds"], base["ms_per_token_rounds"], strict=True)]
            assert len(per_round) == 3 and drt["ms_per_token"] == statistics.median(drt["ms_per_token_rounds"])
            assert ratio["time_per_token"] == pytest.approx(statistics.median(per_round))
            assert ratio["time_per_token_p20"] <= ratio["time_per_token"] <= ratio["time_per_token_p80"]
            assert ratio["cache_memory"] == pytest.approx(drt["state_device_bytes"] / base["state_device_bytes"])
            assert ratio["peak_memory"] is None  # no device peak on a CPU
        on, off = (rows[("drt-tiny", length, o)] for o in (False, True))
        assert on["state_device_bytes"] > off["state_device_bytes"] > base["state_device_bytes"]
    assert "DRT / Base LM" in (tmp_path / "res" / "bench" / "drt" / "drt_memory.md").read_text()

    def ratio(metric: str, offload: bool) -> dict:
        counts = {"length": {"column": "prompt"}, "new_tokens": {"column": "generated"}}
        return {"kind": "bench", "op": "decode", "metric": metric, **counts, "offload": offload}

    columns = [column("prompt", "Prompt #tokens", None), column("generated", "Generated #tokens", None),
               column("t_on", "time/token", "lower", ratio("time", True), "w/ cpu offload"),
               column("m_on", "mem. cost", "lower", ratio("memory", True), "w/ cpu offload"),
               column("t_off", "time/token", "lower", ratio("time", False), "w/o cpu offload"),
               column("m_off", "mem. cost", "lower", ratio("memory", False), "w/o cpu offload")]  # fmt: skip
    rows_ = [row("DRT / Base LM", ["256", "4", "1.25×", "1.54×", "1.06×", "4.08×"], "drt-tiny"),
             row("DRT / Base LM", ["512", "4", "1.27×", "1.62×", "1.08×", "9.41×"], "drt-tiny")]  # fmt: skip
    papers = write_papers(tmp_path, [item("demo:table1", columns, rows_, needs="gpu", marks="none")])
    render = ["paper", "render", "demo:table1", "--papers", papers, "--results", "res", "-f", "csv"]
    code, text, err = run_cli(render, tmp_path)
    assert code == 0, err
    lines = [line.split(",") for line in text.splitlines()]
    ours = [cells[2:] for cells in lines if cells[0] == "ours"]
    deltas = [cells[2:] for cells in lines if cells[0] == "ours − paper"]
    assert [cells[:2] for cells in ours] == [["256", "4"], ["512", "4"]] == [cells[:2] for cells in deltas]
    for cells, length in zip(ours, (256, 512), strict=True):
        by = {r["offload"]: r for r in doc["ratios"] if r["length"] == length}
        expected = [by[True]["time_per_token"], by[True]["cache_memory"], by[False]["time_per_token"],
                    by[False]["cache_memory"]]  # fmt: skip
        assert cells[2:] == [f"{v:.2f}×" for v in expected]

    bad = [(["--base", "drt-tiny"], "--base drt-tiny is not a Base LM card"),
           (["--model", "drt-base-lm-tiny"], "--model drt-base-lm-tiny is not a DRT card with retrieval")]  # fmt: skip
    for extra, message in bad:
        code, _, err = run_cli([*args[:-2], "--out", "elsewhere", *extra], tmp_path)
        assert_one_line_error(code, err, message)


def test_the_papers_decode_items_and_their_commands(tmp_path):
    """GCA's Table 3 takes its prompt and generated tokens from two columns: our rows are one per setting the paper
    prints, showing it; GSA's Figure 4(c) names the 1.3B Transformer card; each bench op a finder reads has a
    command."""
    papers = load_papers()
    table3 = find_item(papers, "gca:table3")
    settings = column_settings(table3)
    assert settings == [(("prompt_tokens", "16K"), ("generated_tokens", "128")),
                        (("prompt_tokens", "48K"), ("generated_tokens", "128"))]  # fmt: skip
    recipe = table3.columns[table3.index("offload_mem")].recipe
    assert [(r["length"], r["new_tokens"]) for r in at_each_length(table3, recipe)] == [(16384, 128), (49152, 128)]
    command = "evalsuite bench drt-memory --model drt --base drt-base-lm --lengths 16384,49152 --new-tokens 128"
    assert bench_command(recipe, at_each_length(table3, recipe)) == command
    ours = our_rows(table3, ["drt"], Results(tmp_path, (), ()))
    assert [o.values[:2] for o in ours] == [("16K", "128"), ("48K", "128")]
    assert all(v is None for o in ours for v in o.values[2:])
    figure = find_item(papers, "gsa:figure4c")
    assert [r.model for r in figure.rows if r.model] == ["transformer-llama-1.3b", "gsa"]
    every = [r for c in figure.columns for r in at_each_length(figure, c.recipe)]
    command = "evalsuite bench generate --batches 1 --lengths 2048 --new-tokens 16384 --call-tokens 2048,4096,8192"
    assert bench_command(figure.columns[0].recipe, every) == command  # one run measures all four columns
    assert find(Results(tmp_path, (), ()), decode(2048, 2048), "gsa") is None
    assert set(BENCH_FINDERS) <= {op for op, command in BENCH_COMMANDS.items() if command}
