"""The run directory: one evaluation's files, and the promises it keeps.

A run directory holds ``config.json`` (the manifest: task, config hash, config), ``records.jsonl`` (one line per
finished item, appended as items finish, keyed by ``record["key"]``), ``results.json`` (the aggregate, written
atomically at the end) and any files a task keeps beside them (e.g. the loss task's ``state.npz``).

* **Claiming.** A directory belongs to one configuration: a run with another config hash is refused with one line
  naming the settings that differ, and so is a directory holding run files without a manifest.
* **One writer.** A run writes through :func:`writing`, which holds the directory's lock
  (:class:`~evalsuite.runs.lock.RunLock`) from before the claim to its last write: a second run on it is refused in
  one line naming the holder, and a lock a killed run left is taken over.
* **Resume.** :meth:`RunDir.latest` gives the records by key, a later line replacing an earlier one (a re-judged
  answer); a rerun skips what is there. Appends repair a torn tail first (:func:`evalsuite.runs.store.append_jsonl`).
  A corrupt line elsewhere stops the run naming it; a claim with ``repair`` sets such lines aside in
  ``records.corrupt.txt``, so their items run again.
* **Interrupts.** An :class:`~evalsuite.errors.Interrupted` (SIGINT, SIGTERM) leaving :func:`writing` gains a note
  of what the directory kept and how to resume.
* **No litter.** A run that fails before writing anything removes the directory it created
  (:meth:`RunDir.abandon`), so a failed validation never leaves a claimed directory behind.
* **Ranks.** Under torchrun (:mod:`evalsuite.runs.distributed`) with several ranks each rank appends to its own
  ``records.rank-<r>.jsonl`` (no two processes ever write one file), and rank 0 folds them into ``records.jsonl``
  atomically when the run ends (:meth:`RunDir.merge_shards`). Shards a killed run left behind are folded in when
  the directory is next claimed, by a run with any number of ranks (one included), so nothing a rank finished is lost.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from evalsuite.errors import Interrupted, UserError
from evalsuite.runs.distributed import SINGLE, World
from evalsuite.runs.lock import LOCK_FILE, RunLock
from evalsuite.runs.store import (
    RECORDS_FILE,
    REPAIR_HINT,
    RESULTS_FILE,
    append_jsonl,
    atomic_write_bytes,
    atomic_write_json,
    read_json_file,
    read_jsonl,
    set_aside_corrupt,
)

MANIFEST_FILE = "config.json"
SHARD_PREFIX = "records.rank-"  # records.rank-<r>.jsonl: what rank r appended during a distributed run
CORRUPT_FILE = "records.corrupt.txt"  # the lines a repair set aside, as they were


def shard_path(path: Path, rank: int) -> Path:
    return Path(path) / f"{SHARD_PREFIX}{rank}.jsonl"


def shard_files(path: Path) -> list[Path]:
    """The rank files in ``path``, in rank order."""
    found = []
    for p in Path(path).glob(f"{SHARD_PREFIX}*.jsonl"):
        rank = p.name[len(SHARD_PREFIX) : -len(".jsonl")]
        if rank.isdigit():
            found.append((int(rank), p))
    return [p for _, p in sorted(found)]


def check_writable(path: Path) -> None:
    """UserError unless ``path`` (a directory, existing or not) can be created and written to."""
    probe = Path(path)
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"cannot write to {path}: {probe} is not a directory")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to {path}: {probe} is not writable")


class RunDir:
    """One run's directory; a writer takes it with :func:`writing` (under torchrun, rank 0 for all ranks).

    ``world``: this process's :class:`~evalsuite.runs.distributed.World`. With several ranks :meth:`append` writes
    this rank's own file and :meth:`records` reads ``records.jsonl`` plus that file only, so every rank computes the
    same pending work from the same records whatever the others are appending meanwhile; a plain run (one rank)
    appends to ``records.jsonl`` itself.
    """

    def __init__(self, path: Path, task: str, config_hash: str, created: bool, world: World = SINGLE):
        self.path, self.task, self.config_hash, self._created = Path(path), task, config_hash, created
        self.world = world

    @classmethod
    def claim(
        cls, path: Path | str, task: str, config_hash: str, config: dict, outputs: tuple[str, ...] = ()
    ) -> RunDir:
        """Take ``path`` for a run of ``task`` with ``config_hash`` (``config``: what it hashes, shown when another
        run's differs), taking in the rank files an interrupted distributed run left there. ``outputs``: the names
        of files such a run writes besides records and results (a directory holding one without a manifest is
        refused too). A writer claims through :func:`writing`, which also holds the directory's lock."""
        path = Path(path)
        check_writable(path)
        run = cls(path, task, config_hash, not path.exists())
        run._take(config, outputs, repair=False)
        return run

    def _take(self, config: dict, outputs: tuple[str, ...], repair: bool) -> None:
        """:meth:`claim`'s work once the directory is known to be writable; ``repair``: first set aside the record
        lines that are not valid JSON."""
        path, manifest = self.path, self.path / MANIFEST_FILE
        if manifest.exists():
            old = read_json_file(manifest, "run manifest")
            if old.get("config_hash") != self.config_hash:
                raise UserError(
                    f"{path} holds a run with other settings ({_differences(old, self.task, config)}); for another "
                    "configuration choose another --out"
                )
        elif any((path / name).exists() for name in (RESULTS_FILE, RECORDS_FILE, *outputs)):
            raise UserError(f"{path} holds run files but no run manifest ({MANIFEST_FILE}); choose another --out")
        else:
            atomic_write_json(manifest, {"task": self.task, "config_hash": self.config_hash, "config": config})
        if repair:
            self._set_aside_corrupt()
        n = self.merge_shards()
        if n:
            _note(f"{path}: took in {n} records the ranks of an interrupted distributed run had finished")

    def _set_aside_corrupt(self) -> None:
        """Move the corrupt lines of the record files into :data:`CORRUPT_FILE`, saying which."""
        aside = self.path / CORRUPT_FILE
        files = (self.records_path, *shard_files(self.path))
        found = [(f.name, n) for f in files for n in set_aside_corrupt(f, aside)]
        if found:
            where = ", ".join(f"{name}:{n}" for name, n in found)
            _note(f"{self.path}: set aside {len(found)} corrupt record line(s) ({where}) in {CORRUPT_FILE}; their "
                  "items run again")  # fmt: skip

    @property
    def created(self) -> bool:
        """Whether this claim created the directory (:meth:`abandon` removes only such a one)."""
        return self._created

    # -- records -----------------------------------------------------------------------------------------------

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS_FILE

    @property
    def append_path(self) -> Path:
        """Where :meth:`append` writes: ``records.jsonl``, or this rank's own file when there are several."""
        return self.records_path if self.world.size == 1 else shard_path(self.path, self.world.rank)

    def records(self) -> list[dict]:
        rows = read_jsonl(self.records_path)
        return rows if self.world.size == 1 else rows + read_jsonl(self.append_path)

    def latest(self) -> dict[str, dict]:
        """Records by ``key``; a later line for a key replaces the earlier one."""
        return {r["key"]: r for r in self.records() if "key" in r}

    def append(self, record: dict) -> None:
        append_jsonl(self.append_path, record)

    def merge_shards(self, order: Sequence[str] | None = None) -> int:
        """Fold every rank file into ``records.jsonl`` (one atomic replace), then delete them; the number of records
        taken in. Rank 0 alone calls this, when no rank is writing.

        The rank files' records follow the old lines (they are newer), sorted by the position of their key in
        ``order`` when given (the run order, so a distributed run's file reads as a single-process run's would;
        records of one key keep their order). A torn last line of a killed rank is dropped. A record identical to
        the latest line of its key is skipped: it was taken in already by a merge cut off before it deleted the
        rank files.
        """
        shards = shard_files(self.path)
        if not shards:
            return 0
        base = _record_lines(self.records_path)
        latest = {key: line for key, line in base}
        new = [(key, line) for shard in shards for key, line in _record_lines(shard) if latest.get(key) != line]
        if order is not None:
            position = {key: i for i, key in enumerate(order)}
            new.sort(key=lambda entry: position.get(entry[0], len(position)))  # stable
        if new:
            atomic_write_bytes(self.records_path, b"".join(line + b"\n" for _, line in base + new))
        for shard in shards:
            shard.unlink(missing_ok=True)
        return len(new)

    # -- results -----------------------------------------------------------------------------------------------

    def load_results(self) -> dict | None:
        """The finished results of this configuration, or None."""
        path = self.path / RESULTS_FILE
        if not path.exists():
            return None
        results = read_json_file(path, "results file")
        return results if results.get("config_hash") == self.config_hash else None

    def save_results(self, results: dict) -> None:
        atomic_write_json(self.path / RESULTS_FILE, results)

    def abandon(self) -> None:
        """Remove the directory if this claim created it and nothing but the manifest was written."""
        if self._created and self.path.is_dir() and {p.name for p in self.path.iterdir()} <= {MANIFEST_FILE, LOCK_FILE}:
            shutil.rmtree(self.path, ignore_errors=True)

    def kept(self) -> str:
        """What the directory keeps after a run stopped, and how to go on (the note of an interrupt)."""
        if self.path.is_dir():
            return f"what finished is saved in {self.path}; rerun the same command to resume"
        return "no item had finished, so its run directory was removed"


@contextlib.contextmanager
def writing(
    path: Path | str, task: str, config_hash: str, config: dict, outputs: tuple[str, ...] = (), repair: bool = False
) -> Iterator[RunDir]:
    """:meth:`RunDir.claim` for the block, which is then the directory's one writer: the directory's lock is taken
    before the claim and let go at the block's end. A block that fails removes the directory if the claim created it
    and nothing else was written (:meth:`RunDir.abandon`); an :class:`~evalsuite.errors.Interrupted` leaves it
    carrying :meth:`RunDir.kept`. ``repair``: first set aside the record lines that are not valid JSON (in
    :data:`CORRUPT_FILE`), so that their items run again. Under torchrun rank 0 alone holds it."""
    path = Path(path)
    check_writable(path)
    run = RunDir(path, task, config_hash, not path.exists())
    with RunLock.acquire(path):
        try:
            run._take(config, outputs, repair)
            yield run
        except Interrupted as e:
            run.abandon()
            raise Interrupted(e.signum, run.kept()) from None
        except BaseException:
            run.abandon()
            raise


class ShardFollower:
    """Rank 0's view of what every rank has finished: the records appended to the rank files since the last
    :meth:`poll`, read from where the previous poll stopped (its progress bar counts them).

    As a context manager with ``on_records``, a background thread passes them on every ``interval`` seconds while
    the block runs (rank 0's own long work units do not hold the count back), and once more at its end.
    """

    def __init__(self, path: Path, on_records: Callable[[list[dict]], None] | None = None, interval: float = 1.0):
        self.path, self._offsets = Path(path), {}
        self._on_records, self._interval = on_records, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> ShardFollower:
        if self._on_records is not None:
            self._thread = threading.Thread(target=self._follow, name="evalsuite-rank-files", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._on_records(self.poll())  # what arrived since the thread's last look

    def _follow(self) -> None:
        while not self._stop.wait(self._interval):
            self._on_records(self.poll())

    def poll(self) -> list[dict]:
        records = []
        for shard in shard_files(self.path):
            offset = self._offsets.get(shard.name, 0)
            try:
                with open(shard, "rb") as f:
                    f.seek(offset)
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written is read next time
            for line in data[:end].split(b"\n"):
                if line.strip():
                    try:
                        row = json.loads(line)
                    except (UnicodeDecodeError, json.JSONDecodeError):
                        continue  # a torn line a killed run left mid-file: merge_shards reports it
                    if isinstance(row, dict):
                        records.append(row)
            self._offsets[shard.name] = offset + end
        return records


def _record_lines(path: Path) -> list[tuple[str | None, bytes]]:
    """``(key, line)`` for each record of a JSONL file, the line's bytes exactly as written (no newline). As
    :func:`.store.read_jsonl` reads it: a torn last line is dropped, a corrupt one elsewhere is an error."""
    if not path.exists():
        return []
    lines = [(n, line) for n, line in enumerate(path.read_bytes().split(b"\n"), 1) if line.strip()]
    kept = []
    for i, (number, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except (UnicodeDecodeError, json.JSONDecodeError):
            if i == len(lines) - 1:  # only the last line may be torn (a rank killed mid-write)
                break
            raise UserError(f"{path}:{number}: corrupt record (not valid JSON); {REPAIR_HINT}") from None
        if isinstance(row, dict):
            kept.append((row.get("key"), line))
    return kept


def _differences(manifest: dict, task: str, config: dict) -> str:
    """``key X there vs Y`` for each setting in which a manifest's run and this one differ."""
    before = {"task": manifest.get("task"), **(manifest.get("config") or {})}
    now = {"task": task, **config}
    keys = [k for k in dict.fromkeys([*before, *now]) if before.get(k) != now.get(k)]
    return ", ".join(f"{k} {before.get(k)!r} there vs {now.get(k)!r}" for k in keys) or "another config hash"


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)
