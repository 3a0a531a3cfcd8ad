r"""What a task is, and the one runner every task goes through.

A task (inspect_ai's "dataset + solver + scorer"; lm-eval's task) supplies:

* ``hashed_config(adapter)``: the resolved configuration that defines its records (hashed with the model's
  identity into the run's config hash and the default run-directory name);
* ``items(adapter)`` and ``evaluate(adapter, items, run)`` (an :class:`ItemTask`): the units of work, each listing
  the record keys it produces, and the requests to the model and scores, yielding one record per key;
* ``aggregate(rows, adapter)``: long-format records (model, task, subtask, length, depth, metric, value, n) and a
  task-specific summary.

:func:`run_task` owns the rest: it checks the adapter offers what the task ``needs``, claims the run directory
(:class:`~evalsuite.runs.rundir.RunDir`), skips finished keys, appends each record as it arrives with a progress bar,
and writes ``results.json`` in one shape for every task::

    {"task", "model", "config", "config_hash", "train_length", "max_length", "provenance", "records", "summary",
     "run_dir"}

Most tasks are :class:`ItemTask`\ s (items -> records, the loop above); a task with its own inner loop (the loss
task's running sums, MQAR's training sweep) implements ``execute`` itself.
Tasks register with :func:`register_task` so ``evalsuite run NAME`` finds them.

Under ``torchrun`` (:mod:`evalsuite.runs.distributed`) every rank runs :func:`run_task`: each validates the config, rank
0 claims the directory, each works through its share of the pending units (an :class:`ItemTask`'s
:meth:`~ItemTask.batches`, dealt round-robin) appending to its own rank file, and rank 0 alone shows progress, merges
the rank files and writes ``results.json``. A task that implements ``execute`` itself shards its own work (loss,
MQAR) and says so with ``shards = True``; any other refuses to run on several ranks.
"""

from __future__ import annotations

import contextlib
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields, is_dataclass
from pathlib import Path
from typing import ClassVar

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, TOKENS, TextAdapter
from evalsuite.errors import UserError
from evalsuite.registry import Registry
from evalsuite.runs import distributed
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.provenance import provenance
from evalsuite.runs.rundir import MANIFEST_FILE, RunDir, ShardFollower
from evalsuite.runs.store import config_hash

RUNS_ROOT = Path("results/runs")
# How a refusal names a missing capability.
NEED_TEXT = {
    TOKENS: "token-level access (logits over token ids)",
    LOGLIKELIHOOD: "log-likelihoods",
    GENERATE: "text generation",
}


@dataclass(frozen=True)
class Item:
    """One unit of work; ``keys`` are the record keys it produces (a NIAH 2-hop cell: the 2-hop and 1-hop answers)."""

    keys: tuple[str, ...]
    data: object = None


class Task(ABC):
    """Base class of every task. Subclasses set ``name``, ``needs`` and ``Config`` (a dataclass)."""

    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset({GENERATE})  # adapter capabilities (evalsuite.adapters.base)
    Config: ClassVar[type]
    reuse_finished: ClassVar[bool] = False  # True: a finished run's results.json is returned as it is
    shards: ClassVar[bool] = False  # True: execute() shares its work among torchrun's ranks (run.world)

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_options(cls, options: dict) -> Task:
        """A task from ``key=value`` options (``evalsuite run TASK --set key=value``); unknown keys are errors."""
        known = {f.name for f in fields(cls.Config)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise UserError(f"task {cls.name}: unknown option(s) {', '.join(unknown)}; known: {', '.join(known)}")
        try:
            return cls(cls.Config(**options))
        except (TypeError, ValueError) as e:
            raise UserError(f"task {cls.name}: {e}") from None

    # -- what subclasses provide -------------------------------------------------------------------------------

    def hashed_config(self, adapter: TextAdapter | None) -> dict:
        """The resolved config that defines the records (validated against the adapter; UserError if bad)."""
        return asdict(self.config) if is_dataclass(self.config) else dict(self.config)

    def shown_config(self, hashed: dict) -> dict:
        """The config as ``results.json`` shows it (default: the hashed one)."""
        return hashed

    def legacy_hashed_configs(self, adapter: TextAdapter | None, hashed: dict) -> list[dict]:
        """Configs in earlier schemas that produced the same records as ``hashed`` (their run directories migrate)."""
        return []

    def default_dir(self, adapter: TextAdapter | None, chash: str) -> Path:
        model = adapter.name if adapter is not None else "run"
        return RUNS_ROOT / self.name / f"{model}-{chash}"

    @abstractmethod
    def aggregate(self, rows: list[dict], adapter: TextAdapter | None, run: RunDir) -> tuple[list[dict], dict]:
        """(long-format records, task summary) from the run's latest records."""

    def provenance_extra(self) -> dict:
        return {"seed": getattr(self.config, "seed", None)}

    def finished(self, run: RunDir) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Called once ``results.json`` is written (e.g. to remove a task's in-progress state)."""

    @abstractmethod
    def execute(self, adapter: TextAdapter | None, run: RunDir, progress: bool = True) -> list[dict]:
        """Do the work not yet in ``run`` (appending records as they finish); return the rows to aggregate."""


class ItemTask(Task):
    """A task made of independent items, each producing keyed records: the runner's default loop."""

    shards = True

    @abstractmethod
    def items(self, adapter: TextAdapter | None) -> list[Item]:
        """Every item of the configuration, in run order."""

    @abstractmethod
    def evaluate(self, adapter: TextAdapter | None, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        """Records (each with a ``key``) for the pending ``items``."""

    def batches(self, adapter: TextAdapter | None, items: Sequence[Item]) -> list[list[Item]]:
        """The groups of ``items`` (pending, in run order) that :meth:`evaluate` puts through the model together;
        default: each item alone.

        The unit of work a rank gets under torchrun, each handed to :meth:`evaluate` on its own. A task that batches
        items (several prompts per ``generate`` call) returns the batches its :meth:`evaluate` would form from
        ``items``: then no record depends on the number of ranks, since a batch's padding and shapes (and so its
        floating-point results) are the same as in a single-process run.
        """
        return [[item] for item in items]

    def execute(self, adapter: TextAdapter | None, run: RunDir, progress: bool = True) -> list[dict]:
        """Evaluate every item not finished in ``run``, appending records as they come; returns the rows the
        aggregate sees (the latest record per key of this run's items, in item order). Under torchrun, this rank's
        share of the pending batches; rank 0 returns the rows of every rank, the others none."""
        if run.world is not None:
            return self._execute_shard(adapter, run, progress)
        items = self.items(adapter)
        done = run.latest()
        pending = [it for it in items if any(k not in done for k in it.keys)]
        missing = {k: i for i, it in enumerate(pending) for k in it.keys if k not in done}
        left = [sum(k in missing for k in it.keys) for it in pending]
        label = f"{self.name} {adapter.name}" if adapter is not None else self.name
        with progress_bar(len(pending), label, enabled=progress) as bar:
            for record in self.evaluate(adapter, pending, run):
                run.append(record)
                index = missing.pop(record["key"], None)
                if index is not None:
                    left[index] -= 1
                    if left[index] == 0:
                        bar.advance()
        final = run.latest()
        return [final[k] for it in items for k in it.keys if k in final]

    def _execute_shard(self, adapter: TextAdapter | None, run: RunDir, progress: bool) -> list[dict]:
        world = run.world
        items = self.items(adapter)
        done = run.latest()  # records.jsonl as rank 0 left it after the claim: the same on every rank
        pending = [it for it in items if any(k not in done for k in it.keys)]
        tally = _ItemTally(pending, done)
        label = f"{self.name} {adapter.name}" if adapter is not None else self.name
        with progress_bar(len(pending), label, enabled=progress and world.is_main) as bar:

            def credit(records: list[dict]) -> None:  # rank 0: what every rank finished, from their files
                for record in records:
                    bar.advance(tally.credit(record.get("key")))

            with ShardFollower(run.path, credit) if world.is_main else contextlib.nullcontext():
                for unit in world.shard(self.batches(adapter, pending)):
                    for record in self.evaluate(adapter, unit, run):
                        run.append(record)
                world.wait()
        if not world.is_main:
            return []
        run.merge_shards(order=[k for it in items for k in it.keys])
        final = run.latest()
        return [final[k] for it in items for k in it.keys if k in final]


class _ItemTally:
    """Which pending items are complete, as their records arrive (an item is done when all its keys are)."""

    def __init__(self, pending: Sequence[Item], done: dict):
        self._item_of = {k: i for i, it in enumerate(pending) for k in it.keys if k not in done}
        self._left = [sum(k in self._item_of for k in it.keys) for it in pending]

    def credit(self, key: str | None) -> int:
        """1 when ``key`` completes its item, else 0 (keys seen before, or not pending, count nothing)."""
        index = self._item_of.pop(key, None)
        if index is None:
            return 0
        self._left[index] -= 1
        return int(self._left[index] == 0)


TASKS: Registry[type[Task]] = Registry(
    "task",
    builtins=(
        "evalsuite.tasks.loss",
        "evalsuite.tasks.niah",
        "evalsuite.tasks.drt_passkey",
        "evalsuite.tasks.mqar",
        "evalsuite.tasks.longbench",
        "evalsuite.tasks.summarize",
    ),
)


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator: make ``cls`` runnable by name (``evalsuite run NAME``)."""
    TASKS.register(cls.name, cls, replace=True)
    return cls


def check_capabilities(task: Task, adapter: TextAdapter | None) -> None:
    """UserError, up front, when the model cannot serve the task."""
    if not task.needs:
        return
    if adapter is None:
        raise UserError(f"task {task.name} needs a model (--model)")
    lacking = sorted(task.needs - adapter.capabilities)
    if lacking:
        offered = ", ".join(sorted(adapter.capabilities)) or "nothing"
        runnable = sorted(name for name, cls in TASKS.items() if cls.needs and cls.needs <= adapter.capabilities)
        raise UserError(
            f"task {task.name} needs {' and '.join(NEED_TEXT.get(n, n) for n in lacking)}, which model "
            f"{adapter.name} does not give (it offers: {offered}; tasks it can run: {', '.join(runnable) or 'none'})"
        )


def run_task(task: Task, adapter: TextAdapter | None, out_dir: Path | str | None = None, progress: bool = True) -> dict:
    """Run, resume or re-aggregate ``task`` on ``adapter``; returns (and writes) ``results.json``'s content.

    Started by torchrun, this runs on every rank (see the module docstring) and returns the same content on each.
    """
    world = distributed.setup()
    if world is not None:
        return _run_sharded(task, adapter, out_dir, progress, world)
    config, chash, legacy = _plan(task, adapter)  # validates; nothing is written before this passes
    run, finished = _claim(task, adapter, out_dir, config, chash, legacy)
    if finished is not None:
        return finished
    if adapter is not None:
        adapter.attach_run(run.path)
    t0 = time.monotonic()
    try:
        rows = task.execute(adapter, run, progress)
        records, summary = task.aggregate(rows, adapter, run)
    except BaseException:
        run.abandon()
        raise
    return _finish(task, adapter, run, config, records, summary, execute_seconds=round(time.monotonic() - t0, 3))


def _plan(task: Task, adapter: TextAdapter | None) -> tuple[dict, str, tuple[str, ...]]:
    """(the validated hashed config, its hash, the hashes older schemas gave it); UserError for a bad config or a
    model that lacks what the task needs."""
    check_capabilities(task, adapter)
    identity = adapter.identity() if adapter is not None else {}
    config = task.hashed_config(adapter)
    chash = config_hash({"task": task.name, **config, **identity})
    legacy = tuple(config_hash({**old, **identity}) for old in task.legacy_hashed_configs(adapter, config))
    return config, chash, legacy


def _claim(task: Task, adapter, out_dir, config: dict, chash: str, legacy: tuple) -> tuple[RunDir, dict | None]:
    """The run directory (``out_dir``, or the default one) and its finished results when the task reuses them."""
    path = Path(out_dir) if out_dir is not None else _existing_legacy_dir(task, adapter, chash, legacy)
    run = RunDir.claim(path, task.name, chash, config, legacy)
    finished = run.load_results() if task.reuse_finished else None
    return run, (finished if finished is not None and "summary" in finished else None)  # older files re-aggregate


def _finish(task: Task, adapter, run: RunDir, config: dict, records: list[dict], summary: dict, **prov_extra) -> dict:
    """Write ``results.json`` (its one shape) and let the task tidy up; returns the content."""
    prov = adapter.provenance() if adapter is not None else {}
    results = {
        "task": task.name,
        "model": adapter.name if adapter is not None else None,
        "config": task.shown_config(config),
        "config_hash": run.config_hash,
        "train_length": adapter.train_length if adapter is not None else None,
        "max_length": adapter.max_length if adapter is not None else None,
        "provenance": provenance(**prov, **task.provenance_extra(), **prov_extra),
        "records": records,
        "summary": summary,
        "run_dir": str(run.path),
    }
    run.save_results(results)
    task.finished(run)
    return results


def _run_sharded(task: Task, adapter: TextAdapter | None, out_dir, progress: bool, world) -> dict:
    """:func:`run_task` on one of torchrun's ranks."""

    def plan():  # every rank validates: the checks are deterministic, and the ranks need the resolved config
        if not task.shards and world.size > 1:
            raise UserError(f"task {task.name} does not share its work among ranks; run it without torchrun")
        return _plan(task, adapter)

    config, chash, legacy = world.agree(plan)

    def claim():  # rank 0 alone writes the manifest and takes in rank files an interrupted run left
        run, finished = _claim(task, adapter, out_dir, config, chash, legacy)
        return str(run.path), run.created, finished

    path, created, finished = world.from_main(claim)
    if finished is not None:
        return finished
    run = RunDir(Path(path), task.name, chash, created=created and world.is_main, world=world)
    world.agree(lambda: _check_shared(run))
    if adapter is not None:
        adapter.attach_run(run.path)
    t0 = time.monotonic()
    try:
        rows = task.execute(adapter, run, progress and world.is_main)
    except BaseException:
        if world.is_main:
            run.abandon()
        raise

    def finish():  # rank 0 alone aggregates and writes; every rank returns the results
        run.merge_shards()  # a no-op for the tasks that merge in run order themselves
        records, summary = task.aggregate(rows, adapter, run)
        seconds = round(time.monotonic() - t0, 3)  # rank 0's share of the work, from its start to every rank's end
        return _finish(task, adapter, run, config, records, summary, world_size=world.size, execute_seconds=seconds)

    return world.from_main(finish)


def _check_shared(run: RunDir, patience: float = 10.0) -> None:
    """UserError unless this rank sees the manifest rank 0 wrote: rank 0 merges the ranks' record files, so they
    must share the run directory (on several hosts, a shared filesystem; a few seconds allowed for it to show)."""
    deadline = time.monotonic() + patience
    while True:
        manifest = run.path / MANIFEST_FILE
        try:
            if json.loads(manifest.read_text()).get("config_hash") == run.config_hash:
                return
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise UserError(
                f"rank {run.world.rank} does not see {manifest}, which rank 0 wrote; on several hosts the run "
                "directory must be on a filesystem they all share (--out)"
            )
        time.sleep(0.2)


def _existing_legacy_dir(task: Task, adapter: TextAdapter | None, chash: str, legacy: tuple[str, ...]) -> Path:
    """The default directory; a run under an older schema's default name continues there instead."""
    for old in legacy:
        path = task.default_dir(adapter, old)
        if path.is_dir():
            return path
    return task.default_dir(adapter, chash)
