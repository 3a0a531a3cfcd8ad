"""The one runner every task goes through, in a plain run and on each of torchrun's ranks alike.

:func:`run_task` checks the adapter offers what the task ``needs``, has the task prepare its plan, claims the run
directory (:class:`~evalsuite.runs.rundir.RunDir`: a finished key is skipped, each record is appended as it
arrives), executes the task and writes ``results.json`` in one shape for every task::

    {"task", "model", "config", "config_hash", "train_length", "max_length", "provenance", "records", "summary",
     "run_dir"}

Ranks (:mod:`evalsuite.runs.distributed`; a plain run is a world of one rank whose collectives return at once):
every rank prepares the plan (the checks are deterministic, so a bad option gives one error line, not one per
rank), rank 0 claims the directory and holds its lock to the end (:func:`~evalsuite.runs.rundir.writing`: one run
at a time writes a directory), each works through its share of the pending work appending to its own rank file,
and rank 0 alone shows progress, merges the rank files, aggregates and writes ``results.json``. A task that does not
share its work (``shards = False``) refuses to run on several ranks.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

from evalsuite.adapters.base import TextAdapter
from evalsuite.errors import UserError
from evalsuite.runs import distributed
from evalsuite.runs.provenance import provenance
from evalsuite.runs.rundir import MANIFEST_FILE, RunDir, writing
from evalsuite.runs.store import config_hash
from evalsuite.tasks.base import RUNS_ROOT, Plan, Task, check_capabilities


def run_task(
    task: Task, adapter: TextAdapter | None, out_dir: Path | str | None = None, progress: bool = True,
    repair: bool = False, runs_root: Path | str | None = None,
) -> dict:  # fmt: skip
    """Run, resume or re-aggregate ``task`` on ``adapter`` into ``out_dir`` (default: the task's directory for this
    configuration, under ``runs_root`` instead of ``results/runs`` when given); returns (and writes)
    ``results.json``'s content, the same on every rank. ``repair``: set aside the corrupt lines of the directory's
    records first (their items run again)."""
    world = distributed.setup()
    plan, chash, hashed = world.agree(lambda: _prepare(task, adapter, world.size))
    with contextlib.ExitStack() as held:  # rank 0's claim: the directory's one writer until the run ends

        def claim():  # rank 0 alone writes the manifest and takes in rank files an interrupted run left
            path = Path(out_dir) if out_dir is not None else task.default_dir(plan, adapter, chash)
            if out_dir is None and runs_root is not None and path.is_relative_to(RUNS_ROOT):
                path = Path(runs_root) / path.relative_to(RUNS_ROOT)
            claimed = held.enter_context(writing(path, task.name, chash, hashed, repair=repair))
            return str(claimed.path), claimed.load_results() if task.reuse_finished else None

        path, finished = world.from_main(claim)
        if finished is not None:
            return finished
        # (rank 0's claim removes the directory again if the run fails before writing anything)
        run = RunDir(Path(path), task.name, chash, created=False, world=world)
        world.agree(lambda: _check_shared(run))
        if adapter is not None:
            adapter.attach_run(run.path)
        t0 = time.monotonic()
        outcome = task.execute(plan, adapter, run, progress and world.is_main)

        def finish():  # rank 0 alone aggregates and writes; every rank returns the results
            run.merge_shards()  # a no-op for the tasks that merge in run order themselves
            records, summary = task.aggregate(plan, outcome, adapter, run)
            seconds = round(time.monotonic() - t0, 3)  # rank 0's share of the work, from its start to every rank's end
            return _finish(task, plan, outcome, adapter, run, records, summary, world.size, seconds)

        return world.from_main(finish)


def _prepare(task: Task, adapter: TextAdapter | None, ranks: int) -> tuple[Plan, str, dict]:
    """(the task's plan, the run's config hash, what it hashes but the task name); UserError for a bad config, a
    model that lacks what the task needs, or several ranks for a task that does not share its work."""
    if ranks > 1 and not task.shards:
        raise UserError(f"task {task.name} does not share its work among ranks; run it without torchrun")
    check_capabilities(task, adapter)
    plan = task.prepare(adapter)
    hashed = {**plan.config, **(adapter.identity() if adapter is not None else {})}
    return plan, config_hash({"task": task.name, **hashed}), hashed


def _finish(task: Task, plan: Plan, outcome, adapter, run: RunDir, records, summary, ranks: int, seconds) -> dict:
    """Write ``results.json`` (its one shape) and let the task tidy up; returns the content."""
    prov = adapter.provenance() if adapter is not None else {}
    extra = task.provenance_extra(plan, outcome)
    results = {
        "task": task.name,
        "model": adapter.name if adapter is not None else None,
        "config": plan.shown if plan.shown is not None else plan.config,
        "config_hash": run.config_hash,
        "train_length": adapter.train_length if adapter is not None else None,
        "max_length": adapter.max_length if adapter is not None else None,
        "provenance": provenance(**prov, **extra, world_size=ranks, execute_seconds=seconds),
        "records": records,
        "summary": summary,
        "run_dir": str(run.path),
    }
    run.save_results(results)
    task.finished(run)
    return results


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
