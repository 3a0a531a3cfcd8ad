"""A run directory under stress, with real processes: two runs on one directory, a holder killed with SIGKILL,
SIGTERM and Ctrl-C, a full disk, a corrupt record in the middle of ``records.jsonl``."""

import contextlib
import errno
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import assert_one_line_error

from evalsuite.errors import UserError
from evalsuite.runs.lock import LOCK_FILE, RunLock
from evalsuite.runs.store import append_jsonl, read_jsonl

# 6 NIAH cells of fox-pro-tiny, one generate call each: seconds in a fresh process, a fraction of one a cell
NIAH = ["niah", "--model", "fox-pro-tiny", "--lengths", "256,512", "--depths", "0,50,100", "--max-new-tokens", "8",
        "--batch-size", "1"]  # fmt: skip
CELLS = 6
HOLDER = """
import sys, time
from evalsuite.runs.lock import RunLock
lock = RunLock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(600)
"""

SNAPSHOT = """
import sys, torch
from pathlib import Path
from evalsuite.errors import UserError
from evalsuite.training.train import TrainResult, _save
model = torch.nn.Linear(64, 64)
try:
    _save(Path(sys.argv[1]), model, torch.optim.AdamW(model.parameters()), TrainResult(0, 0.0))
except UserError as e:
    print(e, end="")
"""


def start(out: Path, *extra: str, file_size: int | None = None) -> subprocess.Popen:
    """``python -m evalsuite niah ... --out out`` in a process of its own, SIGINT at its default (a test run in the
    background would hand it on ignored); ``file_size``: its RLIMIT_FSIZE in bytes."""

    def child() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if file_size is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (file_size, file_size))

    args = [sys.executable, "-m", "evalsuite", *NIAH, "--out", str(out), *extra]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child)


@contextlib.contextmanager
def held_elsewhere(directory: Path) -> Iterator[subprocess.Popen]:
    """Another process holding ``directory``'s lock during the block, killed with SIGKILL at its end (so its lock
    file stays behind, unlocked)."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.communicate()


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def wait_for(condition, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def keys(run: Path) -> list[str]:
    """The keys of ``run``'s records, in file order (a torn last line left out, as every reader does)."""
    return [r["key"] for r in read_jsonl(run / "records.jsonl")]


def stop_after(process: subprocess.Popen, run: Path, n: int) -> None:
    """Freeze ``process`` once ``run`` holds ``n`` records (mid-run: the grid has more)."""
    wait_for(lambda: len(keys(run)) >= n or process.poll() is not None, what=f"{n} records in {run}")
    process.send_signal(signal.SIGSTOP)
    assert process.poll() is None and n <= len(keys(run)) < CELLS, "the run ended before it could be stopped"


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, dict, dict]:
    """(run directory, results.json, records by key) of one uninterrupted run of the grid, in this process."""
    from evalsuite import cli

    out = tmp_path_factory.mktemp("clean") / "run"
    argv, sys.argv = sys.argv, ["evalsuite", *NIAH, "--out", str(out)]
    try:
        cli.main()  # a failure raises SystemExit
    finally:
        sys.argv = argv
    records = {r["key"]: r for r in read_jsonl(out / "records.jsonl")}
    return out, json.loads((out / "results.json").read_text()), records


def assert_same_as_clean(run: Path, clean: tuple[Path, dict, dict]) -> None:
    _, results, records = clean
    assert sorted(keys(run)) == sorted(records) and len(keys(run)) == CELLS  # every key once
    assert {r["key"]: r for r in read_jsonl(run / "records.jsonl")} == records
    again = json.loads((run / "results.json").read_text())
    assert again["records"] == results["records"] and again["summary"] == results["summary"]


# -- the lock ---------------------------------------------------------------------------------------------------


def test_a_run_directory_has_one_holder_at_a_time(tmp_path):
    lock = RunLock.acquire(tmp_path / "run")
    holder = json.loads((tmp_path / "run" / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    with pytest.raises(UserError, match=rf"run is in use by another run \(pid {os.getpid()} on .*choose another --out"):
        RunLock.acquire(tmp_path / "run")  # locks are per open file: this process's second claim is refused too
    lock.release()
    assert not (tmp_path / "run" / LOCK_FILE).exists()
    with RunLock.acquire(tmp_path / "run"):
        pass
    lock.release()  # idempotent


def test_the_lock_of_a_killed_holder_is_taken_over(tmp_path, capsys):
    with held_elsewhere(tmp_path) as holder, pytest.raises(UserError, match=rf"another run \(pid {holder.pid} on "):
        RunLock.acquire(tmp_path)
    assert (tmp_path / LOCK_FILE).exists()
    capsys.readouterr()
    with RunLock.acquire(tmp_path):
        assert f"took over from a run that ended without releasing it (pid {holder.pid} on" in capsys.readouterr().err
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()


def test_two_runs_started_together_on_one_directory_share_no_key(tmp_path, clean):
    """The second refuses in one line naming the first (or, started after the first ended, finds nothing left)."""
    runs = [start(tmp_path / "run"), start(tmp_path / "run")]
    ends = [finish(p) for p in runs]
    assert sorted(code for code, _, _ in ends) in ([0, 0], [0, 2]), ends
    for (code, _, err), other in zip(ends, reversed(runs), strict=True):
        if code == 2:
            assert_one_line_error(code, err, f"run is in use by another run (pid {other.pid} on ")
    assert_same_as_clean(tmp_path / "run", clean)


def test_every_writer_of_a_run_directory_takes_the_lock(tmp_path):
    """``bench generate`` and MQAR sweeps claim their directories through the same lock as the runner."""
    from evalsuite.bench.generate import bench_generate
    from evalsuite.tasks.mqar import run_mqar, sweep_from_options

    with RunLock.acquire(tmp_path / "bench"), pytest.raises(UserError, match="in use by another run"):
        bench_generate(tmp_path / "bench", models=["fox-pro-tiny"], lengths=[64], batches=[1], new_tokens=2,
                       copy_mib=1, verbose=False)  # fmt: skip
    with RunLock.acquire(tmp_path / "mqar"), pytest.raises(UserError, match="in use by another run"):
        run_mqar(sweep_from_options("ci"), tmp_path / "mqar", device="cpu", progress=False)
    assert not (tmp_path / "bench" / "config.json").exists() and not (tmp_path / "mqar" / "config.json").exists()


# -- signals ----------------------------------------------------------------------------------------------------


def test_sigterm_mid_run_saves_says_how_to_resume_and_resumes(tmp_path, run_cli, clean):
    run = tmp_path / "run"
    first = start(run)
    stop_after(first, run, 1)
    first.send_signal(signal.SIGTERM)  # what a scheduler sends first
    first.send_signal(signal.SIGCONT)
    code, _, err = finish(first)
    resume = f"interrupted by SIGTERM: what finished is saved in {run}; rerun the same command to resume\n"
    assert code == 143 and err == resume, err
    done = keys(run)
    assert len(done) == len(set(done)) < CELLS and not (run / LOCK_FILE).exists()  # intact, and the lock let go

    with held_elsewhere(run) as holder:
        pass
    code, _, err = run_cli([*NIAH, "--out", run], tmp_path)
    assert code == 0, err
    assert f"took over from a run that ended without releasing it (pid {holder.pid} on" in err
    assert_same_as_clean(run, clean)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads a process's signal handlers in /proc")
def test_ctrl_c_during_start_up_is_one_line_claiming_nothing(tmp_path):
    process = start(tmp_path / "run")

    def handlers_installed() -> bool:  # SigCgt: the signals with a handler; SIGTERM's comes from the entry point
        status = Path(f"/proc/{process.pid}/status").read_text()
        caught = int(next(line for line in status.splitlines() if line.startswith("SigCgt:")).split()[1], 16)
        return bool(caught & (1 << (signal.SIGTERM - 1)))

    wait_for(handlers_installed, what="the entry point's signal handlers")
    process.send_signal(signal.SIGINT)  # the model is not loaded yet: seconds before anything is written
    code, out, err = finish(process)
    assert code == 130 and err == "interrupted by SIGINT\n" and not out, err
    assert not (tmp_path / "run").exists()


# -- the disk ---------------------------------------------------------------------------------------------------


def test_a_full_disk_names_the_file_and_leaves_the_run_resumable(tmp_path, run_cli, clean):
    """RLIMIT_FSIZE makes a real write fail (EFBIG) once records.jsonl would pass 3,000 bytes (2 records and a
    part)."""
    run = tmp_path / "run"
    process = start(run, file_size=3000)
    code, _, err = finish(process)
    assert_one_line_error(code, err, f"cannot write {run / 'records.jsonl'}: File too large (EFBIG); make room")
    assert 0 < len(keys(run)) < CELLS  # what fitted, and a torn line the rerun cuts off
    code, _, err = run_cli([*NIAH, "--out", run], tmp_path)
    assert code == 0 and "dropped a torn last record" in err, err
    assert_same_as_clean(run, clean)


def test_no_space_left_names_the_file(tmp_path, monkeypatch, run_cli):
    """ENOSPC for real on /dev/full; a training snapshot (MQAR cells) past the file-size limit; an OSError of that
    kind from anywhere else is one line and status 2 too."""
    with pytest.raises(UserError, match=r"cannot write /dev/full: No space left on device \(ENOSPC\)"):
        append_jsonl(Path("/dev/full"), {"key": "a"})
    limit = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # noqa: E731
    snapshot = subprocess.run([sys.executable, "-c", SNAPSHOT, str(tmp_path / "cell.pt")], capture_output=True,
                              text=True, preexec_fn=limit)  # fmt: skip
    expected = f"cannot write {tmp_path / 'cell.pt'}: File too large (EFBIG); make room"
    assert snapshot.stdout.startswith(expected), snapshot.stdout + snapshot.stderr
    assert not list(tmp_path.iterdir())  # no partial file left
    from evalsuite.adapters.native import NativeAdapter

    def full(*args, **kwargs):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/data/cache.bin")

    monkeypatch.setattr(NativeAdapter, "token_nll", full)
    code, _, err = run_cli(["loss", "--model", "fox-pro-tiny", "--length", "16", "--out", tmp_path / "r"], tmp_path)
    assert_one_line_error(code, err, "cannot write /data/cache.bin: Disk quota exceeded (EDQUOT)")
    assert not (tmp_path / "r").exists()  # nothing finished: the directory the run created is gone


def test_a_corrupt_record_names_its_line_and_repair_redoes_it(tmp_path, run_cli, clean):
    run = tmp_path / "run"
    shutil.copytree(clean[0], run)
    (run / "results.json").unlink()  # as a run cut short leaves it
    lines = (run / "records.jsonl").read_text().splitlines(keepends=True)
    lines[3] = lines[3][:40] + "\x00garbage\n"
    (run / "records.jsonl").write_text("".join(lines))
    code, _, err = run_cli([*NIAH, "--out", run], tmp_path)
    assert_one_line_error(code, err, f"{run / 'records.jsonl'}:4: corrupt record (not valid JSON); rerun")
    assert "--repair" in err
    code, _, err = run_cli([*NIAH, "--out", run, "--repair"], tmp_path)
    assert code == 0 and "set aside 1 corrupt record line(s) (records.jsonl:4) in records.corrupt.txt" in err, err
    assert (run / "records.corrupt.txt").read_text() == lines[3]
    assert_same_as_clean(run, clean)
