"""The engine of ``evalsuite serve``: one worker thread runs the model; a batcher on the event loop groups
requests of one batch key (:func:`~evalsuite.serve.protocol.batch_key`) into one generate call, each request with
its own config where the adapter takes one per row."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from evalsuite.adapters.base import TextAdapter, TokenAdapter
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.serve.protocol import ServeConfig, batch_key


@dataclass
class _Job:
    key: object
    prompt: list[int] | str
    config: GenerationConfig
    future: asyncio.Future


@dataclass
class Stats:
    requests: int = 0
    generations: int = 0
    batches: int = 0
    batch_sizes: dict = field(default_factory=dict)
    busy_s: float = 0.0  # time the worker spent in the model (generation and scoring)
    started: float = field(default_factory=time.time)

    def to_dict(self) -> dict:
        up = time.time() - self.started
        return {"requests": self.requests, "generations": self.generations, "batches": self.batches,
                "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                "model_busy_s": round(self.busy_s, 4), "uptime_s": round(up, 3)}  # fmt: skip


class Engine:
    """Runs the adapter: generation through the batcher, scoring directly, both in one worker thread."""

    def __init__(self, adapter: TextAdapter, config: ServeConfig):
        self.adapter = adapter
        self.tokens = isinstance(adapter, TokenAdapter)
        self.max_batch = max(1, config.max_batch)
        self.window = max(0.0, config.batch_window_ms) / 1000
        self.worker = ThreadPoolExecutor(1, thread_name_prefix="evalsuite-model")
        self.stats = Stats()
        self.queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        self.queue = asyncio.Queue()
        self._task = asyncio.create_task(self._batcher())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.worker.shutdown(wait=False, cancel_futures=True)

    async def run(self, fn, *args):
        """``fn(*args)`` in the worker thread, its time counted as model time."""

        def timed():
            start = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self.stats.busy_s += time.perf_counter() - start

        return await asyncio.get_running_loop().run_in_executor(self.worker, timed)

    async def generate(self, prompt: list[int] | str, config: GenerationConfig) -> Generation:
        future = asyncio.get_running_loop().create_future()
        await self.queue.put(_Job(batch_key(config, self.adapter.per_row_configs), prompt, config, future))
        return await future

    async def _batcher(self) -> None:
        loop = asyncio.get_running_loop()
        pending: list[_Job] = []
        while True:
            if not pending:
                pending.append(await self.queue.get())
            deadline = loop.time() + self.window
            while self.max_batch > 1:
                while not self.queue.empty():
                    pending.append(self.queue.get_nowait())
                if sum(j.key == pending[0].key for j in pending) >= self.max_batch:
                    break
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    pending.append(await asyncio.wait_for(self.queue.get(), remaining))
                except asyncio.TimeoutError:  # noqa: UP041 - distinct from TimeoutError before Python 3.11
                    break
            key = pending[0].key
            group = [j for j in pending if j.key == key][: self.max_batch]
            taken = {id(j) for j in group}
            pending = [j for j in pending if id(j) not in taken]
            await self._run_group([j for j in group if not j.future.done()])

    async def _run_group(self, jobs: list[_Job]) -> None:
        if not jobs:
            return
        self.stats.batches += 1
        self.stats.generations += len(jobs)
        self.stats.batch_sizes[len(jobs)] = self.stats.batch_sizes.get(len(jobs), 0) + 1
        try:
            configs = [j.config for j in jobs] if self.adapter.per_row_configs else jobs[0].config
            gens = await self.run(self._generate_rows, [j.prompt for j in jobs], configs)
        except Exception as e:  # noqa: BLE001 - handed to every waiting request
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        for j, gen in zip(jobs, gens, strict=True):
            if not j.future.done():
                j.future.set_result(gen)

    def _generate_rows(self, prompts: list, config: GenerationConfig | list[GenerationConfig]) -> list[Generation]:
        if self.tokens:
            return self.adapter.generate(prompts, config)
        return self.adapter.generate_until(prompts, config)

    def score(self, ids: list[int], top: int) -> tuple[list[float], list[int], list[list[tuple[int, float]]]]:
        """For t >= 1: the log-probability of ``ids[t]`` given ``ids[:t]``, its rank there (1: the likeliest) and
        the ``top`` likeliest tokens there (runs in the worker thread)."""
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
