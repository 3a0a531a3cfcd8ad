"""scripts/merge_mqar_records.py: sweeps run elsewhere folded into a committed sweep directory by cell."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "merge_mqar_records.py"
spec = importlib.util.spec_from_file_location("merge_mqar_records", SCRIPT)
merge_script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(merge_script)


def _write(path: Path, hashes: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"config_hash": h, "model": "m", "value": 0.5}) + "\n" for h in hashes))


def test_merge_takes_each_new_cell_once_from_records_and_rank_files(tmp_path, capsys):
    target, a, b = tmp_path / "committed", tmp_path / "runA", tmp_path / "runB"
    _write(target / "records.jsonl", ["c1", "c2"])
    _write(a / "records.jsonl", ["c1", "c2", "c3"])  # resumed from the committed records, one new cell
    _write(b / "records.rank-0.jsonl", ["c4"])  # an unmerged torchrun run
    _write(b / "records.rank-1.jsonl", ["c3", "c5"])  # c3 also in runA: taken once
    assert merge_script.main([str(target), str(a), str(b)]) == 0
    hashes = [json.loads(line)["config_hash"] for line in (target / "records.jsonl").read_text().splitlines()]
    assert hashes == ["c1", "c2", "c3", "c4", "c5"]
    assert "3 new record(s)" in capsys.readouterr().out
    assert merge_script.main([str(target), str(a), str(b)]) == 0  # a rerun adds nothing
    assert len((target / "records.jsonl").read_text().splitlines()) == 5


def test_merge_refuses_a_target_without_records(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        merge_script.merge(tmp_path / "nowhere", [tmp_path])


def test_merge_replace_puts_rerun_cells_in_place(tmp_path, capsys):
    """--replace: a rerun cell takes its old record's place (same cell, new value), new cells are appended, cells
    the sources lack stay as they were."""
    target, rerun = tmp_path / "committed", tmp_path / "rerun"
    _write(target / "records.jsonl", ["c1", "c2", "c3"])
    rerun.mkdir()
    (rerun / "records.jsonl").write_text(
        "".join(json.dumps({"config_hash": h, "model": "m", "value": 0.9}) + "\n" for h in ("c2", "c4"))
    )
    assert merge_script.main(["--replace", str(target), str(rerun)]) == 0
    records = [json.loads(line) for line in (target / "records.jsonl").read_text().splitlines()]
    assert [(r["config_hash"], r["value"]) for r in records] == [("c1", 0.5), ("c2", 0.9), ("c3", 0.5), ("c4", 0.9)]
    assert "2 new record(s) taken into" in capsys.readouterr().out
    assert merge_script.main([str(target), str(rerun)]) == 0  # without --replace: nothing new
    assert len((target / "records.jsonl").read_text().splitlines()) == 4
