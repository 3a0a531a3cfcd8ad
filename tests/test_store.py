"""Result-file primitives: atomic writes, durable JSONL appends, tolerant reads, config hashes."""

import pytest

from evalsuite.errors import UserError
from evalsuite.store import append_jsonl, atomic_write_json, config_hash, read_jsonl


def test_atomic_write_leaves_no_temp_files(tmp_path):
    atomic_write_json(tmp_path / "a" / "r.json", {"x": 1})
    atomic_write_json(tmp_path / "a" / "r.json", {"x": 2})
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["r.json"]
    assert (tmp_path / "a" / "r.json").read_text().strip().endswith("}")


def test_jsonl_torn_tail_and_corruption(tmp_path):
    path = tmp_path / "records.jsonl"
    for i in range(3):
        append_jsonl(path, {"i": i})
    with open(path, "a") as f:
        f.write('{"i": 3, "trunc')  # a crash mid-write
    assert [r["i"] for r in read_jsonl(path)] == [0, 1, 2]
    path.write_text('{"i": 0}\nnot json\n{"i": 2}\n')
    with pytest.raises(UserError, match="records.jsonl:2: corrupt"):
        read_jsonl(path)
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_config_hash_is_order_independent():
    assert config_hash({"a": 1, "b": [1, 2]}) == config_hash({"b": [1, 2], "a": 1})
    assert config_hash({"a": 1}) != config_hash({"a": 2})
