"""A worker pool for training sweeps: N subprocesses pull work items from a queue; the parent alone writes.

Small models leave a GPU mostly idle, so training several at once in separate processes on one device raises a
sweep's throughput (the MQAR sweep, ``evalsuite/tasks/mqar/``). The pool knows nothing of what an item is:

* ``items``: ``(index, item)`` pairs, run in the order given; ``index`` names the item in every report. Items
  and results cross process boundaries, so they must pickle.
* ``make_handler``: a picklable callable (a module-level function, or a ``functools.partial`` of one) that each
  worker calls once to get its handler; per-process state such as a data cache lives in the handler.
  ``handler(item, report)`` does the work and returns the result; it may call ``report(n)`` to announce ``n``
  units of progress (e.g. optimizer steps), or with any other picklable payload (a part of its result that is
  ready early), which ``on_progress`` receives as it is.
* The parent receives ``on_start(index)``, ``on_progress(index, n)``, ``on_result(index, result)`` and
  ``on_error(index, message)`` calls, in its own process, so only it ever writes files (no locking).

``threads`` > 1 runs that many items at once in each worker process, one per thread (a CUDA handler gives each
its own stream, so several small models share one GPU context and their kernels overlap; the handler must then be
thread-safe). A ``deadline`` (``time.time()`` seconds) stops new items from starting; items already running
finish. Items left on the queue then must not keep the parent from exiting (``cancel_join_thread``).

With ``workers <= 1`` and ``threads <= 1`` (or a single item) everything runs in this process with the same
callbacks, and a failing item raises as a plain loop would.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
from collections.abc import Callable, Sequence

Handler = Callable[[object, Callable[[object], None]], object]


def run_pool(
    items: Sequence[tuple[int, object]],
    make_handler: Callable[[], Handler],
    *,
    workers: int = 1,
    threads: int = 1,
    deadline: float | None = None,
    torch_threads: int | None = None,
    on_start: Callable[[int], None] | None = None,
    on_progress: Callable[[int, object], None] | None = None,
    on_result: Callable[[int, object], None] | None = None,
    on_error: Callable[[int | None, str], None] | None = None,
    poll_seconds: float = 5.0,
) -> list[str]:
    """Run ``items`` (see the module docstring); return the error messages of failed items or dead workers.

    ``torch_threads``: the ``torch.set_num_threads`` of each worker (None: torch's default).
    """
    calls = {
        "start": lambda index, _: on_start and on_start(index),
        "progress": lambda index, n: on_progress and on_progress(index, n),
        "result": lambda index, result: on_result and on_result(index, result),
    }
    if not items or _past(deadline):
        return []
    if (workers <= 1 and threads <= 1) or len(items) <= 1:
        handler = make_handler()
        for index, item in items:
            if _past(deadline):
                break
            calls["start"](index, None)
            calls["result"](index, handler(item, lambda n, i=index: calls["progress"](i, n)))
        return []

    ctx = mp.get_context("spawn")  # fork would copy CUDA state and torch's thread pools
    todo, events = ctx.Queue(), ctx.Queue()
    for pair in items:
        todo.put(pair)
    procs = [
        ctx.Process(target=_worker, args=(make_handler, todo, events, deadline, torch_threads, threads), daemon=True)
        for _ in range(min(max(workers, 1), len(items)))
    ]
    for p in procs:
        p.start()
    errors: list[str] = []

    def error(index: int | None, message: str) -> None:
        errors.append(message)
        if on_error is not None:
            on_error(index, message)

    running = len(procs)
    while running:
        try:
            kind, index, payload = events.get(timeout=poll_seconds)
        except queue.Empty:
            if not any(p.is_alive() for p in procs):
                error(None, "a worker process died")
                break
            continue
        if kind == "error":
            error(index, payload)
        elif kind == "done":
            running -= 1
        else:  # start, progress, result
            calls[kind](index, payload)
    for p in procs:
        p.join(timeout=30)
    todo.cancel_join_thread()  # items left after a deadline must not keep this process from exiting
    return errors


def _past(deadline: float | None) -> bool:
    return deadline is not None and time.time() >= deadline


def _worker(make_handler, todo, events, deadline, torch_threads, threads) -> None:
    """Subprocess: pull items until none are left (or the deadline passed), in ``threads`` threads; report progress,
    results, errors (multiprocessing queues are thread-safe)."""
    if torch_threads:
        import torch

        torch.set_num_threads(torch_threads)
    handler = make_handler()

    def pull() -> None:
        while not _past(deadline):
            try:
                index, item = todo.get(timeout=1)
            except queue.Empty:
                break
            events.put(("start", index, None))
            try:
                result = handler(item, lambda n, i=index: events.put(("progress", i, n)))
                events.put(("result", index, result))
            except Exception as e:  # noqa: BLE001 - the parent reports it; other items go on
                events.put(("error", index, f"{type(e).__name__}: {e}"))

    pullers = [threading.Thread(target=pull) for _ in range(max(threads, 1))]
    for t in pullers:
        t.start()
    for t in pullers:
        t.join()
    events.put(("done", None, None))
