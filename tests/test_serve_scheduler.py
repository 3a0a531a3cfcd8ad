"""The per-step scheduler of ``evalsuite serve`` under load, over real HTTP to a server subprocess on 127.0.0.1.

A long generation must not stall short ones (16 clients of 16-token requests, one client streaming 8,000 tokens:
the short requests' p99 latency with it stays within 3x their p99 without it), a client that disconnects frees its
generation (streamed or not), tokens are streamed as they are made, and a batch's rows finish independently with
the same tokens as the native adapter. Beside it, the step API itself (DecodeRun) against ``generate``, and a
StepBatch of rows with their own rules, seeds and stops against each request's ``generate`` alone.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time

import pytest
import torch
from conftest import ServeProcess
from conftest import http as http_json

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.types import GenerationConfig

MODEL = "fox-pro-tiny"
CLIENTS, ROUNDS, SHORT_TOKENS, LONG_TOKENS = 16, 6, 16, 8000


@pytest.fixture(scope="module")
def server():
    # Timed as a server runs: no Triton interpreter, and one torch thread -- the clients share the 2 cores, and
    # OpenMP threads spinning against them make a decode step up to 16x slower on a loaded machine.
    proc = ServeProcess(MODEL, env={"TRITON_INTERPRET": None, "OMP_NUM_THREADS": "1"}).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def native():
    return NativeAdapter(load_card(MODEL), device="cpu")


def body(prompt: str, max_tokens: int, **extra) -> bytes:
    return json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, **extra}).encode()  # fmt: skip


def post(port: int, payload: bytes, timeout: float = 120) -> tuple[float, dict]:
    """One completion request: (seconds, reply)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    start = time.perf_counter()
    conn.request("POST", "/v1/completions", payload, {"Content-Type": "application/json"})
    reply = json.loads(conn.getresponse().read())
    conn.close()
    return time.perf_counter() - start, reply


def short_load(port: int) -> list[float]:
    """CLIENTS threads, each sending ROUNDS 16-token requests one after another: every request's latency."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(i: int) -> None:
        for r in range(ROUNDS):
            seconds, reply = post(port, body(f"Client {i} asks question {r}:", SHORT_TOKENS))
            assert reply["usage"]["completion_tokens"] == SHORT_TOKENS, reply
            with lock:
                latencies.append(seconds)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies


def p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[98]


class LongStream:
    """A streamed completion of ``max_tokens`` read on a raw socket until :meth:`close` disconnects it."""

    def __init__(self, port: int, max_tokens: int, prompt: str = "Once upon a time"):
        payload = body(prompt, max_tokens, stream=True)
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        head = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        self.sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        self.sent = time.perf_counter()
        self.received = b""

    def read_events(self, n: int) -> list[float]:
        """Block until ``n`` more ``data:`` events arrived; their arrival times."""
        times = []
        while len(times) < n:
            chunk = self.sock.recv(65536)
            assert chunk, "the server closed the stream"
            times += [time.perf_counter()] * chunk.count(b"data: ")
            self.received += chunk
        return times

    def close(self) -> None:
        self.sock.close()


def wait_for(predicate, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def stats(server) -> dict:
    return http_json("GET", f"{server.url}/stats")[1]


def test_a_long_generation_does_not_stall_short_requests(server):
    post(server.port, body("warm up", SHORT_TOKENS))
    alone = short_load(server.port)
    long = LongStream(server.port, LONG_TOKENS)
    long.read_events(20)  # generating
    try:
        beside = short_load(server.port)
        long.read_events(20)  # still generating, streamed while the short requests ran
    finally:
        long.close()
    ratio = p99(beside) / p99(alone)
    print(f"\nshort p99 alone {p99(alone):.3f}s, beside the long one {p99(beside):.3f}s ({ratio:.2f}x); "
          f"medians {statistics.median(alone):.3f}s / {statistics.median(beside):.3f}s")  # fmt: skip
    assert ratio <= 3.0
    # the disconnected stream leaves its batch: nothing runs any more
    assert wait_for(lambda: stats(server)["running"] == 0 and stats(server)["cancelled"] >= 1), stats(server)


def test_a_disconnected_client_cancels_its_generation(server):
    """A 4,000-token request whose client leaves after a second stops generating; the next request is answered at
    once. Both a plain request (its connection closed while waiting) and a stream."""
    for streamed in (False, True):
        leave_early(server, streamed)


def leave_early(server, streamed: bool) -> None:
    before = stats(server)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    payload = body("A long story:", 4000, stream=streamed)
    head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    assert wait_for(lambda: stats(server)["generated_tokens"] > before["generated_tokens"] + 100)
    sock.close()
    assert wait_for(lambda: stats(server)["cancelled"] == before["cancelled"] + 1), stats(server)
    assert stats(server)["running"] == 0
    seconds, reply = post(server.port, body("Next:", 4))
    assert reply["usage"]["completion_tokens"] == 4 and seconds < 10.0
    made = stats(server)["generated_tokens"] - before["generated_tokens"]
    assert made < 4000  # the cancelled generation stopped early


def test_tokens_are_streamed_as_they_are_made(server):
    """Events of one stream arrive spread over the generation, not all at its end."""
    stream = LongStream(server.port, 400, "The market opened")
    try:
        times = stream.read_events(300)
    finally:
        stream.close()
    # sent at the end, 300 events would arrive in one burst; as made, they span most of the time to the last one
    assert times[-1] - times[0] > 0.5 * (times[-1] - stream.sent)


def test_rows_of_a_batch_end_independently_and_equal_native(server, native):
    """Concurrent requests of different lengths, stops and sampling share batches; each answer is the native
    adapter's own for that request alone."""
    requests = [
        ({"prompt": "The river was quiet and", "max_tokens": 3}, GenerationConfig(max_new_tokens=3)),
        ({"prompt": "A letter arrived", "max_tokens": 40}, GenerationConfig(max_new_tokens=40)),
        ({"prompt": "Numbers: 1, 2, 3,", "max_tokens": 25, "temperature": 0.8, "seed": 11},
         GenerationConfig(max_new_tokens=25, temperature=0.8, seed=11)),
        ({"prompt": "She opened the door and saw", "max_tokens": 12, "ignore_eos": True},
         GenerationConfig(max_new_tokens=12, stop_at_eos=False)),
    ]  # fmt: skip
    want = [native.generate_until([r["prompt"]], config)[0].text for r, config in requests]
    barrier = threading.Barrier(len(requests))
    results = [None] * len(requests)

    def ask(i: int) -> None:
        barrier.wait()
        payload = json.dumps({"model": MODEL, "temperature": 0, **requests[i][0]}).encode()
        results[i] = post(server.port, payload)[1]["choices"][0]["text"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == want


def test_decode_run_steps_equal_generate(native):
    """The step API: prefill in passes of any size (left-padded rows), then steps, gives generate's tokens."""
    texts = ("The river was quiet and", "A letter arrived at the old mill", "Hi")
    prompts = [native.tokenizer.encode(t) for t in texts]
    config = GenerationConfig(max_new_tokens=8, stop_at_eos=False)
    want = [g.token_ids for g in native.generate(prompts, config)]
    for budget in (None, 1, 3):
        run = native.decode_run(prompts, config)
        passes = 1
        while not run.prefill(budget):
            passes += 1
        tokens = []
        for i in range(8):
            tokens.append(run.logits.argmax(-1))
            if i < 7:
                run.step(tokens[-1])
        assert torch.stack(tokens, 1).tolist() == want, budget
        assert (passes > 1) == (budget is not None)  # a budget takes the prompt in several passes


def test_a_step_batch_ends_each_row_as_generate_does_alone(native):
    """The scheduler's StepBatch (the run's chooser, one Finisher; the prompt in passes of 3 tokens): rows with their
    own lengths, stops, logit rules and seeds, left-padded together, each end with the Generation of the native
    adapter's generate of that request alone, having streamed its kept tokens first."""
    from evalsuite.serve.scheduler import Job, StepBatch

    prompts = [native.tokenizer.encode(t) for t in ("The river", "A much longer prompt that pads the others", "He")]
    free = native.generate([prompts[2]], GenerationConfig(max_new_tokens=10, stop_at_eos=False))[0].token_ids
    configs = [
        GenerationConfig(max_new_tokens=4, temperature=0.9, top_k=40, seed=5, repetition_penalty=1.3),
        GenerationConfig(max_new_tokens=12, presence_penalty=1.0, logit_bias={50: -5.0}, stop=["Nik"]),
        GenerationConfig(max_new_tokens=10, stop_token_ids=[free[5]], min_tokens=3, stop_at_eos=False),
    ]
    alone = [native.generate([p], c)[0] for p, c in zip(prompts, configs, strict=True)]
    events: list[list[tuple[str, object]]] = [[] for _ in configs]
    jobs = [Job(p, c, lambda kind, payload, out=out: out.append((kind, payload)))
            for p, c, out in zip(prompts, configs, events, strict=True)]  # fmt: skip
    batch = StepBatch(native, jobs, prefill_chunk=3)
    steps, counted = 0, []
    heard = lambda: sum(map(len, events))  # noqa: E731
    while batch.live:
        before = heard()
        batch.advance(lambda generated, prefilled, before=before: counted.append((generated, heard() - before)))
        steps += 1
    # every step's tokens are counted once, before any job of the step hears of them
    assert len(counted) == steps and all(early == 0 for _, early in counted)
    assert sum(generated for generated, _ in counted) == sum(len(g.token_ids) for g in alone)
    for got, want in zip(events, alone, strict=True):
        kinds = [kind for kind, _ in got]
        assert kinds == ["tokens"] * (len(kinds) - 1) + ["done"] and got[-1][1] == want
        assert [t for _, ids in got[:-1] for t in ids] == want.token_ids[: len(got) - 1]
    # each row ends its own way, at its own step: length, a stop string inside a token, a stop token
    assert [(len(g.token_ids), g.finish_reason) for g in alone] == [(4, "length"), (8, "stop"), (5, "stop")]
    assert steps > max(len(g.token_ids) for g in alone)  # the prompt took several prefill passes
