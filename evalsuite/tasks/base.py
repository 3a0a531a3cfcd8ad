r"""What a task is: its plan, its units of work, its aggregate; the registry ``evalsuite run NAME`` looks tasks up in.

A task (inspect_ai's "dataset + solver + scorer"; lm-eval's task) is built from its ``Config`` (a dataclass that
validates its own values in ``__post_init__``) and supplies:

* ``prepare(adapter) -> Plan``: the configuration resolved against the model (presets filled in, defaults that
  depend on the model, data read and checked) as a frozen value. ``plan.config`` defines the records: hashed with
  the model's identity into the run's config hash and the default run-directory name. Nothing is written before it
  succeeds, and the plan is then handed to every later step;
* ``items(plan, adapter)`` and ``evaluate(plan, adapter, items, run)`` (an :class:`ItemTask`): the units of work,
  each listing the record keys it produces, and the requests to the model and scores, yielding one record per key;
* ``aggregate(plan, outcome, adapter, run)``: long-format records (model, task, subtask, length, depth, metric,
  value, n) and a task-specific summary.

The runner (:func:`evalsuite.tasks.runner.run_task`) owns the rest: the run directory, resume, ranks, progress and
``results.json``. Most tasks are :class:`ItemTask`\ s (items -> records; ``execute`` is the loop below); a task
with its own inner loop (the loss task's running sums, MQAR's training sweep) implements ``execute`` itself.

A task from outside this package needs only a name, a ``Config`` dataclass, ``items``, ``evaluate`` and
``aggregate`` (``prepare`` defaults to the config as it is) and :func:`register_task`; ``evalsuite run NAME --set
KEY=VALUE`` then runs it. ``command`` names the ``evalsuite`` command that runs a built-in task besides ``run``, and
``shards`` whether it shares its work among torchrun's ranks (every :class:`ItemTask` does).
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import ClassVar

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, TOKENS, TextAdapter
from evalsuite.errors import UserError
from evalsuite.registry import Registry
from evalsuite.runs.progress import progress_bar
from evalsuite.runs.rundir import RunDir, ShardFollower

RUNS_ROOT = Path("results/runs")
# How a refusal names a missing capability.
NEED_TEXT = {
    TOKENS: "token-level access (logits over token ids)",
    LOGLIKELIHOOD: "log-likelihoods",
    GENERATE: "text generation",
}


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A task's work on one model, resolved by :meth:`Task.prepare`. ``config``: what defines the records (hashed);
    ``shown``: the config as ``results.json`` shows it (None: ``config``). Tasks extend it with what they resolved."""

    config: dict
    shown: dict | None = None


@dataclass(frozen=True)
class Item:
    """One unit of work; ``keys`` are the record keys it produces (a NIAH 2-hop cell: the 2-hop and 1-hop answers)."""

    keys: tuple[str, ...]
    data: object = None


def check_known_options(task: str, options: dict, known: set[str]) -> None:
    """UserError naming the ``options`` outside ``known`` (``evalsuite run TASK --set KEY=VALUE``)."""
    unknown = sorted(set(options) - known)
    if unknown:
        raise UserError(f"task {task}: unknown option(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")


class Task(ABC):
    """Base class of every task. Subclasses set ``name``, ``needs`` and ``Config`` (a dataclass)."""

    name: ClassVar[str]
    needs: ClassVar[frozenset[str]] = frozenset({GENERATE})  # adapter capabilities (evalsuite.adapters.base)
    Config: ClassVar[type]
    command: ClassVar[str | None] = None  # the `evalsuite` command that runs it, besides `evalsuite run NAME`
    reuse_finished: ClassVar[bool] = False  # True: a finished run's results.json is returned as it is
    shards: ClassVar[bool] = False  # True: execute() shares its work among torchrun's ranks (run.world)

    def __init__(self, config=None):
        self.config = config if config is not None else self.Config()

    @classmethod
    def from_options(cls, options: dict) -> Task:
        """A task from ``key=value`` options (``evalsuite run TASK --set key=value``); unknown keys are errors."""
        check_known_options(cls.name, options, {f.name for f in fields(cls.Config)})
        try:
            return cls(cls.Config(**options))
        except (TypeError, ValueError) as e:
            raise UserError(f"task {cls.name}: {e}") from None

    # -- what subclasses provide -------------------------------------------------------------------------------

    def prepare(self, adapter: TextAdapter | None) -> Plan:
        """The configuration resolved against ``adapter`` (UserError if it cannot run); default: the config as is."""
        return Plan(config=asdict(self.config))

    def default_dir(self, plan: Plan, adapter: TextAdapter | None, chash: str) -> Path:
        model = adapter.name if adapter is not None else "run"
        return RUNS_ROOT / self.name / f"{model}-{chash}"

    @abstractmethod
    def execute(self, plan: Plan, adapter: TextAdapter | None, run: RunDir, progress: bool = True) -> object:
        """Do the work not yet in ``run`` (appending records as they finish), this rank's share of it under
        torchrun; return what :meth:`aggregate` needs (on rank 0; the other ranks' return value is unused)."""

    @abstractmethod
    def aggregate(self, plan: Plan, outcome, adapter: TextAdapter | None, run: RunDir) -> tuple[list[dict], dict]:
        """(long-format records, task summary) from :meth:`execute`'s outcome."""

    def provenance_extra(self, plan: Plan, outcome) -> dict:
        return {"seed": getattr(self.config, "seed", None)}

    def finished(self, run: RunDir) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Called once ``results.json`` is written (e.g. to remove a task's in-progress state)."""


class ItemTask(Task):
    """A task made of independent items, each producing keyed records: the runner's default loop."""

    shards = True

    @abstractmethod
    def items(self, plan: Plan, adapter: TextAdapter | None) -> list[Item]:
        """Every item of the plan, in run order."""

    @abstractmethod
    def evaluate(self, plan: Plan, adapter: TextAdapter | None, items: Sequence[Item], run: RunDir) -> Iterator[dict]:
        """Records (each with a ``key``) for the pending ``items``: one per key each lists (an item partly done
        lists only the keys still missing)."""

    def batches(self, plan: Plan, adapter: TextAdapter | None, items: Sequence[Item]) -> list[list[Item]]:
        """The groups of ``items`` (pending, in run order) that :meth:`evaluate` puts through the model together;
        default: each item alone.

        The unit of work a rank gets under torchrun, each handed to :meth:`evaluate` on its own. A task that batches
        items (several prompts per ``generate`` call) returns the batches its :meth:`evaluate` would form from
        ``items``: then no record depends on the number of ranks, since a batch's padding and shapes (and so its
        floating-point results) are the same as in a single-process run.
        """
        return [[item] for item in items]

    def execute(self, plan: Plan, adapter: TextAdapter | None, run: RunDir, progress: bool = True) -> list[dict]:
        """Evaluate this rank's share of the batches of items not finished in ``run``, appending records as they
        come; rank 0 returns the rows the aggregate sees (the latest record per key of the plan's items, in item
        order, every rank's included), the others none."""
        world = run.world
        items = self.items(plan, adapter)
        done = run.latest()  # records.jsonl as the claim left it: the same on every rank
        pending = [Item(missing, it.data) for it in items if (missing := tuple(k for k in it.keys if k not in done))]
        tally = _ItemTally(pending)
        label = f"{self.name} {adapter.name}" if adapter is not None else self.name
        with progress_bar(len(pending), label, enabled=progress) as bar:

            def credit(records: list[dict]) -> None:
                for record in records:
                    bar.advance(tally.credit(record.get("key")))

            # rank 0 also counts what the other ranks finish, from their files
            following = world.size > 1 and world.is_main
            with ShardFollower(run.path, credit) if following else contextlib.nullcontext():
                for unit in world.shard(self.batches(plan, adapter, pending)):
                    for record in self.evaluate(plan, adapter, unit, run):
                        run.append(record)
                        credit([record])
                world.wait()
        if not world.is_main:
            return []
        order = [k for it in items for k in it.keys]
        run.merge_shards(order=order)
        final = run.latest()
        return [final[k] for k in order if k in final]


class _ItemTally:
    """Which pending items are complete, as their records arrive (an item is done when all its keys are); the
    records of one item may be credited from two threads (rank 0's own loop and its rank-file follower)."""

    def __init__(self, pending: Sequence[Item]):
        self._item_of = {k: i for i, it in enumerate(pending) for k in it.keys}
        self._left = [len(it.keys) for it in pending]
        self._lock = threading.Lock()

    def credit(self, key: str | None) -> int:
        """1 when ``key`` completes its item, else 0 (keys seen before, or not pending, count nothing)."""
        with self._lock:
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
        "evalsuite.tasks.lm_eval",
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
