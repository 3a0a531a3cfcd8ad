"""The LongBench task on a LongBench-format fixture: prompts, middle truncation, bad lines, resume, LongBench-E."""

import json
from pathlib import Path

import pytest
from conftest import assert_one_line_error

from evalsuite.adapters.registry import load_adapter
from evalsuite.data.longbench import read_task
from evalsuite.errors import UserError
from evalsuite.tasks.longbench import LongBenchConfig, build_prompt, default_max_length, load_spec, run_longbench

TASKS = ["qasper", "trec", "triviaqa", "lcc"]


def record(task: str, i: int, words: int = 60) -> dict:
    context = " ".join(f"w{j % 50}" for j in range(words)) + f" The answer is beacon{i}."
    classes = ["Location", "Entity"] if task == "trec" else None
    answers = ["Location"] if task == "trec" else [f"beacon{i}"]
    return {"input": f"What is the answer {i}?", "context": context, "answers": answers, "length": words + i * 3000,
            "all_classes": classes, "dataset": task, "language": "en", "_id": f"{task}-{i}"}  # fmt: skip


def write_fixture(root: Path, bad_lines: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for task in TASKS:
        for suffix in ("", "_e"):
            lines = [json.dumps(record(task, i)) for i in range(3)]
            if bad_lines and task == "qasper" and not suffix:
                lines.insert(1, '{"input": "no context"')  # torn JSON
                lines.insert(3, json.dumps({**record(task, 9), "answers": "not a list"}))
            (root / f"{task}{suffix}.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def adapter():
    return load_adapter("fox-pro-tiny")


def test_spec_has_the_official_21_tasks():
    spec = load_spec()
    assert len(spec["tasks"]) == 21 and len(spec["fox"]) == 14
    assert "asconcisely" in spec["tasks"]["narrativeqa"]["prompt"]  # upstream's typo, kept
    assert spec["tasks"]["lcc"]["prompt"] == "Please complete the code given below. \n{context}Next line of code:\n"
    assert {t: spec["tasks"][t]["max_new_tokens"] for t in ("gov_report", "hotpotqa", "trec")} == {
        "gov_report": 512,
        "hotpotqa": 32,
        "trec": 64,
    }
    assert [default_max_length(n) for n in (4096, 8192, 16384, 32768)] == [3500, 7500, 15500, 31500]


def test_bad_lines_are_named_and_skipped_or_fatal(tmp_path):
    data = write_fixture(tmp_path / "lb", bad_lines=True)
    with pytest.raises(UserError, match=r"qasper.jsonl:2: invalid JSON"):
        read_task(data, "qasper")
    records, bad = read_task(data, "qasper", on_bad_record="skip")
    assert len(records) == 3 and [r.line for r in records] == [1, 3, 5]
    assert len(bad) == 2 and "qasper.jsonl:4: field 'answers' must be list" in bad[1]
    with pytest.raises(UserError, match=r"narrativeqa.jsonl not found"):
        read_task(data, "narrativeqa")


def test_middle_truncation_keeps_both_ends(adapter, tmp_path):
    spec = load_spec()["tasks"]["qasper"]
    r = read_task(write_fixture(tmp_path / "lb"), "qasper")[0][0]
    long = type(r)(**{**r.__dict__, "context": "start " + "filler " * 3000 + "end"})
    prompt, n, truncated = build_prompt(spec["prompt"], long, adapter, 400, chat=False)
    assert truncated and prompt.startswith("You are given a scientific article") and prompt.endswith("Answer:")
    assert abs(n - 400) <= 4  # re-tokenised halves may differ by a few tokens, as upstream
    same, n_short, cut = build_prompt(spec["prompt"], r, adapter, 4000, chat=False)
    assert not cut and same == spec["prompt"].format(**r.fields())


def test_run_scores_resumes_and_writes_upstream_shape(adapter, tmp_path):
    data = write_fixture(tmp_path / "lb", bad_lines=True)
    config = LongBenchConfig(data=str(data), tasks=TASKS, on_bad_record="skip", first_line="fox")
    res = run_longbench(adapter, config, tmp_path / "run", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    assert len(rows) == 12 and len({r["key"] for r in rows}) == 12
    assert all(r["first_line"] == "fox" and 0 <= r["scores"]["score"] <= 1 for r in rows)
    assert set(res["summary"]["scores"]) == set(TASKS) and len(res["summary"]["skipped_records"]) == 2
    assert all(isinstance(v, float) for v in res["summary"]["scores"].values())
    assert {r["subtask"] for r in res["records"]} == set(TASKS) and all(r["n"] == 3 for r in res["records"])
    assert res["config"]["max_length"] == 15500  # fox-pro-tiny's max_length 16384
    again = run_longbench(adapter, config, tmp_path / "run", progress=False)  # nothing generated twice
    assert again["summary"]["scores"] == res["summary"]["scores"]
    assert len((tmp_path / "run" / "records.jsonl").read_text().splitlines()) == 12


def test_longbench_e_buckets(adapter, tmp_path):
    data = write_fixture(tmp_path / "lb")
    res = run_longbench(adapter, LongBenchConfig(data=str(data), tasks=["trec"], e=True), tmp_path / "e", False)
    assert set(res["summary"]["scores"]["trec"]) == {"0-4k", "4-8k", "8k+"}  # lengths 60, 3060, 6060
    assert {r["subtask"] for r in res["records"]} == {"trec@0-4k", "trec@4-8k", "trec@8k+"}


def test_cli_run_tables_and_errors(tmp_path, run_cli):
    data = write_fixture(tmp_path / "lb")
    args = ["longbench", "--model", "fox-pro-tiny", "--data", data, "--tasks", "trec,lcc", "--max-samples", "2"]
    code, out, err = run_cli([*args, "--out", tmp_path / "run"], tmp_path)
    assert code == 0, err
    assert (tmp_path / "run" / "longbench.csv").is_file() and "TREC" in out and "LCC" in out
    code, _, err = run_cli([*args[:-4], "--tasks", "narrativeqa"], tmp_path)
    assert_one_line_error(code, err, "narrativeqa.jsonl not found")
    code, _, err = run_cli(["longbench", "--model", "fox-pro-tiny", "--data", data, "--chat"], tmp_path)
    assert_one_line_error(code, err, "--chat needs a chat template")
    code, _, err = run_cli(["longbench", "--model", "fox-pro-tiny", "--data", data, "--tasks", "nope"], tmp_path)
    assert_one_line_error(code, err, "unknown LongBench task 'nope'")
    code, _, err = run_cli(["longbench", "--model", "fox-pro-tiny"], tmp_path)
    assert_one_line_error(code, err, "LongBench needs --data DIR")


def test_cli_scores_predictions_made_elsewhere(tmp_path, run_cli):
    """Upstream pred.py's layout in, upstream eval.py's result.json out (plus our tables)."""
    pred = tmp_path / "pred" / "some-model"
    pred.mkdir(parents=True)
    rows = [
        {"pred": "beacon1\nmore text", "answers": ["beacon1"], "all_classes": None, "length": 100},
        {"pred": "nothing", "answers": ["beacon2"], "all_classes": None, "length": 5000},
    ]
    (pred / "triviaqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    code, out, err = run_cli(["longbench", "score", pred], tmp_path)
    assert code == 0, err
    assert json.loads((pred / "result.json").read_text()) == {"triviaqa": 50.0}  # first line: F1 1 and 0
    code, out, err = run_cli(["longbench", "score", pred, "--e"], tmp_path)
    assert code == 0, err
    assert json.loads((pred / "result.json").read_text())["triviaqa"] == {"0-4k": 100.0, "4-8k": 0.0, "8k+": None}
    (pred / "triviaqa.jsonl").write_text('{"pred": "x", "answers": ["y"]\n')
    code, _, err = run_cli(["longbench", "score", pred], tmp_path)
    assert_one_line_error(code, err, "triviaqa.jsonl:1")
