"""Any adapter as an OpenAI-compatible HTTP API (``evalsuite serve --model M``): a Starlette app under uvicorn.

Routes: ``GET /v1/models`` (and ``/v1/models/{id}``), ``POST /v1/completions``, ``POST /v1/chat/completions``, and
``GET /health`` and ``GET /stats`` (requests, batches, time the model was busy) for operators.

**Completions**: ``prompt`` is a string, a list of strings, or token ids (a list of ints, or a list of such lists;
token-tier models only); ``max_tokens`` (default 16, as OpenAI; 0 with ``echo`` scores the prompt only),
``temperature`` (default 1, as OpenAI; 0 is greedy), ``top_p``, ``top_k`` and ``ignore_eos`` (vLLM's extensions),
``stop`` (a string or a list), ``seed``, ``n`` (1 only), ``echo``, ``logprobs`` (0..5: the log-probability of each
token and the top ones; token-tier models only) and ``stream``. With ``echo=True, max_tokens=0, logprobs=N`` the
reply gives the prompt's per-token log-probabilities, the first token's ``null`` as OpenAI does: when the tokenizer
puts a BOS token first it is listed first (its ``text_offset`` 0, log-probability ``null``) and every prompt token
is scored; ``text_offset`` counts characters of the echoed text, so a client finds a continuation by offset.

**Chat**: ``messages`` become one prompt: the tokenizer's chat template when it has one (HF models), else this
plain template, documented here and in the README::

    System: <content>\\n  User: <content>\\n  Assistant: <content>\\n ... then "Assistant:"

(one ``Role: content`` line per message, the role capitalised, then ``Assistant:`` for the reply to follow).
``max_tokens`` (or ``max_completion_tokens``) defaults to 256.

**Streaming** (``stream: true``): server-sent events, ``data: {chunk}`` per token piece and a final chunk with the
``finish_reason``, then ``data: [DONE]``; ``stream_options.include_usage`` adds a usage chunk. The adapter API
returns whole generations, so the chunks are sent once the generation has finished (their concatenation is the
non-streamed text).

**Batching**: greedy generation requests with the same settings (max_tokens, stop, ignore_eos) that arrive while the
model is busy or within ``batch_window_ms`` of each other go to the adapter as one batch of up to ``max_batch``
prompts (left-padded; the model contracts make padding invisible). Sampled requests run alone, so a seed gives the
same sample whatever else is in flight. Every model call (generation, scoring) runs in one worker thread, so the
event loop keeps accepting requests.

**Errors** have OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for invalid JSON or fields
and for a request over the context length (the message gives the limit; code ``context_length_exceeded``), 404 for
an unknown model or route, 405 for a wrong method, 500 (logged with its traceback) for anything else; the server
never goes down with a request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from evalsuite.adapters.base import Generation, GenerationConfig, TextAdapter, TokenAdapter
from evalsuite.errors import UserError
from evalsuite.tokenizers import Tokenizer

log = logging.getLogger("evalsuite.serve")

MAX_LOGPROBS = 5  # OpenAI's limit for completions
CHAT_MAX_TOKENS = 256
COMPLETION_MAX_TOKENS = 16
PIECE_WINDOW = 8  # tokens of left context when decoding one token's text (multi-token characters and escapes)


class APIError(Exception):
    """A request the server refuses: HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class ServeConfig:
    """Server settings. ``served_name`` defaults to the adapter's name."""

    served_name: str | None = None
    max_batch: int = 8
    batch_window_ms: float = 5.0
    chat_max_tokens: int = CHAT_MAX_TOKENS


# ---------------------------------------------------------------------------------------------
# Text helpers: chat prompts, token pieces
# ---------------------------------------------------------------------------------------------


def chat_prompt(messages: list[dict], tokenizer: Tokenizer) -> str:
    """The prompt for ``messages``: the tokenizer's chat template, else ``Role: content`` lines + ``Assistant:``."""
    if getattr(tokenizer, "has_chat_template", False):
        return tokenizer.chat_template(messages)
    lines = [f"{m['role'].capitalize()}: {m['content']}\n" for m in messages]
    return "".join(lines) + "Assistant:"


def token_pieces(tokenizer: Tokenizer, ids: Sequence[int]) -> list[str]:
    """The text each token adds, decoded with a few tokens of left context so that characters and escapes split
    over several tokens land on the token that completes them (the others get ``""``)."""
    pieces = []
    for i in range(len(ids)):
        w = max(0, i - PIECE_WINDOW)
        before = tokenizer.decode(ids[w:i]).rstrip("\ufffd") if i > w else ""
        after = tokenizer.decode(ids[w : i + 1]).rstrip("\ufffd")
        if after.startswith(before):
            pieces.append(after[len(before) :])
        else:  # the new token changed how the window decodes: keep what differs
            common = 0
            while common < min(len(before), len(after)) and before[common] == after[common]:
                common += 1
            pieces.append(after[common:])
    return pieces


def split_text(text: str, pieces: Sequence[str]) -> list[str]:
    """``text`` cut where the token pieces end (clipped to it): chunks whose concatenation is exactly ``text``."""
    chunks, pos = [], 0
    for piece in pieces:
        end = min(pos + len(piece), len(text))
        if end > pos:
            chunks.append(text[pos:end])
            pos = end
    if pos < len(text):
        chunks.append(text[pos:])
    return chunks


# ---------------------------------------------------------------------------------------------
# Request validation
# ---------------------------------------------------------------------------------------------

_MISSING = object()


def _bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _int(body: dict, name: str, default, low: int | None = None, high: int | None = None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(f"'{name}' must be an integer, got {json.dumps(value)}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise _bad(f"'{name}' must be {span}, got {value}", name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(f"'{name}' must be a number, got {json.dumps(value)}", name)
    if value < low or value > high or (low_open and value == low):
        raise _bad(f"'{name}' must be in {'(' if low_open else '['}{low}, {high}], got {value}", name)
    return float(value)


def _bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _bad(f"'{name}' must be true or false, got {json.dumps(value)}", name)
    return value


def _stop(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise _bad("'stop' must be a string or a list of strings", "stop")


def _unsupported(body: dict) -> None:
    """Refuse, rather than ignore, the fields that would change the output and are not implemented."""
    if _int(body, "n", 1, 1) != 1:
        raise _bad("only n=1 is supported", "n")
    if _int(body, "best_of", 1, 1) != 1:
        raise _bad("only best_of=1 is supported", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        if _number(body, name, 0.0, -2.0, 2.0) != 0:
            raise _bad(f"'{name}' is not supported", name)
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported", "logit_bias")
    if body.get("suffix"):
        raise _bad("'suffix' is not supported", "suffix")


def generation_config(body: dict, max_tokens: int) -> GenerationConfig:
    """The sampling fields of a request (max_tokens >= 1 here)."""
    temperature = _number(body, "temperature", 1.0, 0.0, 2.0)
    seed = _int(body, "seed", None)
    if seed is None:
        seed = secrets.randbits(31) if temperature > 0 else 0
    return GenerationConfig(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=_int(body, "top_k", 0, 0) if body.get("top_k") != -1 else 0,  # vLLM's -1: no cut
        stop=_stop(body),
        stop_at_eos=not _bool(body, "ignore_eos"),
        seed=seed,
    )


def batch_key(config: GenerationConfig):
    """Requests with equal keys may share a batch: greedy ones with the same length, stops and EOS rule."""
    if config.temperature > 0:
        return object()  # sampled: alone, so its seed alone decides the sample
    return ("greedy", config.max_new_tokens, tuple(config.stop), config.stop_at_eos)


# ---------------------------------------------------------------------------------------------
# The engine: one worker thread for the model, a batcher on the event loop
# ---------------------------------------------------------------------------------------------


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
        await self.queue.put(_Job(batch_key(config), prompt, config, future))
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
            gens = await self.run(self._generate_rows, [j.prompt for j in jobs], jobs[0].config)
        except Exception as e:  # noqa: BLE001 - handed to every waiting request
            for j in jobs:
                if not j.future.done():
                    j.future.set_exception(e)
            return
        for j, gen in zip(jobs, gens, strict=True):
            if not j.future.done():
                j.future.set_result(gen)

    def _generate_rows(self, prompts: list, config: GenerationConfig) -> list[Generation]:
        if self.tokens:
            return self.adapter.generate(prompts, config)
        return self.adapter.generate_until(prompts, config)

    def score(self, ids: list[int], top: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
        """Log-probability of ``ids[t]`` given ``ids[:t]`` for t >= 1, and the ``top`` likeliest tokens there
        (runs in the worker thread)."""
        adapter: TokenAdapter = self.adapter
        values: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        if len(ids) < 2:
            return values, tops
        with torch.inference_mode():
            x = torch.tensor([ids[:-1]])
            target = torch.tensor(ids[1:])
            for s, logits in adapter.chunked_logits(x):
                logp = torch.log_softmax(logits[0].float(), -1).cpu()
                tgt = target[s : s + logp.shape[0]]
                values += logp.gather(-1, tgt[:, None])[:, 0].tolist()
                if top:
                    v, i = logp.topk(top, -1)
                    tops += [list(zip(a, b, strict=True)) for a, b in zip(i.tolist(), v.tolist(), strict=True)]
        return values, tops


# ---------------------------------------------------------------------------------------------
# The API
# ---------------------------------------------------------------------------------------------


@dataclass
class _Prompt:
    text: str
    ids: list[int] | None  # token-tier models: the ids the model sees (BOS included)
    n_tokens: int


class OpenAIServer:
    """The request handlers, independent of the web framework (:func:`build_app` mounts them)."""

    def __init__(self, adapter: TextAdapter, config: ServeConfig | None = None):
        self.adapter = adapter
        self.config = config or ServeConfig()
        self.name = self.config.served_name or adapter.name
        self.engine = Engine(adapter, self.config)
        self.tokenizer = adapter.tokenizer
        self.created = int(time.time())

    # -- models ----------------------------------------------------------------------------------------------

    def model_card(self) -> dict:
        return {"id": self.name, "object": "model", "created": self.created, "owned_by": "evalsuite",
                "max_model_len": self.adapter.max_length}  # fmt: skip

    def models(self) -> dict:
        return {"object": "list", "data": [self.model_card()]}

    def model(self, model_id: str) -> dict:
        self._check_model(model_id)
        return self.model_card()

    def _check_model(self, model) -> None:
        if model is _MISSING or model is None:
            raise _bad("you must provide a model parameter", "model")
        if not isinstance(model, str):
            raise _bad("'model' must be a string", "model")
        if model != self.name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.name}`)",
                           param="model", code="model_not_found")  # fmt: skip

    # -- prompts ---------------------------------------------------------------------------------------------

    def _prompts(self, body: dict) -> list[_Prompt]:
        value = body.get("prompt", _MISSING)
        if value is _MISSING or value is None:
            raise _bad("you must provide a prompt", "prompt")
        if isinstance(value, str):
            raw = [value]
        elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raw = [value]
        elif isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            raw = value
        else:
            raise _bad("'prompt' must be a string, a list of strings or token ids", "prompt")
        prompts = []
        for p in raw:
            if isinstance(p, str):
                ids = self.tokenizer.encode(p)
                prompts.append(_Prompt(p, ids if self.engine.tokens else None, len(ids)))
            elif p and all(isinstance(v, int) and not isinstance(v, bool) for v in p):
                if not self.engine.tokens:
                    raise _bad("token-id prompts need a model with token-level access", "prompt")
                prompts.append(_Prompt(self.tokenizer.decode(p), list(p), len(p)))
            else:
                raise _bad("'prompt' must be a string, a list of strings or token ids", "prompt")
        if self.engine.tokens and any(not p.ids for p in prompts):
            raise _bad("the prompt is empty (and the tokenizer adds no BOS token)", "prompt")
        return prompts

    def _check_length(self, prompts: list[_Prompt], max_tokens: int) -> None:
        limit = self.adapter.max_length
        if limit is None:
            return
        for p in prompts:
            if p.n_tokens + max_tokens > limit:
                raise _bad(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{p.n_tokens + max_tokens} tokens ({p.n_tokens} in the prompt, {max_tokens} for the "
                    "completion). Please reduce the prompt or max_tokens.",
                    "prompt" if p.n_tokens > limit else "max_tokens",
                    "context_length_exceeded",
                )

    # -- completions -----------------------------------------------------------------------------------------

    async def completions(self, body: dict, tokenize) -> dict | list[dict]:
        """The reply (or, with ``stream``, the list of chunks to send). ``tokenize`` runs a function off the loop."""
        self._check_model(body.get("model", _MISSING))
        _unsupported(body)
        echo, stream = _bool(body, "echo"), _bool(body, "stream")
        max_tokens = _int(body, "max_tokens", COMPLETION_MAX_TOKENS, 0)
        logprobs = _int(body, "logprobs", None, 0, MAX_LOGPROBS)
        if max_tokens == 0 and not echo:
            raise _bad("max_tokens must be at least 1 (0 only with echo=true)", "max_tokens")
        if logprobs is not None and not self.engine.tokens:
            raise _bad(f"logprobs need a model with token-level access; {self.name} is text-only", "logprobs")
        if stream and logprobs is not None:
            raise _bad("logprobs are not supported with stream=true", "logprobs")
        config = generation_config(body, max(1, max_tokens))
        prompts = await tokenize(self._prompts, body)
        self._check_length(prompts, max_tokens)
        self.engine.stats.requests += 1
        gens = await asyncio.gather(*(self._generate(p, config, max_tokens) for p in prompts))
        choices, usage = [], {"prompt_tokens": 0, "completion_tokens": 0}
        for index, (p, gen) in enumerate(zip(prompts, gens, strict=True)):
            choice = {"index": index, "text": (p.text if echo else "") + gen.text, "logprobs": None,
                      **self._finish(gen, config.stop)}  # fmt: skip
            if logprobs is not None:
                choice["logprobs"] = await self._logprobs(p, gen, logprobs, echo)
            choices.append(choice)
            usage["prompt_tokens"] += p.n_tokens
            usage["completion_tokens"] += self._generated_tokens(gen)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        reply = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                 "model": self.name, "choices": choices, "usage": usage}  # fmt: skip
        if not stream:
            return reply
        return self._completion_chunks(reply, prompts, gens, echo, body)

    async def _generate(self, prompt: _Prompt, config: GenerationConfig, max_tokens: int) -> Generation:
        if max_tokens == 0:
            return Generation("", [], "length")
        return await self.engine.generate(prompt.ids if self.engine.tokens else prompt.text, config)

    def _generated_tokens(self, gen: Generation) -> int:
        if gen.token_ids or not gen.text:
            return len(gen.token_ids)
        return len(self.tokenizer.encode(gen.text, add_bos=False))

    def _finish(self, gen: Generation, stop: list[str]) -> dict:
        """OpenAI's ``finish_reason`` and vLLM's ``stop_reason``: the stop string that ended it, null for EOS."""
        if gen.finish_reason == "length":
            return {"finish_reason": "length", "stop_reason": None}
        if gen.finish_reason != "stop" or not stop:
            return {"finish_reason": "stop", "stop_reason": None}
        full = self.tokenizer.decode(gen.token_ids) if gen.token_ids else gen.text
        hits = sorted((full.find(s), s) for s in stop if full.find(s) >= 0)
        return {"finish_reason": "stop", "stop_reason": hits[0][1] if hits else None}

    async def _logprobs(self, prompt: _Prompt, gen: Generation, top: int, echo: bool) -> dict:
        ids = prompt.ids + gen.token_ids
        values, tops = await self.engine.run(self.engine.score, ids, top)
        tok = self.tokenizer
        bos = 1 if prompt.ids and tok.bos_id is not None and prompt.ids[0] == tok.bos_id else 0
        n_prompt = len(prompt.ids)
        pieces = await asyncio.to_thread(token_pieces, tok, ids[bos:])
        strings = ([tok.decode(ids[:1])] if bos else []) + pieces
        offsets, pos = [], 0
        for i in range(len(ids)):
            if i == n_prompt:
                pos = len(prompt.text)  # generated text starts right after the echoed prompt
            offsets.append(pos)
            if i >= bos:
                pos += len(strings[i])
        token_logprobs = [None, *values]
        top_logprobs = [None] + [self._top(row) for row in tops] if top else [None] * len(ids)
        start = 0 if echo else n_prompt
        shift = 0 if echo else len(prompt.text)
        return {
            "tokens": strings[start:],
            "token_logprobs": token_logprobs[start:],
            "top_logprobs": top_logprobs[start:],
            "text_offset": [o - shift for o in offsets[start:]],
        }

    def _top(self, row: list[tuple[int, float]]) -> dict[str, float]:
        """``{token text: log-probability}``, likeliest first (tokens decoding to the same text keep the best)."""
        out: dict[str, float] = {}
        for token_id, value in row:
            out.setdefault(self.tokenizer.decode([token_id]), value)
        return out

    def _completion_chunks(self, reply: dict, prompts, gens, echo: bool, body: dict) -> list[dict]:
        base = {"id": reply["id"], "object": "text_completion", "created": reply["created"], "model": self.name}
        chunks = []
        for choice, p, gen in zip(reply["choices"], prompts, gens, strict=True):
            pieces = token_pieces(self.tokenizer, gen.token_ids) if gen.token_ids else [gen.text]
            texts = ([p.text] if echo and p.text else []) + split_text(gen.text, pieces)
            for text in texts:
                chunks.append({**base, "choices": [{"index": choice["index"], "text": text, "logprobs": None,
                                                    "finish_reason": None}]})  # fmt: skip
            end = {"index": choice["index"], "text": "", "logprobs": None, "finish_reason": choice["finish_reason"],
                   "stop_reason": choice["stop_reason"]}  # fmt: skip
            chunks.append({**base, "choices": [end]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": reply["usage"]})
        return chunks

    # -- chat ------------------------------------------------------------------------------------------------

    def _messages(self, body: dict) -> list[dict]:
        messages = body.get("messages", _MISSING)
        if messages is _MISSING or messages is None:
            raise _bad("you must provide messages", "messages")
        if not isinstance(messages, list) or not messages:
            raise _bad("'messages' must be a non-empty list", "messages")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise _bad(f"messages[{i}] must be an object with a 'role'", f"messages.{i}")
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                if not all(isinstance(c, dict) and c.get("type") == "text" for c in content):
                    raise _bad(f"messages[{i}]: only text content parts are supported", f"messages.{i}.content")
                content = "".join(str(c.get("text", "")) for c in content)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise _bad(f"messages[{i}].content must be a string", f"messages.{i}.content")
            out.append({"role": m["role"], "content": content})
        return out

    async def chat(self, body: dict, tokenize) -> dict | list[dict]:
        self._check_model(body.get("model", _MISSING))
        _unsupported(body)
        if _bool(body, "logprobs"):
            raise _bad("logprobs are not supported on chat completions here; use /v1/completions", "logprobs")
        stream = _bool(body, "stream")
        default = self.config.chat_max_tokens
        max_tokens = _int(body, "max_completion_tokens", None, 1)
        max_tokens = max_tokens if max_tokens is not None else _int(body, "max_tokens", default, 1)
        config = generation_config(body, max_tokens)
        messages = self._messages(body)

        def build():
            text = chat_prompt(messages, self.tokenizer)
            return self._prompts({"prompt": text})

        (prompt,) = await tokenize(build)
        self._check_length([prompt], max_tokens)
        self.engine.stats.requests += 1
        gen = await self._generate(prompt, config, max_tokens)
        usage = {"prompt_tokens": prompt.n_tokens, "completion_tokens": self._generated_tokens(gen)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        finish = self._finish(gen, config.stop)
        reply = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                 "model": self.name, "usage": usage,
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text}, "logprobs": None,
                              **finish}]}  # fmt: skip
        if not stream:
            return reply
        base = {"id": reply["id"], "object": "chat.completion.chunk", "created": reply["created"], "model": self.name}
        pieces = token_pieces(self.tokenizer, gen.token_ids) if gen.token_ids else [gen.text]
        chunks = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}]  # fmt: skip
        for text in split_text(gen.text, pieces):
            chunks.append({**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]})
        chunks.append({**base, "choices": [{"index": 0, "delta": {}, **finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**base, "choices": [], "usage": usage})
        return chunks


# ---------------------------------------------------------------------------------------------
# Starlette app and uvicorn
# ---------------------------------------------------------------------------------------------


def _starlette():
    try:
        import starlette  # noqa: F401
    except ImportError:
        raise UserError("evalsuite serve needs starlette and uvicorn: pip install starlette uvicorn") from None


def build_app(adapter: TextAdapter, config: ServeConfig | None = None):
    """The Starlette application serving ``adapter`` (see the module docstring)."""
    _starlette()
    import contextlib

    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    server = OpenAIServer(adapter, config)

    def error(e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    async def tokenize(fn, *args):
        return await run_in_threadpool(fn, *args)

    async def read_json(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise _bad(f"the request body is not valid JSON: {e}") from None
        if not isinstance(body, dict):
            raise _bad("the request body must be a JSON object")
        return body

    def sse(chunks: list[dict]):
        async def events():
            for chunk in chunks:
                yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    def endpoint(handler):
        async def wrapped(request: Request):
            try:
                result = await handler(request)
            except APIError as e:
                return error(e)
            except UserError as e:  # the adapter refused the input
                return error(APIError(400, str(e)))
            except Exception:  # noqa: BLE001 - logged; the server stays up
                log.exception("error while handling %s %s", request.method, request.url.path)
                return error(APIError(500, "internal server error (logged by the server)", "server_error"))
            if isinstance(result, list):
                return sse(result)
            return JSONResponse(result)

        return wrapped

    @endpoint
    async def list_models(request: Request):
        return server.models()

    @endpoint
    async def get_model(request: Request):
        return server.model(request.path_params["model"])

    @endpoint
    async def completions(request: Request):
        body = await read_json(request)
        return await server.completions(body, tokenize)

    @endpoint
    async def chat(request: Request):
        body = await read_json(request)
        return await server.chat(body, tokenize)

    @endpoint
    async def health(request: Request):
        return {"status": "ok", "model": server.name}

    @endpoint
    async def stats(request: Request):
        return server.engine.stats.to_dict()

    async def http_error(request: Request, exc: HTTPException):
        if exc.status_code == 405:
            e = APIError(
                405, f"method {request.method} is not allowed on {request.url.path}", code="method_not_allowed"
            )
        elif exc.status_code == 404:
            e = APIError(404, f"unknown route {request.url.path}", code="not_found")
        else:
            e = APIError(exc.status_code, str(exc.detail))
        response = error(e)
        if exc.headers:
            response.headers.update(exc.headers)
        return response

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await server.engine.start()
        try:
            yield
        finally:
            await server.engine.stop()

    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/stats", stats, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error}, lifespan=lifespan)
    app.state.server = server
    return app


def serve(adapter: TextAdapter, host: str = "127.0.0.1", port: int = 8000, config: ServeConfig | None = None,
          log_level: str = "info", access_log: bool = False) -> None:  # fmt: skip
    """Serve ``adapter`` until interrupted (Ctrl-C)."""
    _starlette()
    import uvicorn

    app = build_app(adapter, config)
    name = app.state.server.name
    print(f"serving {name} at http://{host}:{port}/v1 (Ctrl-C stops)", flush=True)
    uvicorn.run(app, host=host, port=port, log_level=log_level, access_log=access_log)
