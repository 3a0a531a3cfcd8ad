"""The engine of ``evalsuite serve`` on the event loop's side: generations go to the model thread's
:class:`~evalsuite.serve.scheduler.Scheduler` and come back token by token (:class:`TokenStream`); one-off model
calls (scoring) go to the same thread (:meth:`Engine.run`). Cancelling a coroutine that waits on either -- the
routes do that when a client disconnects -- cancels its work in the model thread."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import torch

from evalsuite.adapters.base import TextAdapter, TokenAdapter
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.serve.metrics import Metrics
from evalsuite.serve.protocol import ServeConfig
from evalsuite.serve.scheduler import Call, Job, Scheduler


def _emitter(loop: asyncio.AbstractEventLoop, queue: asyncio.Queue):
    """``emit(kind, payload)`` for the model thread: the event lands on ``queue`` in ``loop``."""

    def emit(kind: str, payload) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (kind, payload))
        except RuntimeError:  # the loop has closed: the server is stopping and nobody waits
            pass

    return emit


class TokenStream:
    """One generation as it is made: ``async for ids in stream`` yields lists of new token ids (a text-only adapter
    yields none), then :attr:`generation` holds the finished :class:`Generation`. :meth:`cancel` (or cancelling the
    iterating task) takes it out of its batch at the next step."""

    def __init__(self, engine: Engine, prompt: list[int] | str, config: GenerationConfig):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.job = Job(prompt, config, _emitter(asyncio.get_running_loop(), self.queue))
        self.engine, self.submitted = engine, time.monotonic()
        self.generation: Generation | None = None
        engine.scheduler.submit(self.job)

    def cancel(self) -> None:
        if self.generation is None:
            self.job.cancelled = True

    async def __aiter__(self) -> AsyncIterator[list[int]]:
        first = True
        try:
            while self.generation is None:
                kind, payload = await self.queue.get()
                if first:
                    self.engine.metrics.first_token_after(time.monotonic() - self.submitted)
                    first = False
                if kind == "error":
                    self.generation = Generation("", [], "error")
                    raise payload
                if kind == "done":
                    self.generation = payload
                else:
                    yield payload
        finally:
            self.cancel()  # a consumer that stopped early (or was cancelled) leaves the batch

    async def result(self) -> Generation:
        async for _ in self:
            pass
        return self.generation


class Engine:
    """Runs the adapter in the model thread: generation through the scheduler, scoring as calls between steps."""

    def __init__(self, adapter: TextAdapter, config: ServeConfig):
        self.adapter = adapter
        self.tokens = isinstance(adapter, TokenAdapter)
        self.metrics = Metrics()
        window = config.batch_window_ms / 1000
        self.scheduler = Scheduler(adapter, self.metrics, max_batch=config.max_batch, window_s=window,
                                   prefill_chunk=config.prefill_chunk)  # fmt: skip

    async def start(self) -> None:
        self.scheduler.start()

    async def stop(self) -> None:
        self.scheduler.stop()

    def stream(self, prompt: list[int] | str, config: GenerationConfig) -> TokenStream:
        """Submit a generation; iterate the stream for its tokens."""
        return TokenStream(self, prompt, config)

    async def generate(self, prompt: list[int] | str, config: GenerationConfig) -> Generation:
        return await self.stream(prompt, config).result()

    async def run(self, fn, *args):
        """``fn(*args)`` in the model thread, between decode steps, its time counted as model time."""
        queue: asyncio.Queue = asyncio.Queue()
        self.scheduler.call(Call(fn, args, _emitter(asyncio.get_running_loop(), queue)))
        kind, payload = await queue.get()
        if kind == "error":
            raise payload
        return payload

    def score(self, ids: list[int], top: int) -> tuple[list[float], list[int], list[list[tuple[int, float]]]]:
        """For t >= 1: the log-probability of ``ids[t]`` given ``ids[:t]``, its rank there (1: the likeliest) and
        the ``top`` likeliest tokens there (runs in the model thread)."""
        adapter: TokenAdapter = self.adapter
        values: list[float] = []
        ranks: list[int] = []
        tops: list[list[tuple[int, float]]] = []
        if len(ids) < 2:
            return values, ranks, tops
        with torch.inference_mode():
            x = torch.tensor([ids[:-1]])
            target = torch.tensor(ids[1:])
            for s, logits in adapter.chunked_logits(x):
                logp = torch.log_softmax(logits[0].float(), -1).cpu()
                tgt = target[s : s + logp.shape[0]]
                picked = logp.gather(-1, tgt[:, None])
                values += picked[:, 0].tolist()
                ranks += ((logp > picked).sum(-1) + 1).tolist()
                if top:
                    v, i = logp.topk(top, -1)
                    tops += [list(zip(a, b, strict=True)) for a, b in zip(i.tolist(), v.tolist(), strict=True)]
        return values, ranks, tops
