"""`evalsuite serve`'s request fields over real HTTP (fox-pro-tiny in a subprocess, the session's ``served_fox``):
every sampler field changes the reply exactly as the native adapter's generate says; sampled requests share batches
and keep their seeds; ``n`` choices; ``prompt_logprobs``; echo's tokens join back to the text; every field the
server does not implement is a 400 naming it, the harmless ones are accepted. The openai SDK where it sends a field."""

import json
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import http

from evalsuite.adapters.native import NativeAdapter
from evalsuite.cards import load_card
from evalsuite.generation.types import GenerationConfig

MODEL = "fox-pro-tiny"
PROMPT = "The river was quiet and"
LOOPING = "The river was"  # greedy fox-pro-tiny repeats a token after it: the penalties have something to change


@pytest.fixture(scope="module")
def native():
    return NativeAdapter(load_card(MODEL), device="cpu")


@pytest.fixture(scope="module")
def client(served_fox):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=served_fox.base_url, api_key="unused", max_retries=0)


def complete(server, path="completions", **body):
    status, reply, _ = http("POST", f"{server.base_url}/{path}", {"model": MODEL, **body})
    assert status == 200, reply
    return reply


def text(reply) -> str:
    return reply["choices"][0]["text"]


# body fields -> the GenerationConfig fields they set (greedy unless the body samples)
CASES = [
    ({"repetition_penalty": 1.5}, {"repetition_penalty": 1.5}),
    ({"presence_penalty": 1.5, "frequency_penalty": 1.0}, {"presence_penalty": 1.5, "frequency_penalty": 1.0}),
    ({"logit_bias": {"50": 5}}, {"logit_bias": {50: 5.0}}),
    ({"temperature": 1.0, "seed": 3, "min_p": 0.9}, {"temperature": 1.0, "seed": 3, "min_p": 0.9}),
    ({"temperature": 1.0, "seed": 3, "top_k": 2}, {"temperature": 1.0, "seed": 3, "top_k": 2}),
]


@pytest.mark.parametrize("fields, settings", CASES, ids=[next(iter(c[0])) if len(c[0]) == 1 else
                                                          "+".join(c[0]) for c in CASES])  # fmt: skip
def test_sampler_fields_equal_the_native_adapter(served_fox, native, fields, settings):
    want = native.generate_until([LOOPING], GenerationConfig(max_new_tokens=8, **settings))[0]
    got = complete(served_fox, prompt=LOOPING, max_tokens=8, **{"temperature": 0, **fields})
    assert text(got) == want.text
    plain = {k: v for k, v in fields.items() if k in ("temperature", "seed")}
    assert text(complete(served_fox, prompt=LOOPING, max_tokens=8, **{"temperature": 0, **plain})) != want.text
    if "logit_bias" in fields:  # +5 on a random model's nearly flat logits: token 50 every time
        assert want.token_ids == [50] * 8


def test_stop_token_ids_and_min_tokens(served_fox, native):
    free = native.generate_until([PROMPT], GenerationConfig(max_new_tokens=8, stop_at_eos=False))[0].token_ids
    reply = complete(served_fox, prompt=PROMPT, max_tokens=8, temperature=0, stop_token_ids=[free[2]], logprobs=0)
    (choice,) = reply["choices"]
    assert (choice["finish_reason"], choice["stop_reason"]) == ("stop", free[2])
    assert choice["text"] == native.tokenizer.decode(free[:2]) and reply["usage"]["completion_tokens"] == 3
    assert "".join(choice["logprobs"]["tokens"]) == choice["text"]  # the stop token's string is empty
    # min_tokens=4 masks the stop token (and EOS) for the first four tokens: no stop there
    config = GenerationConfig(max_new_tokens=8, stop_token_ids=[free[2]], min_tokens=4)
    want = native.generate_until([PROMPT], config)[0]
    reply = complete(served_fox, prompt=PROMPT, max_tokens=8, temperature=0, stop_token_ids=[free[2]], min_tokens=4)
    assert text(reply) == want.text and len(want.token_ids) >= 4 and reply["usage"]["completion_tokens"] >= 4


def test_sampled_requests_share_batches_and_keep_their_seeds(served_fox, native):
    """Eight concurrent requests, six sampled with their own seeds and settings, two greedy: each reply equals the
    same request sent alone (the native adapter's generate of that one prompt), and they shared batches."""
    prompts = ["The river was quiet and", "A letter arrived", "Numbers: 1, 2, 3,", "She opened the door and saw",
               "In the morning the market", "He wrote", "Once upon a time", "The best thing to do is"]  # fmt: skip
    bodies = [{"prompt": p, "max_tokens": 8, "temperature": 0.0 if i in (2, 5) else 0.7 + 0.1 * i, "seed": 100 + i,
               "top_p": 0.95, **({"repetition_penalty": 1.2} if i % 3 == 0 else {})}
              for i, p in enumerate(prompts)]  # fmt: skip
    alone = [text(complete(served_fox, **b)) for b in bodies]
    for b, t in list(zip(bodies, alone, strict=True))[:3]:  # a sampled one with a rule, a sampled one, a greedy one
        config = GenerationConfig(max_new_tokens=8, temperature=b["temperature"], top_p=0.95, seed=b["seed"],
                                  repetition_penalty=b.get("repetition_penalty", 1.0))  # fmt: skip
        assert native.generate_until([b["prompt"]], config)[0].text == t
    before = http("GET", f"{served_fox.url}/stats")[1]
    barrier = threading.Barrier(len(bodies))

    def ask(body):
        barrier.wait()
        return text(complete(served_fox, **body))

    with ThreadPoolExecutor(len(bodies)) as pool:
        together = list(pool.map(ask, bodies))
    after = http("GET", f"{served_fox.url}/stats")[1]
    assert together == alone
    assert after["batches"] - before["batches"] < len(bodies)
    assert len(set(alone)) == len(alone)


def test_n_choices_sample_with_seed_plus_index(served_fox, client):
    body = {"max_tokens": 6, "temperature": 1.0}
    singles = {(p, s): text(complete(served_fox, prompt=p, seed=s, **body)) for p in ("Hi", "Yo") for s in (7, 8, 9)}
    reply = client.completions.create(model=MODEL, prompt=["Hi", "Yo"], n=3, seed=7, **body)
    assert [c.index for c in reply.choices] == list(range(6))  # prompt by prompt, n each
    assert [c.text for c in reply.choices] == [singles[p, s] for p in ("Hi", "Yo") for s in (7, 8, 9)]
    once = complete(served_fox, prompt=["Hi", "Yo"], max_tokens=1, temperature=0)["usage"]["prompt_tokens"]
    assert reply.usage.prompt_tokens == once and reply.usage.completion_tokens == 6 * 6  # each prompt counted once
    assert complete(served_fox, prompt="Hi", n=2, best_of=2, seed=7, **body)["choices"][1]["text"] == singles["Hi", 8]
    messages = [{"role": "user", "content": "Hi"}]
    chat = client.chat.completions.create(model=MODEL, messages=messages, n=2, seed=7, max_tokens=6, temperature=1)
    one = client.chat.completions.create(model=MODEL, messages=messages, seed=8, max_tokens=6, temperature=1)
    assert [c.index for c in chat.choices] == [0, 1]
    assert chat.choices[1].message.content == one.choices[0].message.content
    assert chat.usage.completion_tokens == 12


def sse(server, path: str, body: dict) -> list[dict]:
    """The JSON chunks of a streamed reply, in order (the ``[DONE]`` line dropped)."""
    request = urllib.request.Request(f"{server.base_url}/{path}", data=json.dumps({"model": MODEL, **body}).encode(),
                                     method="POST", headers={"Content-Type": "application/json"})  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        lines = response.read().decode().split("\n")
    data = [line[len("data: ") :] for line in lines if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]]


def test_streamed_choices_equal_the_reply(served_fox):
    """``stream`` with several prompts and ``n``: every choice's chunks join to its non-streamed text, with its
    finish reason and stop reason; the usage chunk counts every choice (completions and chat)."""
    body = {"prompt": ["Hi", "Yo"], "n": 2, "seed": 7, "temperature": 1.0, "max_tokens": 6, "echo": True,
            "stop": ["e"]}  # fmt: skip
    want = complete(served_fox, **body)
    chunks = sse(served_fox, "completions", {**body, "stream": True, "stream_options": {"include_usage": True}})
    texts, ends = ["", "", "", ""], {}
    for chunk in chunks[:-1]:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            ends[choice["index"]] = (choice["finish_reason"], choice["stop_reason"])
    assert texts == [c["text"] for c in want["choices"]]
    assert ends == {c["index"]: (c["finish_reason"], c["stop_reason"]) for c in want["choices"]}
    assert chunks[-1]["usage"] == want["usage"] and chunks[-1]["choices"] == []
    messages = [{"role": "user", "content": "Hi"}]
    chat = {"messages": messages, "n": 2, "seed": 7, "temperature": 1.0, "max_tokens": 6}
    want = complete(served_fox, "chat/completions", **chat)
    chunks = sse(served_fox, "chat/completions", {**chat, "stream": True})
    texts = ["", ""]
    for chunk in chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["delta"].get("content", "")
    assert texts == [c["message"]["content"] for c in want["choices"]] and texts[0] != texts[1]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    assert roles == [0, 1]


def test_prompt_logprobs(served_fox, native, client):
    ids = native.tokenizer.encode(PROMPT)
    reply = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=1, temperature=0,
                                      extra_body={"prompt_logprobs": 2})  # fmt: skip
    lp = reply.choices[0].prompt_logprobs  # vLLM's field, kept by the SDK as an extra attribute
    assert len(lp) == len(ids) and lp[0] is None
    full = torch.tensor([ids])
    nll = native.token_nll(full[:, :-1], full[:, 1:])[0].tolist()
    for t in range(1, len(ids)):
        entry = lp[t]
        mine = entry[str(ids[t])]
        assert list(entry)[0] == str(ids[t]) and mine["logprob"] == pytest.approx(-nll[t - 1], abs=1e-4)
        assert mine["decoded_token"] == native.tokenizer.decode([ids[t]])
        ranked = sorted(entry.values(), key=lambda e: e["rank"])
        assert [e["rank"] for e in ranked][:2] == [1, 2] and len(entry) in (2, 3)
        assert ranked[0]["logprob"] >= ranked[1]["logprob"] >= mine["logprob"] - 1e-6
        assert (mine["rank"] == 1) == (mine["logprob"] >= ranked[0]["logprob"])
    # chat: beside the choices, the chat prompt's tokens
    messages = [{"role": "user", "content": "Where is the river?"}]
    chat = complete(served_fox, "chat/completions", messages=messages, max_tokens=2, temperature=0, prompt_logprobs=0)
    assert chat["prompt_logprobs"][0] is None and all(len(e) == 1 for e in chat["prompt_logprobs"][1:])


def test_echo_tokens_join_back_to_the_text(served_fox, native):
    """String prompts (the tokenizer's BOS adds no text), token-id prompts (a BOS among them is its own text), and
    a generation cut by a stop string: the tokens join to the choice's text, the offsets count it."""
    free = complete(served_fox, prompt=PROMPT, max_tokens=8, temperature=0)["choices"][0]["text"]
    ids = native.tokenizer.encode(PROMPT)
    for body in ({"prompt": PROMPT, "max_tokens": 0}, {"prompt": PROMPT, "max_tokens": 8, "stop": [free[4:6]]},
                 {"prompt": ids, "max_tokens": 3}):  # fmt: skip
        reply = complete(served_fox, echo=True, logprobs=1, temperature=0, **body)
        (choice,) = reply["choices"]
        lp = choice["logprobs"]
        assert "".join(lp["tokens"]) == choice["text"]
        assert lp["text_offset"] == [len("".join(lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == reply["usage"]["total_tokens"]
        assert lp["token_logprobs"][0] is None and lp["tokens"][0] == ("" if isinstance(body["prompt"], str) else
                                                                       native.tokenizer.decode(ids[:1]))  # fmt: skip
    assert choice["text"].startswith(native.tokenizer.decode(ids))


REFUSED = [
    ("completions", "guided_choice", ["yes", "no"], "guided decoding"),
    ("completions", "guided_json", {"type": "object"}, "guided decoding"),
    ("completions", "response_format", {"type": "json_object"}, "no JSON mode"),
    ("completions", "suffix", "and then", "insertion"),
    ("completions", "best_of", 3, "must equal n"),
    ("completions", "n", 129, "between 1 and 128"),
    ("completions", "use_beam_search", True, "beam search"),
    ("completions", "include_stop_str_in_output", True, "include_stop_str_in_output"),
    ("completions", "truncate_prompt_tokens", 4, "never truncated"),
    ("completions", "temprature", 0.5, "unknown field 'temprature'"),
    ("completions", "stream_options", {"continuous_usage_stats": True}, "include_usage"),
    ("completions", "min_tokens", 9, "at most max_tokens (8)"),
    ("completions", "logit_bias", {"50257": 1}, "token ids in [0, 50257)"),
    ("completions", "logit_bias", {"5": 101}, "[-100, 100]"),
    ("completions", "stop_token_ids", [-1], "token ids"),
    ("completions", "repetition_penalty", 0, "(0.0, inf]"),
    ("completions", "prompt_logprobs", 21, "between 0 and 20"),
    ("chat/completions", "tools", [{"type": "function", "function": {"name": "f"}}], "no tool calling"),
    ("chat/completions", "tool_choice", "required", "no tool calling"),
    ("chat/completions", "functions", [{"name": "f"}], "no tool calling"),
    ("chat/completions", "echo", True, "does not repeat"),
    ("chat/completions", "add_generation_prompt", False, "assistant's turn"),
    ("chat/completions", "continue_final_message", True, "new assistant turn"),
    ("chat/completions", "response_format", {"type": "json_schema", "json_schema": {}}, "no JSON mode"),
    ("chat/completions", "top_logprobs", 2, "use /v1/completions"),
    ("chat/completions", "guided_regex", "a+", "guided decoding"),
    ("chat/completions", "chat_template", "{{ messages }}", "model's own"),
    ("chat/completions", "best_of", 2, "unknown field 'best_of'"),
    ("chat/completions", "suffix", "x", "unknown field 'suffix'"),
]


@pytest.mark.parametrize("path, field, value, message", REFUSED, ids=[f"{p[:4]}-{f}" for p, f, _, _ in REFUSED])
def test_fields_not_implemented_are_refused_by_name(served_fox, path, field, value, message):
    body = {"model": MODEL, "max_tokens": 8, field: value}
    body.update({"prompt": PROMPT} if path == "completions" else {"messages": [{"role": "user", "content": "Hi"}]})
    status, reply, _ = http("POST", f"{served_fox.base_url}/{path}", body)
    assert status == 400, reply
    assert reply["error"]["param"] == field and field in reply["error"]["message"]
    assert message in reply["error"]["message"]


def test_default_values_and_meaningless_fields_are_accepted(served_fox, client):
    plain = text(complete(served_fox, prompt=PROMPT, max_tokens=6, temperature=0))
    extras = {"user": "u-1", "suffix": "", "response_format": {"type": "text"}, "use_beam_search": False, "n": 1,
              "best_of": 1, "include_stop_str_in_output": False, "logprobs": None, "guided_choice": None}  # fmt: skip
    assert text(complete(served_fox, prompt=PROMPT, max_tokens=6, temperature=0, **extras)) == plain
    messages = [{"role": "user", "content": "Hi"}]
    want = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0)
    got = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0, tools=[],
                                         tool_choice="none", parallel_tool_calls=True, user="u-1", logprobs=False,
                                         response_format={"type": "text"},
                                         extra_body={"echo": False, "add_generation_prompt": True})  # fmt: skip
    assert got.choices[0].message.content == want.choices[0].message.content
