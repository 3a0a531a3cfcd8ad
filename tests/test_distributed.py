"""Data-parallel runs under torchrun (gloo on CPU): records identical to one process, rank files, resume with another
number of ranks after a rank is killed, commands that refuse several ranks, and the torchrun overhead script."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_one_line_error
from dist_driver import run_all
from test_longbench_task import write_fixture

from evalsuite.adapters.registry import load_adapter
from evalsuite.data.synthetic import synthetic_text
from evalsuite.errors import UserError
from evalsuite.runs.distributed import World
from evalsuite.runs.rundir import RunDir, ShardFollower, shard_files, shard_path
from evalsuite.tasks.niah import NiahConfig, run_niah
from evalsuite.tasks.runner import _check_shared

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
# One thread per process, as torchrun gives each of several ranks: OpenMP threads waiting on each other crawl when
# more processes than cores share a machine.
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The in-process reference runs on one thread too (the ranks' setting; its records are the same either way)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def torchrun(n: int, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([*TORCHRUN, "--nproc-per-node", str(n), *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**ENV, **kw.pop("env", {})}, **kw)  # fmt: skip


# -- rank files, without processes ------------------------------------------------------------------------------


def test_rank_files_merge_in_run_order_once(tmp_path):
    run = RunDir.claim(tmp_path / "run", "t", "h", {})
    run.append({"key": "a", "v": 1})  # an earlier run's record, rewritten below
    ranks = [RunDir(run.path, "t", "h", created=False, world=World(r, 2, r)) for r in (0, 1)]
    for key, rank in (("d", 1), ("b", 0), ("c", 1), ("a", 0)):
        ranks[rank].append({"key": key, "v": 2})
    assert [r["key"] for r in ranks[1].records()] == ["a", "d", "c"]  # records.jsonl and its own file only
    with open(shard_path(run.path, 1), "a") as f:
        f.write('{"key": "e", "v"')  # rank 1 was killed mid-write
    follower = ShardFollower(run.path)
    assert sorted(r["key"] for r in follower.poll()) == ["a", "b", "c", "d"] and follower.poll() == []
    assert run.merge_shards(order=["a", "b", "c", "d", "e"]) == 4 and not shard_files(run.path)
    lines = run.records_path.read_text().splitlines()
    assert [json.loads(x)["key"] for x in lines] == ["a", "a", "b", "c", "d"] and run.latest()["a"]["v"] == 2
    # a merge cut off after its replace leaves the rank files: taking them in again adds nothing
    shard_path(run.path, 0).write_text(lines[1] + "\n")
    assert run.merge_shards() == 0 and run.records_path.read_text().splitlines() == lines
    assert World(1, 3, 1).shard(list(range(8))) == [1, 4, 7]


def test_plain_run_takes_in_what_killed_ranks_finished(tmp_path, capsys):
    """A distributed run's rank files are resumed by a run with any number of ranks, none included."""
    adapter = load_adapter("fox-pro-tiny")
    config = NiahConfig(mode="easy", lengths=[300, 600], depths=[0, 100], max_new_tokens=2)
    ref = run_niah(adapter, config, tmp_path / "ref", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "ref" / "records.jsonl").read_text().splitlines()]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_bytes((tmp_path / "ref" / "config.json").read_bytes())
    kept = {**rows[2], "prediction": "finished by rank 1 before it died"}
    shard_path(tmp_path / "run", 1).write_text(json.dumps(kept) + "\n" + json.dumps(rows[3])[:20])
    capsys.readouterr()
    res = run_niah(adapter, config, tmp_path / "run", progress=False)
    assert "took in 1 records" in capsys.readouterr().err and not shard_files(tmp_path / "run")
    latest = RunDir(tmp_path / "run", "niah", "", False).latest()
    assert len(latest) == 4 and latest[kept["key"]]["prediction"] == kept["prediction"]  # kept, not redone
    assert {k: r for k, r in latest.items() if k != kept["key"]} == {r["key"]: r for r in rows if r != rows[2]}
    assert res["summary"]["skipped"] == ref["summary"]["skipped"]


def test_a_rank_that_does_not_see_the_run_directory_says_so(tmp_path):
    run = RunDir(tmp_path / "on-another-host", "niah", "h", created=False, world=World(3, 4, 3))
    with pytest.raises(UserError, match="rank 3 does not see .* filesystem they all share"):
        _check_shared(run, patience=0)
    RunDir.claim(run.path, "niah", "h", {})
    _check_shared(run, patience=0)


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "gca"], "`evalsuite bench` does not share its work among ranks"),
        (["longbench", "score", "x"], "`evalsuite longbench score` does not share"),
        (["models"], "run it without torchrun"),
    ],
)
def test_commands_that_do_not_shard_refuse_several_ranks(args, message, tmp_path, monkeypatch, run_cli):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "1"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, message)


def test_the_commands_that_share_come_from_the_task_registry():
    from evalsuite.cli.main import command_path, sharing_commands

    assert sharing_commands() == ["longbench", "loss", "mqar", "niah", "passkey", "summarize", "run"]
    assert command_path(["--debug", "longbench", "--data", "d", "score", "x"]) == ("longbench", "score")
    assert command_path(["longbench", "--model", "m"]) == ("longbench",) and command_path([]) == ()
    assert command_path(["bench", "gca", "--out", "b"]) == ("bench", "gca")


# -- torchrun ----------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    """(data folder, single-process reference runs of dist_driver.run_all)."""
    root = tmp_path_factory.mktemp("dist")
    docs = root / "data" / "docs"
    docs.mkdir(parents=True)
    for i in range(9):
        (docs / f"doc{i}.txt").write_text(synthetic_text(12 if i == 4 else 200, seed=i))
    write_fixture(root / "data" / "longbench")
    run_all(root / "data", root / "ref")
    return root / "data", root / "ref"


@pytest.mark.parametrize("ranks", [2, 3])
def test_ranks_write_the_records_of_one_process(ranks, fixtures, tmp_path):
    data, ref = fixtures
    proc = torchrun(ranks, ROOT / "tests" / "dist_driver.py", data, tmp_path)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-4000:]
    for task in ("niah", "loss", "longbench"):
        a, b = (json.loads((d / task / "results.json").read_text()) for d in (ref, tmp_path))
        assert b["records"] == a["records"] and b["summary"] == a["summary"], task
        assert b["config_hash"] == a["config_hash"] and b["provenance"]["world_size"] == ranks
        assert not shard_files(tmp_path / task) and b["run_dir"] == str(tmp_path / task)
    for task in ("niah", "longbench"):  # the same lines in the same order, byte for byte
        assert (tmp_path / task / "records.jsonl").read_bytes() == (ref / task / "records.jsonl").read_bytes()
    for name in ("loss_per_token", "count"):  # float64 sums added in corpus order: bit-identical
        assert np.array_equal(np.load(ref / "loss" / "loss_per_token.npz")[name],
                              np.load(tmp_path / "loss" / "loss_per_token.npz")[name])  # fmt: skip
    assert len(json.loads((ref / "longbench" / "results.json").read_text())["summary"]["scores"]) == 3


def _worker(parent: int, rank: int) -> int:
    """The pid of torchrun's worker of ``rank``."""
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                if f"RANK={rank}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                    return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no worker of rank {rank} under {parent}")


def test_killed_rank_loses_only_its_item_and_fewer_ranks_finish(tmp_path):
    lengths, depths = "500,800", "0,10,20,30,40,50,60,70,80,90,100"
    args = ["-m", "evalsuite", "niah", "--model", "fox-pro-tiny", "--mode", "standard", "--device", "cpu", "--lengths",
            lengths, "--depths", depths, "--max-new-tokens", "12", "--batch-size", "1", "--out"]  # fmt: skip
    config = NiahConfig(mode="standard", lengths=[500, 800], depths=[int(d) for d in depths.split(",")],
                        max_new_tokens=12, batch_size=1)  # fmt: skip
    run_niah(load_adapter("fox-pro-tiny"), config, tmp_path / "ref", progress=False)
    reference = {r["key"]: r for r in map(json.loads, (tmp_path / "ref" / "records.jsonl").read_text().splitlines())}

    run = tmp_path / "run"
    proc = torchrun(3, *args, run)

    def finished() -> list[str]:  # complete lines in the rank files
        return [x for p in shard_files(run) for x in p.read_text().split("\n")[:-1]]

    deadline = time.time() + 120
    while time.time() < deadline and len(finished()) < 4 and proc.poll() is None:
        time.sleep(0.01)
    os.kill(_worker(proc.pid, 1), signal.SIGKILL)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (run / "results.json").exists(), "the run finished before the kill"
    kept = finished()
    assert 4 <= len(kept) < 22
    # Mark one kept record: the rerun must take it in as it is, not generate that cell again.
    marked = json.loads(kept[0])
    path = next(p for p in shard_files(run) if kept[0] in p.read_text())
    path.write_text(path.read_text().replace(kept[0], json.dumps({**marked, "prediction": "kept"})))

    again = torchrun(2, *args, run, env={"FORCE_COLOR": "1", "COLUMNS": "150"})  # rank 0's bar, as on a terminal
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-4000:]
    assert f"took in {len(kept)} records" in err
    left = 22 - len(kept)
    assert re.search(rf"\b{left}/{left}\b", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)), err[-2000:]  # all ranks
    rows = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    assert len(rows) == len({r["key"] for r in rows}) == 22 and not shard_files(run)
    got = {r["key"]: r for r in rows}
    assert got.pop(marked["key"])["prediction"] == "kept"
    assert got == {k: r for k, r in reference.items() if k != marked["key"]}
    results = json.loads((run / "results.json").read_text())
    assert results["provenance"]["world_size"] == 2 and results["config_hash"] == marked["config_hash"]


def test_torchrun_overhead_script_matches_a_plain_run(tmp_path):
    out = subprocess.run([sys.executable, ROOT / "scripts" / "torchrun_overhead.py", "--out", tmp_path, "--device",
                          "cpu", "--length", "64", "--max-docs", "2"], capture_output=True, text=True, env=ENV,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-4000:]
    report = json.loads((tmp_path / "torchrun_overhead.json").read_text())
    assert report["records_identical"] and report["curve_identical"] and report["torchrun_world_size"] == 1
    assert report["plain_s"][0] > 0 and report["torchrun_s"][0] > 0 and report["device"] == "cpu"
