"""What ``evalsuite serve`` counts, shown at ``GET /metrics`` in the Prometheus text format (version 0.0.4) and, for
the same numbers as JSON, at ``GET /stats``. The model thread and the event loop both write, under one lock."""

from __future__ import annotations

import math
import threading
import time
from collections import Counter

PREFIX = "evalsuite"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Histogram:
    """Cumulative buckets, sum and count, as Prometheus histograms are exposed."""

    def __init__(self, buckets: tuple[float, ...]):
        self.bounds = (*buckets, math.inf)
        self.counts = [0] * len(self.bounds)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            le = "+Inf" if bound == math.inf else f"{bound:g}"
            out.append(f'{name}_bucket{{{labels}{"," if labels else ""}le="{le}"}} {running}')
        tail = f"{{{labels}}}" if labels else ""
        return [*out, f"{name}_sum{tail} {self.sum:.6f}", f"{name}_count{tail} {self.count}"]


class Metrics:
    """The server's counters. Writers: :meth:`request_done` (the handlers), the ``scheduler_*`` methods (the model
    thread). ``running`` and ``waiting`` are the scheduler's current numbers of requests in a batch and queued."""

    def __init__(self):
        self.lock = threading.Lock()
        self.started = time.time()
        self.requests: Counter = Counter()  # (endpoint, status) -> count
        self.latency = {"completions": Histogram(LATENCY_BUCKETS), "chat": Histogram(LATENCY_BUCKETS)}
        self.first_token = Histogram(LATENCY_BUCKETS)
        self.step_rows = Histogram(BATCH_BUCKETS)  # rows of the batch each decode step ran
        self.prompt_tokens = self.generated_tokens = self.prefill_tokens = 0
        self.generations = self.batches = self.steps = self.cancelled = 0
        self.batch_sizes: Counter = Counter()  # requests per batch formed
        self.busy_s = 0.0
        self.running = self.waiting = 0

    def prompt(self, tokens: int) -> None:
        with self.lock:
            self.prompt_tokens += tokens

    def request_done(self, endpoint: str, status: int, seconds: float) -> None:
        with self.lock:
            self.requests[endpoint, status] += 1
            if endpoint in self.latency and status == 200:
                self.latency[endpoint].observe(seconds)

    def batch_formed(self, size: int) -> None:
        with self.lock:
            self.batches += 1
            self.generations += size
            self.batch_sizes[size] += 1

    def step_done(self, rows: int, generated: int, prefilled: int, seconds: float) -> None:
        with self.lock:
            self.steps += 1
            if generated:
                self.step_rows.observe(rows)
            self.generated_tokens += generated
            self.prefill_tokens += prefilled
            self.busy_s += seconds

    def busy(self, seconds: float) -> None:
        with self.lock:
            self.busy_s += seconds

    def first_token_after(self, seconds: float) -> None:
        with self.lock:
            self.first_token.observe(seconds)

    def cancel(self, n: int = 1) -> None:
        with self.lock:
            self.cancelled += n

    def queue(self, running: int, waiting: int) -> None:
        with self.lock:
            self.running, self.waiting = running, waiting

    def stats(self) -> dict:
        """The JSON of ``GET /stats``."""
        with self.lock:
            return {"requests": sum(self.requests.values()), "generations": self.generations,
                    "batches": self.batches, "batch_sizes": {str(k): v for k, v in sorted(self.batch_sizes.items())},
                    "decode_steps": self.steps, "generated_tokens": self.generated_tokens,
                    "cancelled": self.cancelled, "running": self.running, "waiting": self.waiting,
                    "model_busy_s": round(self.busy_s, 4),
                    "uptime_s": round(time.time() - self.started, 3)}  # fmt: skip

    def prometheus(self) -> str:
        """Every metric in the Prometheus text exposition format."""
        p = PREFIX
        with self.lock:
            out = [f"# HELP {p}_requests_total HTTP requests answered, by endpoint and status.",
                   f"# TYPE {p}_requests_total counter"]  # fmt: skip
            for (endpoint, status), n in sorted(self.requests.items()):
                out.append(f'{p}_requests_total{{endpoint="{endpoint}",status="{status}"}} {n}')
            out += [f"# HELP {p}_request_latency_seconds Time from a request's arrival to its last byte (status 200).",
                    f"# TYPE {p}_request_latency_seconds histogram"]  # fmt: skip
            for endpoint, hist in self.latency.items():
                out += hist.lines(f"{p}_request_latency_seconds", f'endpoint="{endpoint}"')
            out += [f"# HELP {p}_time_to_first_token_seconds Time from a generation's submission to its first token.",
                    f"# TYPE {p}_time_to_first_token_seconds histogram", *self.first_token.lines(
                        f"{p}_time_to_first_token_seconds")]  # fmt: skip
            out += [f"# HELP {p}_step_batch_rows Requests in the batch of each decode step.",
                    f"# TYPE {p}_step_batch_rows histogram", *self.step_rows.lines(f"{p}_step_batch_rows")]  # fmt: skip
            for name, value, kind, text in (
                ("prompt_tokens_total", self.prompt_tokens, "counter", "Prompt tokens of generation requests."),
                ("generation_tokens_total", self.generated_tokens, "counter", "Tokens generated."),
                ("prefill_tokens_total", self.prefill_tokens, "counter", "Prompt tokens prefilled."),
                ("generations_total", self.generations, "counter", "Generations started."),
                ("batches_total", self.batches, "counter", "Batches formed (requests prefilled together)."),
                ("decode_steps_total", self.steps, "counter", "Scheduler steps (a prefill pass or a decode step)."),
                ("cancelled_total", self.cancelled, "counter", "Generations cancelled (the client went away)."),
                ("model_busy_seconds_total", self.busy_s, "counter", "Time the model thread spent in the model."),
                ("running_requests", self.running, "gauge", "Generations in a running batch."),
                ("waiting_requests", self.waiting, "gauge", "Generations waiting to join a batch."),
            ):
                out += [f"# HELP {p}_{name} {text}", f"# TYPE {p}_{name} {kind}", f"{p}_{name} {value:g}"]
        return "\n".join(out) + "\n"
