"""`evalsuite serve` over real HTTP on 127.0.0.1: a tiny model in a subprocess, answers checked against the native
adapter in this process (same card, same random init); streaming, batching of concurrent requests, error shapes."""

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import assert_one_line_error, free_port, http

from evalsuite.adapters.base import ModelInfo, TextAdapter
from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.serve import ServeConfig, build_app, chat_prompt, split_text, token_pieces
from evalsuite.tokenizers import get_tokenizer

MODEL = "fox-pro-tiny"
PROMPTS = [
    "The river was quiet and",
    "A letter arrived",
    "Once upon a time, in a small village by the sea, there lived",
    "Numbers: 1, 2, 3,",
    "She opened the door and saw",
    "The best thing to do in San Francisco is",
    "In the morning the market",
    "He wrote",
]


@pytest.fixture(scope="module")
def native():
    return NativeAdapter(load_card(MODEL), device="cpu")


def complete(server, **body):
    status, reply, _ = http("POST", f"{server.base_url}/completions", {"model": MODEL, **body})
    assert status == 200, reply
    return reply


def stream(url: str, body: dict) -> list[str]:
    """The ``data:`` payloads of a server-sent event stream, in order."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        lines = response.read().decode().split("\n")
    return [line[len("data: ") :] for line in lines if line.startswith("data: ")]


def test_models(served_fox):
    status, reply, _ = http("GET", f"{served_fox.base_url}/models")
    assert status == 200 and reply["object"] == "list"
    assert [(m["id"], m["object"], m["max_model_len"]) for m in reply["data"]] == [(MODEL, "model", 16384)]
    assert http("GET", f"{served_fox.base_url}/models/{MODEL}")[1]["id"] == MODEL
    status, reply, _ = http("GET", f"{served_fox.base_url}/models/gpt-5")
    assert status == 404 and reply["error"]["code"] == "model_not_found"


def test_greedy_completion_equals_native_generate(served_fox, native):
    config = GenerationConfig(max_new_tokens=12)
    expected = native.generate_until(PROMPTS[:2], config)
    reply = complete(served_fox, prompt=PROMPTS[0], max_tokens=12, temperature=0)
    (choice,) = reply["choices"]
    assert choice["text"] == expected[0].text and choice["finish_reason"] == "length"
    assert reply["object"] == "text_completion" and reply["model"] == MODEL
    n_prompt = len(native.tokenizer.encode(PROMPTS[0]))
    assert reply["usage"] == {"prompt_tokens": n_prompt, "completion_tokens": 12, "total_tokens": n_prompt + 12}
    assert complete(served_fox, prompt=PROMPTS[0], max_tokens=12, temperature=0)["choices"][0]["text"] == choice["text"]
    # a list of prompts: one choice each, in order; echo puts the prompt first
    reply = complete(served_fox, prompt=PROMPTS[:2], max_tokens=12, temperature=0, echo=True)
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert [c["text"] for c in reply["choices"]] == [p + g.text for p, g in zip(PROMPTS, expected, strict=False)]
    # stop strings: cut before the stop, finish_reason "stop", stop_reason the string
    cut = expected[0].text[3:6]
    reply = complete(served_fox, prompt=PROMPTS[0], max_tokens=12, temperature=0, stop=[cut])
    assert reply["choices"][0]["text"] == expected[0].text[: expected[0].text.find(cut)]
    assert (reply["choices"][0]["finish_reason"], reply["choices"][0]["stop_reason"]) == ("stop", cut)


def test_sampling_is_seeded(served_fox, native):
    body = {"prompt": PROMPTS[1], "max_tokens": 8, "temperature": 1.0, "top_p": 0.9, "seed": 7}
    expected = native.generate_until([PROMPTS[1]], GenerationConfig(max_new_tokens=8, temperature=1.0, top_p=0.9,
                                                                     seed=7))  # fmt: skip
    assert complete(served_fox, **body)["choices"][0]["text"] == expected[0].text


def test_echo_logprobs_equal_native_loglikelihood(served_fox, native):
    context, continuation = "The quiet river ran past", " the old mill"
    reply = complete(served_fox, prompt=context + continuation, max_tokens=0, echo=True, logprobs=2, temperature=0)
    (choice,) = reply["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == context + continuation and reply["usage"]["completion_tokens"] == 0
    ids = native.tokenizer.encode(context + continuation)  # BOS first (gpt2-json)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["text_offset"]) == len(ids)
    # the BOS the tokenizer put first adds no text: its string is empty, so the tokens join back to the text
    assert lp["tokens"][0] == "" and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == "".join(lp["tokens"][1:]) == context + continuation
    # every prompt token's log-probability is the native adapter's (one teacher-forced pass)
    import torch

    full = torch.tensor([ids])
    nll = native.token_nll(full[:, :-1], full[:, 1:])[0]
    assert lp["token_logprobs"][1:] == pytest.approx((-nll).tolist(), abs=1e-4)
    assert all(
        len(top) == 2 and list(top.values()) == sorted(top.values(), reverse=True) for top in lp["top_logprobs"][1:]
    )
    # the continuation by text offset, as a client finds it: the same sum and greedy flag as loglikelihood
    picked = [i for i, o in enumerate(lp["text_offset"]) if o >= len(context)]
    ((logprob, greedy),) = native.loglikelihood([(context, continuation)])
    assert sum(lp["token_logprobs"][i] for i in picked) == pytest.approx(logprob, abs=1e-4)
    assert greedy == all(lp["token_logprobs"][i] >= max(lp["top_logprobs"][i].values()) for i in picked)
    # logprobs of generated tokens (no echo): the native greedy tokens, each its argmax
    reply = complete(served_fox, prompt=context, max_tokens=4, logprobs=1, temperature=0)
    lp = reply["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == reply["choices"][0]["text"] and lp["text_offset"][0] == 0
    assert all(v == pytest.approx(max(t.values()), abs=1e-6) for v, t in zip(lp["token_logprobs"], lp["top_logprobs"],
                                                                            strict=True))  # fmt: skip


def test_chat_uses_the_documented_template(served_fox, native):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the river?"}]
    prompt = chat_prompt(messages, native.tokenizer)
    assert prompt == "System: Be brief.\nUser: Where is the river?\nAssistant:"
    expected = native.generate_until([prompt], GenerationConfig(max_new_tokens=10))[0]
    body = {"model": MODEL, "messages": messages, "max_tokens": 10, "temperature": 0}
    status, reply, _ = http("POST", f"{served_fox.base_url}/chat/completions", body)
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    # text content parts are joined
    split = [{"type": "text", "text": "Where is "}, {"type": "text", "text": "the river?"}]
    parts = [messages[0], {"role": "user", "content": split}]
    status, again, _ = http("POST", f"{served_fox.base_url}/chat/completions", {**body, "messages": parts})
    assert again["choices"][0]["message"]["content"] == expected.text


def test_streaming_concatenates_to_the_non_streamed_text(served_fox):
    body = {"model": MODEL, "prompt": PROMPTS[2], "max_tokens": 16, "temperature": 0}
    whole = complete(served_fox, **{k: v for k, v in body.items() if k != "model"})["choices"][0]
    events = stream(f"{served_fox.base_url}/completions", {**body, "stream": True,
                                                          "stream_options": {"include_usage": True}})  # fmt: skip
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert len(texts) > 3 and "".join(texts) == whole["text"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-1]["usage"]["completion_tokens"] == 16
    # chat: role first, then content deltas, then the finish reason
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8, "temperature": 0}
    whole = http("POST", f"{served_fox.base_url}/chat/completions", chat)[1]["choices"][0]["message"]["content"]
    events = stream(f"{served_fox.base_url}/chat/completions", {**chat, "stream": True})
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole
    assert chunks[-1]["object"] == "chat.completion.chunk" and chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_concurrent_requests_are_batched_and_correct(served_fox, native):
    config = GenerationConfig(max_new_tokens=16)
    expected = {p: native.generate_until([p], config)[0].text for p in PROMPTS}
    before = http("GET", f"{served_fox.url}/stats")[1]
    barrier = threading.Barrier(8)

    def ask(prompt):
        barrier.wait()
        return prompt, complete(served_fox, prompt=prompt, max_tokens=16, temperature=0)["choices"][0]["text"]

    with ThreadPoolExecutor(8) as pool:
        answers = dict(pool.map(ask, PROMPTS))
    assert answers == expected
    after = http("GET", f"{served_fox.url}/stats")[1]
    assert after["generations"] - before["generations"] == 8
    assert after["batches"] - before["batches"] < 8  # some requests shared a generate call
    assert any(int(size) > 1 for size in after["batch_sizes"])


def test_tokenizer_routes(served_fox, native):
    """vLLM's /tokenize, /detokenize and /tokenizer_info: the string BOS rule, chat prompts, round trips."""
    tok = native.tokenizer
    text = 'The river, quiet "and" old'
    status, reply, _ = http("POST", f"{served_fox.url}/tokenize", {"model": MODEL, "prompt": text})
    assert status == 200 and reply["tokens"] == tok.encode(text) and reply["tokens"][0] == tok.bos_id
    assert (reply["count"], reply["max_model_len"]) == (len(reply["tokens"]), 16384)
    bare = http("POST", f"{served_fox.url}/tokenize", {"prompt": text, "add_special_tokens": False})[1]["tokens"]
    assert bare == tok.encode(text, add_bos=False)
    once = http("POST", f"{served_fox.url}/tokenize", {"prompt": "<|endoftext|>" + text})[1]["tokens"]
    assert once == reply["tokens"]  # a text that begins with BOS gets no second one
    messages = [{"role": "user", "content": "Hi"}]
    chat = http("POST", f"{served_fox.url}/tokenize", {"messages": messages})[1]["tokens"]
    assert chat == tok.encode(chat_prompt(messages, tok))
    assert http("POST", f"{served_fox.url}/detokenize", {"tokens": bare})[1] == {"prompt": text}
    info = http("GET", f"{served_fox.url}/tokenizer_info")[1]
    assert (info["bos_token"], info["eos_token"], info["bos_token_id"], info["add_bos_token"]) == (
        "<|endoftext|>", "<|endoftext|>", tok.bos_id, True)  # fmt: skip
    bad = [
        ("tokenize", {"prompt": 3}, "prompt"),
        ("detokenize", {"tokens": "x"}, "tokens"),
        ("detokenize", {"tokens": [10**9]}, "tokens"),
        ("tokenize", {"model": "gpt-5", "prompt": "a"}, "model"),
    ]
    for route, body, param in bad:
        status, reply, _ = http("POST", f"{served_fox.url}/{route}", body)
        assert status in (400, 404) and reply["error"]["param"] == param


def test_metrics_in_the_prometheus_format(served_fox):
    def scrape() -> dict[str, float]:
        status, text, headers = http("GET", f"{served_fox.url}/metrics")
        assert status == 200 and headers["content-type"].startswith("text/plain")
        lines = [line for line in text.splitlines() if line and not line.startswith("#")]
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in lines}

    before = scrape()
    complete(served_fox, prompt=PROMPTS[0], max_tokens=5, temperature=0, ignore_eos=True)
    after = scrape()
    ok = 'evalsuite_requests_total{endpoint="completions",status="200"}'
    assert after[ok] == before.get(ok, 0) + 1
    assert after["evalsuite_generation_tokens_total"] - before["evalsuite_generation_tokens_total"] == 5
    count = 'evalsuite_request_latency_seconds_count{endpoint="completions"}'
    assert after[count] == before[count] + 1
    assert after['evalsuite_request_latency_seconds_bucket{endpoint="completions",le="+Inf"}'] == after[count]
    assert after["evalsuite_step_batch_rows_count"] > before["evalsuite_step_batch_rows_count"]
    assert after["evalsuite_running_requests"] == 0


@pytest.mark.parametrize(
    "path, body, status, param, code, message",
    [
        ("completions", b"{not json", 400, None, None, "not valid JSON"),
        ("completions", b"[1, 2]", 400, None, None, "must be a JSON object"),
        ("completions", {"model": MODEL}, 400, "prompt", None, "provide a prompt"),
        ("completions", {"prompt": "hi"}, 400, "model", None, "provide a model"),
        ("completions", {"model": "gpt-5", "prompt": "hi"}, 404, "model", "model_not_found", "gpt-5"),
        ("completions", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, "temperature", None, "number"),
        ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": -1}, 400, "max_tokens", None, "at least 0"),
        ("completions", {"model": MODEL, "prompt": "hi", "n": 0}, 400, "n", None, "between 1 and 128"),
        ("completions", {"model": MODEL, "prompt": "hi", "logprobs": 9}, 400, "logprobs", None, "between 0 and 5"),
        ("completions", {"model": MODEL, "prompt": 5}, 400, "prompt", None, "must be a string"),
        ("completions", {"model": MODEL, "prompt": "hi", "max_tokens": 20000}, 400, "max_tokens",
         "context_length_exceeded", "maximum context length is 16384 tokens"),
        ("completions", {"model": MODEL, "prompt": "word " * 17000, "max_tokens": 1}, 400, "prompt",
         "context_length_exceeded", "requested 17003 tokens (17002 in the prompt, 1 for the completion)"),
        ("chat/completions", {"model": MODEL}, 400, "messages", None, "provide messages"),
        ("chat/completions", {"model": MODEL, "messages": [{"content": "x"}]}, 400, "messages.0", None, "role"),
        ("chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400,
         "logprobs", None, "not supported"),
    ],
)  # fmt: skip
def test_bad_requests_get_openai_errors(served_fox, path, body, status, param, code, message):
    raw = body if isinstance(body, bytes) else None
    got, reply, _ = http("POST", f"{served_fox.base_url}/{path}", None if raw else body, raw=raw)
    assert got == status, reply
    assert set(reply) == {"error"} and set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["type"] == "invalid_request_error" and message in reply["error"]["message"]
    assert (reply["error"]["param"], reply["error"]["code"]) == (param, code)


def test_unknown_routes_and_methods(served_fox):
    status, reply, _ = http("GET", f"{served_fox.url}/v2/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"
    status, reply, headers = http("GET", f"{served_fox.base_url}/completions")
    assert status == 405 and reply["error"]["code"] == "method_not_allowed" and "POST" in headers.get("allow", "")
    assert http("GET", f"{served_fox.url}/health")[0] == 200  # still up


def test_token_pieces_and_split_text():
    tok = get_tokenizer("gpt2")
    text = "Café déjà vu — naïve 😀 end"
    ids = tok.encode(text)
    assert "".join(token_pieces(tok, ids)) == text  # multi-token characters land on the token completing them
    assert "".join(split_text("abcdef", ["ab", "", "cd", "xyz"])) == "abcdef"
    assert split_text("abc", ["abcd", "e"]) == ["abc"]


# -- a text-only adapter and a failing one, served in this process --------------------------------------------------


class TextOnly(TextAdapter):
    """Echoes the prompt's length; raises on "boom" (a bug, not bad input). ``calls``: (prompts, temperature) of
    every generate call, in order."""

    def __init__(self):
        self.tokenizer = get_tokenizer("bytes")
        self.info = ModelInfo("text-only", "none", "bytes", "none", 64, 64)
        self.calls: list[tuple[list[str], float]] = []

    def generate_until(self, prompts, config):
        self.calls.append((list(prompts), config.temperature))
        if "boom" in prompts:
            raise RuntimeError("the model fell over")
        return [Generation(f"<{len(p)}>", [], "eos") for p in prompts]


@pytest.fixture(scope="module")
def text_only():
    return TextOnly()


@pytest.fixture(scope="module")
def text_only_server(text_only):
    import time

    import uvicorn

    app = build_app(text_only, ServeConfig(max_batch=8, batch_window_ms=500))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{server.config.port}/v1"
    server.should_exit = True
    thread.join(10)


def test_text_only_adapter_and_internal_errors(text_only_server, caplog):
    url = f"{text_only_server}/completions"
    status, reply, _ = http("POST", url, {"model": "text-only", "prompt": ["abc", "hello"], "temperature": 0})
    assert status == 200 and [c["text"] for c in reply["choices"]] == ["<3>", "<5>"]
    assert reply["choices"][0]["finish_reason"] == "stop" and reply["choices"][0]["stop_reason"] is None
    status, reply, _ = http("POST", url, {"model": "text-only", "prompt": "abc", "logprobs": 1})
    assert status == 400 and "token-level access" in reply["error"]["message"]
    for field, value in (("min_p", 0.1), ("stop_token_ids", [3]), ("prompt_logprobs", 1)):  # not honoured: refused
        status, reply, _ = http("POST", url, {"model": "text-only", "prompt": "abc", field: value})
        assert status == 400 and reply["error"]["param"] == field and field in reply["error"]["message"]
    status, reply, _ = http("POST", url, {"model": "text-only", "prompt": "x" * 70, "max_tokens": 1})
    assert (
        status == 400
        and reply["error"]["code"] == "context_length_exceeded"
        and "64 tokens" in reply["error"]["message"]
    )
    with caplog.at_level("ERROR", logger="evalsuite.serve"):
        status, reply, _ = http("POST", url, {"model": "text-only", "prompt": "boom", "temperature": 0})
    assert status == 500 and reply["error"]["type"] == "server_error"
    assert any("fell over" in (r.exc_text or "") or r.exc_info for r in caplog.records)
    status, reply, _ = http("POST", url, {"model": "text-only", "prompt": "fine", "temperature": 0})
    assert status == 200 and reply["choices"][0]["text"] == "<4>"  # still serving


def test_text_only_adapter_batches_greedy_requests_and_runs_sampled_ones_alone(text_only_server, text_only):
    """An adapter without steps or per-row configs: concurrent greedy requests share one whole generate call, each
    sampled one (its seed alone decides it) gets a call of its own -- and every request is answered."""
    bodies = [{"model": "text-only", "prompt": "x" * i, "temperature": 0.0 if i % 2 else 0.8, "seed": i}
              for i in range(1, 7)]  # fmt: skip
    barrier = threading.Barrier(len(bodies))

    def ask(body):
        barrier.wait()
        return http("POST", f"{text_only_server}/completions", body, timeout=20)[1]["choices"][0]["text"]

    before = len(text_only.calls)
    with ThreadPoolExecutor(len(bodies)) as pool:
        assert list(pool.map(ask, bodies)) == [f"<{i}>" for i in range(1, 7)]
    calls = text_only.calls[before:]
    assert sorted(len(p) for p, t in calls if t > 0) == [1, 1, 1]  # three sampled requests, one call each
    assert sorted(len(p) for p, t in calls if t == 0) == [3]  # the greedy ones together (within the 500 ms window)


def test_tokenizer_route_fields(served_fox):
    """/tokenize and /detokenize take the fields vLLM's do where they are implemented, and refuse the others by
    name (as the generation routes do); null is a field left out."""
    url = served_fox.url
    ok = http("POST", f"{url}/tokenize", {"model": None, "prompt": "Hi", "add_special_tokens": None,
                                          "add_generation_prompt": True, "return_token_strs": False})  # fmt: skip
    assert ok[0] == 200 and ok[1]["tokens"] == http("POST", f"{url}/tokenize", {"prompt": "Hi"})[1]["tokens"]
    refused = [
        ("tokenize", {"prompt": "Hi", "return_token_strs": True}, "return_token_strs", "no token strings"),
        (
            "tokenize",
            {"messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False},
            "add_generation_prompt",
            "assistant's turn",
        ),
        ("tokenize", {"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}]}, "prompt", "not both"),
        ("tokenize", {"prompt": "Hi", "max_tokens": 3}, "max_tokens", "unknown field"),
        ("tokenize", {"prompt": "Hi", "chat_template": "{{ x }}"}, "chat_template", "model's own"),
        ("detokenize", {"tokens": [1], "skip_special_tokens": True}, "skip_special_tokens", "unknown field"),
    ]
    for route, body, param, message in refused:  # fmt: skip
        status, reply, _ = http("POST", f"{url}/{route}", body)
        assert status == 400 and reply["error"]["param"] == param and message in reply["error"]["message"], reply


def test_serve_refuses_bad_options(run_cli, tmp_path):
    code, _, err = run_cli(["serve", "--model", MODEL, "--max-batch", "0"], tmp_path)
    assert_one_line_error(code, err, "--max-batch must be at least 1")
    code, _, err = run_cli(["serve", "--model", "no-such-card"], tmp_path)
    assert_one_line_error(code, err, "unknown model 'no-such-card'")
