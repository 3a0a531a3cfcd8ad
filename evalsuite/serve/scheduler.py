"""The model thread of ``evalsuite serve``: continuous batching, scheduled one step at a time.

Every model call runs in this one thread, in a loop. Each turn of the loop: run the queued one-off calls (scoring
for ``logprobs``), admit waiting generations as a new batch, then advance every running batch by one step -- a
prefill pass of at most ``prefill_chunk`` prompt tokens, or one decode step (one new token for each of its rows).
A generation leaves its batch as soon as it ends (EOS, a stop string, its ``max_tokens``) or its client goes away
(:attr:`Job.cancelled`, set from the event loop); a batch whose rows have all left is dropped, its state freed. So a
long generation costs the others one row-step per turn and never holds the queue: requests join and leave between
decode steps, as continuous batching does.

Batches cannot grow in place (a family's decode state is allocated for the rows it was prefilled with), so requests
that arrive while batches run form a new batch, run beside them turn by turn. Waiting requests are admitted when
``max_batch`` of them are waiting or the oldest has waited ``batch_window_ms``.

Adapters that decode step by step (``decode_run``: our native models) run as above, each row with its own
generation settings, chosen and ended by the native adapter's own rules (:class:`StepBatch`): a request's tokens
are those it gets sent alone, whatever shares its batch (each sampled row draws from its own seeded generator).
Other adapters (``hf:``, API models, text-only ones) have whole-call ``generate``: their batch (requests whose
:func:`~evalsuite.serve.protocol.batch_key` agrees) is one call, one turn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from evalsuite.adapters.base import TextAdapter, TokenAdapter
from evalsuite.generation.finish import Finisher
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.serve.metrics import Metrics
from evalsuite.serve.protocol import batch_key

log = logging.getLogger("evalsuite.serve")

Emit = Callable[[str, object], None]  # ("tokens", list[int]) | ("done", Generation) | ("error", Exception)


@dataclass
class Job:
    """One generation. ``emit`` hands events to the event loop (thread-safe); ``cancelled`` is set from there."""

    prompt: list[int] | str
    config: GenerationConfig
    emit: Emit
    arrived: float = field(default_factory=time.monotonic)
    cancelled: bool = False


@dataclass
class Call:
    """A one-off model call (scoring) run between steps; ``emit("done", result)`` or ``emit("error", e)``."""

    fn: Callable
    args: tuple
    emit: Emit


class StepBatch:
    """Jobs prefilled together into one :class:`~evalsuite.generation.steps.DecodeRun` under their own configs;
    :meth:`advance` is one step. The run chooses the tokens (each row's rules and seeded draw), one
    :class:`~evalsuite.generation.finish.Finisher` decides how each row ends -- both as the native adapter's
    ``generate`` does, so a row's tokens are those of its request sent alone."""

    def __init__(self, adapter: TokenAdapter, jobs: list[Job], prefill_chunk: int | None):
        self.jobs = jobs
        configs = [j.config for j in jobs]
        self.run = adapter.decode_run([j.prompt for j in jobs], configs)
        self.finisher = Finisher(adapter.tokenizer, configs, adapter.tokenizer.eos_id)
        self.left = [False] * len(jobs)  # the row ended or its client went away: its tokens are no longer read
        self.prefill_chunk = prefill_chunk

    @property
    def live(self) -> list[Job]:
        return [j for j, left in zip(self.jobs, self.left, strict=True) if not left]

    def drop_cancelled(self) -> int:
        gone = [b for b, j in enumerate(self.jobs) if j.cancelled and not self.left[b]]
        for b in gone:
            self.left[b] = True
        return len(gone)

    def advance(self, record: Callable[[int, int], None]) -> None:
        """One prefill pass or one decode step. ``record(tokens generated, prompt tokens prefilled)`` is called once
        the tokens are chosen and the ended rows have left, before any job hears of them: a client that has its
        answer finds it counted."""
        prefilled = 0
        if not self.run.prefilled:
            if not self.run.prefill(self.prefill_chunk):
                record(0, 0)
                return
            prefilled = sum(len(j.prompt) for j in self.jobs)
        tokens = self.run.next_tokens()
        rows = [b for b, left in enumerate(self.left) if not left]
        chosen = tokens.tolist()
        self.finisher.feed([[chosen[b]] if not left else [] for b, left in enumerate(self.left)])
        results = {b: self.finisher.results[b] for b in rows}
        for b, result in results.items():
            self.left[b] = result is not None
        record(len(rows), prefilled)
        for b, result in results.items():
            if result is None:
                self.jobs[b].emit("tokens", [chosen[b]])
            else:
                self.jobs[b].emit("done", result)
        if self.live:
            self.run.step(tokens)


class WholeBatch:
    """Jobs of one :func:`batch_key` answered by one whole ``generate`` call of an adapter without steps (each job
    with its own config where the adapter takes one per row)."""

    def __init__(self, adapter: TextAdapter, jobs: list[Job]):
        self.adapter, self.jobs = adapter, jobs

    @property
    def live(self) -> list[Job]:
        return self.jobs

    def drop_cancelled(self) -> int:
        """Jobs cancelled before the call starts (a whole call cannot drop a row midway)."""
        gone = [j for j in self.jobs if j.cancelled]
        self.jobs = [j for j in self.jobs if not j.cancelled]
        return len(gone)

    def advance(self, record: Callable[[int, int], None]) -> None:
        """The whole call; ``record`` as :meth:`StepBatch.advance`'s."""
        jobs = self.jobs
        prompts = [j.prompt for j in jobs]
        config = [j.config for j in jobs] if self.adapter.per_row_configs else jobs[0].config
        if isinstance(self.adapter, TokenAdapter):
            gens = self.adapter.generate(prompts, config)
        else:
            gens = self.adapter.generate_until(prompts, config)
        self.jobs = []  # after the call: a failing call leaves its jobs to hear the error
        record(sum(_count(g) for g in gens), 0)
        for job, gen in zip(jobs, gens, strict=True):
            job.emit("done", gen)


def _count(gen: Generation) -> int:
    return len(gen.token_ids) if gen.token_ids else 1


class Scheduler:
    """The model thread (see the module docstring). :meth:`submit` and :meth:`call` are safe from any thread."""

    def __init__(self, adapter: TextAdapter, metrics: Metrics, *, max_batch: int = 8, window_s: float = 0.005,
                 prefill_chunk: int | None = 512):  # fmt: skip
        self.adapter, self.metrics = adapter, metrics
        self.steps = callable(getattr(adapter, "decode_run", None))
        self.max_batch, self.window, self.prefill_chunk = max(1, max_batch), max(0.0, window_s), prefill_chunk
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.waiting: list[Job] = []
        self.batches: list[StepBatch | WholeBatch] = []
        self.thread = threading.Thread(target=self._loop, name="evalsuite-model", daemon=True)
        self.stopping = False

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping = True
        self.inbox.put(None)

    def submit(self, job: Job) -> None:
        self.inbox.put(job)

    def call(self, item: Call) -> None:
        self.inbox.put(item)

    # -- the loop ----------------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping:
            self._collect()
            self._admit()
            for batch in list(self.batches):
                self._advance(batch)
            self.metrics.queue(sum(len(b.live) for b in self.batches), len(self.waiting))

    def _collect(self) -> None:
        """Move what arrived into the queues, running its calls. Blocks only while no batch runs: until something
        arrives, or until the oldest waiting request's window has passed."""
        while True:
            if len(self.waiting) >= self.max_batch or self.batches:
                timeout = 0.0
            elif self.waiting:
                timeout = max(0.0, self.waiting[0].arrived + self.window - time.monotonic())
            else:
                timeout = None
            try:
                item = self.inbox.get_nowait() if timeout == 0.0 else self.inbox.get(timeout=timeout)
            except queue.Empty:
                return
            if item is None:
                return
            if isinstance(item, Call):
                self._run_call(item)
            else:
                self.waiting.append(item)

    def _due(self) -> bool:
        return bool(self.waiting) and time.monotonic() - self.waiting[0].arrived >= self.window

    def _run_call(self, call: Call) -> None:
        start = time.perf_counter()
        try:
            result = call.fn(*call.args)
        except Exception as e:  # noqa: BLE001 - handed to the waiting request
            call.emit("error", e)
        else:
            call.emit("done", result)
        finally:
            self.metrics.busy(time.perf_counter() - start)

    def _admit(self) -> None:
        gone = [j for j in self.waiting if j.cancelled]
        if gone:
            self.metrics.cancel(len(gone))
            self.waiting = [j for j in self.waiting if not j.cancelled]
        while self.waiting and (len(self.waiting) >= self.max_batch or self._due()):
            if self.steps:
                jobs = self.waiting[: self.max_batch]
            else:  # the keys made once: a request that shares with none has a key equal to itself only
                keys = [batch_key(j.config, self.adapter.per_row_configs) for j in self.waiting]
                jobs = [j for j, k in zip(self.waiting, keys, strict=True) if k == keys[0]][: self.max_batch]
            taken = {id(j) for j in jobs}
            self.waiting = [j for j in self.waiting if id(j) not in taken]
            self.metrics.batch_formed(len(jobs))
            try:
                self.batches.append(StepBatch(self.adapter, jobs, self.prefill_chunk) if self.steps
                                    else WholeBatch(self.adapter, jobs))  # fmt: skip
            except Exception as e:  # noqa: BLE001 - the adapter refused the prompts: every job hears it
                for j in jobs:
                    j.emit("error", e)

    def _advance(self, batch: StepBatch | WholeBatch) -> None:
        cancelled = batch.drop_cancelled()
        if cancelled:
            self.metrics.cancel(cancelled)
        rows, start = len(batch.live), time.perf_counter()

        def record(generated: int, prefilled: int) -> None:
            nonlocal start
            now = time.perf_counter()
            self.metrics.step_done(rows, generated, prefilled, now - start)
            self.metrics.queue(sum(len(b.live) for b in self.batches), len(self.waiting))
            start = now

        try:
            if rows:
                batch.advance(record)
                self.metrics.busy(time.perf_counter() - start)  # the step after the tokens were counted
        except Exception as e:  # noqa: BLE001 - every request of the batch hears it; the server stays up
            log.debug("batch failed", exc_info=True)
            for job in batch.live:
                job.emit("error", e)
            rows = 0
        if not rows or not batch.live:
            self.batches.remove(batch)
