"""Throughput of `evalsuite serve` on this machine, with and without batching, and where the time goes.

For each ``--max-batch`` value it starts ``evalsuite serve --model MODEL`` on a free port of 127.0.0.1, sends
``--clients`` concurrent streams of ``--requests`` completions each (greedy, or sampled at ``--temperature`` with a
seed per request; short prompts, ``--max-tokens`` new tokens, ``ignore_eos`` so every request generates the same
number), and reports requests/s, generated tokens/s, the latency per request and the share of the wall time the
model was busy (the server's ``/stats``). It then profiles
the parts of one request in this process: the model's generate call alone (batch 1 and a full batch), the
tokenizer (encode the prompt, decode the answer, per-token pieces), and JSON encoding/decoding of a request and a
reply; the rest of a request's time is HTTP, the event loop and the threads handing work over.

    python scripts/serve_throughput.py --model fox-pro-tiny --clients 8 --requests 12 --max-tokens 16

Every request goes to 127.0.0.1 only; the loops are bounded by ``--clients x --requests``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = [
    "The river was quiet and",
    "A letter arrived",
    "Once upon a time there lived",
    "Numbers: 1, 2, 3,",
    "She opened the door and saw",
    "The best thing to do in San Francisco is",
    "In the morning the market",
    "He wrote",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    """One keep-alive HTTP connection to the server."""

    def __init__(self, port: int):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=300)

    def request(self, method: str, path: str, body: dict | None = None) -> dict:
        data = json.dumps(body).encode() if body is not None else None
        self.conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = self.conn.getresponse()
        payload = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"{response.status}: {payload}")
        return payload


def start_server(model: str, max_batch: int, window_ms: float) -> tuple[subprocess.Popen, int]:
    port = free_port()
    cmd = [sys.executable, "-m", "evalsuite.cli", "serve", "--model", model, "--port", str(port), "--device", "cpu",
           "--max-batch", str(max_batch), "--batch-window-ms", str(window_ms), "--log-level", "warning"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            Client(port).request("GET", "/health")
            return proc, port
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not start")


def load_test(model: str, port: int, clients: int, requests: int, max_tokens: int, temperature: float) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": True}
    for prompt in PROMPTS[:2]:  # warm-up
        Client(port).request("POST", "/v1/completions", {**body, "prompt": prompt})
    before = Client(port).request("GET", "/stats")
    latencies: list[float] = []
    tokens = [0]
    lock = threading.Lock()
    barrier = threading.Barrier(clients + 1)

    def worker(index: int) -> None:
        client = Client(port)
        barrier.wait()
        for r in range(requests):
            prompt = PROMPTS[(index + r) % len(PROMPTS)]
            seed = {"seed": index * requests + r} if temperature > 0 else {}  # sampled: a seed per request
            start = time.perf_counter()
            reply = client.request("POST", "/v1/completions", {**body, "prompt": prompt, **seed})
            elapsed = time.perf_counter() - start
            with lock:
                latencies.append(elapsed)
                tokens[0] += reply["usage"]["completion_tokens"]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    after = Client(port).request("GET", "/stats")
    busy = after["model_busy_s"] - before["model_busy_s"]
    sizes = {k: after["batch_sizes"].get(k, 0) - before["batch_sizes"].get(k, 0) for k in after["batch_sizes"]}
    n = clients * requests
    return {
        "requests": n,
        "wall_s": round(wall, 3),
        "requests_per_s": round(n / wall, 2),
        "generated_tokens_per_s": round(tokens[0] / wall, 1),
        "latency_mean_s": round(statistics.mean(latencies), 4),
        "latency_p50_s": round(statistics.median(latencies), 4),
        "latency_max_s": round(max(latencies), 4),
        "model_busy_s": round(busy, 3),
        "model_busy_share": round(busy / wall, 3),
        "batches": after["batches"] - before["batches"],
        "batch_sizes": {k: v for k, v in sizes.items() if v},
    }


def profile_parts(model: str, max_tokens: int, batch: int, repeats: int) -> dict:
    """Seconds per request for each part, measured in this process."""
    from evalsuite.adapters.registry import AdapterOptions, load_adapter
    from evalsuite.generation.types import GenerationConfig
    from evalsuite.serve import token_pieces

    adapter = load_adapter(model, AdapterOptions(device="cpu"))
    tok = adapter.tokenizer
    config = GenerationConfig(max_new_tokens=max_tokens, stop_at_eos=False)
    ids = [tok.encode(p) for p in PROMPTS]
    adapter.generate(ids[:2], config)  # warm-up

    def timed(fn, n=repeats):
        start = time.perf_counter()
        for _ in range(n):
            out = fn()
        return (time.perf_counter() - start) / n, out

    one, _ = timed(lambda: adapter.generate(ids[:1], config))
    full, gens = timed(lambda: adapter.generate((ids * ((batch + len(ids) - 1) // len(ids)))[:batch], config))
    gen_ids = gens[0].token_ids
    encode, _ = timed(lambda: [tok.encode(p) for p in PROMPTS], 50)
    decode, _ = timed(lambda: [tok.decode(g.token_ids) for g in gens], 50)
    pieces, _ = timed(lambda: token_pieces(tok, gen_ids), 50)
    request = {"model": model, "prompt": PROMPTS[0], "max_tokens": max_tokens, "temperature": 0}
    reply = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": model,
             "choices": [{"index": 0, "text": gens[0].text, "logprobs": None, "finish_reason": "length"}],
             "usage": {"prompt_tokens": len(ids[0]), "completion_tokens": max_tokens, "total_tokens": 0}}  # fmt: skip
    # both messages encoded and decoded once, as the client and the server do between them
    js, _ = timed(lambda: (json.loads(json.dumps(request)), json.loads(json.dumps(reply))), 2000)
    return {
        "generate_batch1_s": round(one, 4),
        f"generate_batch{batch}_s": round(full, 4),
        f"generate_batch{batch}_per_request_s": round(full / batch, 4),
        "tokenizer_encode_per_request_s": round(encode / len(PROMPTS), 6),
        "tokenizer_decode_per_request_s": round(decode / len(gens), 6),
        "token_pieces_per_request_s": round(pieces, 6),
        "json_per_request_s": round(js, 6),
        "torch_threads": __import__("torch").get_num_threads(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="fox-pro-tiny")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=12, help="per client")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--max-batch", default="1,8", help="comma-separated --max-batch values to compare")
    parser.add_argument("--batch-window-ms", type=float, default=5.0)
    parser.add_argument("--temperature", type=float, default=0.0, help="above 0: sampled requests, a seed each")
    parser.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = parser.parse_args()
    if args.clients < 1 or args.requests < 1 or args.clients * args.requests > 2000:
        parser.error("--clients and --requests must be positive, with at most 2000 requests in all")
    results = {
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "model": args.model,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "runs": {},
    }
    for max_batch in [int(x) for x in args.max_batch.split(",")]:
        proc, port = start_server(args.model, max_batch, args.batch_window_ms)
        try:
            run = load_test(args.model, port, args.clients, args.requests, args.max_tokens, args.temperature)
        finally:
            proc.terminate()
            proc.wait(30)
        results["runs"][f"max_batch={max_batch}"] = run
        print(f"max_batch={max_batch}: {json.dumps(run)}", flush=True)
    results["profile"] = profile_parts(args.model, args.max_tokens, args.clients, repeats=5)
    print(f"profile: {json.dumps(results['profile'])}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
