"""Result-file primitives: atomic writes, durable JSONL appends, tolerant reads, config hashes; claiming a run
directory."""

import json
import os
import stat

import pytest

from evalsuite.errors import UserError
from evalsuite.runs.rundir import RunDir
from evalsuite.runs.store import append_jsonl, atomic_write_bytes, atomic_write_json, config_hash, read_jsonl


def test_atomic_write_replaces_content_and_leaves_no_temp_files(tmp_path):
    path = tmp_path / "a" / "r.json"
    atomic_write_json(path, {"x": 1})
    assert json.loads(path.read_text()) == {"x": 1}
    atomic_write_json(path, {"x": 2, "y": [3]})
    assert json.loads(path.read_text()) == {"x": 2, "y": [3]}  # the second write's value, not the first
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["r.json"]
    atomic_write_bytes(path, "short")  # shorter than before: no leftover bytes of the old content
    assert path.read_bytes() == b"short"


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"])
def test_atomic_write_mode_follows_umask(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "new.json", {"x": 1})  # created
        (tmp_path / "old.json").write_text("{}")
        os.chmod(tmp_path / "old.json", 0o600)
        atomic_write_bytes(tmp_path / "old.json", b"{}")  # replaced
    finally:
        os.umask(old)
    for name in ("new.json", "old.json"):
        assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == mode, name


def test_atomic_write_mode_matches_plain_open(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_bytes(tmp_path / "atomic", b"x")
        with open(tmp_path / "plain", "wb") as f:
            f.write(b"x")
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(os.stat(tmp_path / n).st_mode) for n in ("atomic", "plain")}
    assert modes == {0o644}


def _write_raw(path, text):
    with open(path, "a") as f:
        f.write(text)


def test_torn_tail_is_cut_before_the_next_append(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    for i in range(3):
        append_jsonl(path, {"i": i})
    fragment = '{"i": 3, "trunc'
    _write_raw(path, fragment)  # a crash mid-write
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2]  # readers drop the torn line
    assert capsys.readouterr().err == ""
    append_jsonl(path, {"i": 4})  # the rerun's next record
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records.jsonl" in err and f"{len(fragment)} bytes" in err
    assert path.read_text() == "".join(json.dumps({"i": i}) + "\n" for i in (0, 1, 2, 4))
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 4]
    append_jsonl(path, {"i": 5})  # a further cycle: no error, no warning
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 4, 5]
    assert capsys.readouterr().err == ""


def test_torn_tail_longer_than_a_read_block_and_without_any_newline(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    append_jsonl(path, {"i": 0})
    _write_raw(path, '{"i": 1, "big": "' + "x" * 200_000)  # spans several backward reads
    append_jsonl(path, {"i": 2})
    assert [r["i"] for r in read_jsonl(path)] == [0, 2]
    assert "200017 bytes" in capsys.readouterr().err
    alone = tmp_path / "alone.jsonl"
    _write_raw(alone, '{"i": 0, "a')  # the only line is torn: the file is emptied
    append_jsonl(alone, {"i": 1})
    assert alone.read_text() == '{"i": 1}\n' and "11 bytes" in capsys.readouterr().err


def test_complete_last_line_without_newline_is_kept(tmp_path, capsys):
    path = tmp_path / "records.jsonl"
    for i in range(3):
        append_jsonl(path, {"i": i})
    _write_raw(path, '{"i": 3}')  # whole record, only the newline was lost
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 3]
    append_jsonl(path, {"i": 4})
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2, 3, 4]
    assert path.read_text().splitlines()[-2:] == ['{"i": 3}', '{"i": 4}']
    assert capsys.readouterr().err == ""  # nothing was dropped


def test_jsonl_corruption_names_file_and_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text('{"i": 0}\nnot json\n{"i": 2}\n')
    with pytest.raises(UserError, match="records.jsonl:2: corrupt"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_config_hash_is_order_independent():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})


def test_a_run_directory_keeps_one_configuration(tmp_path):
    """A claim by another configuration names the settings that differ; a directory holding run files but no
    manifest cannot say whose records they are, and is refused untouched."""
    run = RunDir.claim(tmp_path / "run", "t", "h1", {"lengths": [512], "seed": 0})
    run.append({"key": "a"})
    assert RunDir.claim(tmp_path / "run", "t", "h1", {"lengths": [512], "seed": 0}).latest() == {"a": {"key": "a"}}
    with pytest.raises(UserError, match=r"other settings \(lengths \[512\] there vs \[1024\]\); for another"):
        RunDir.claim(tmp_path / "run", "t", "h2", {"lengths": [1024], "seed": 0})
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "records.jsonl").write_text('{"key": "a"}\n')
    with pytest.raises(UserError, match="holds run files but no run manifest"):
        RunDir.claim(tmp_path / "old", "t", "h1", {})
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["records.jsonl"]
