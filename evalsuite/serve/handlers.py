"""The request handlers of ``evalsuite serve`` (completions, chat, models), independent of the web framework."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from evalsuite.adapters.base import TextAdapter
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.serve import tokenizer_api
from evalsuite.serve.engine import Engine
from evalsuite.serve.live import LiveText
from evalsuite.serve.protocol import (
    COMPLETION_MAX_TOKENS,
    MAX_LOGPROBS,
    MISSING,
    APIError,
    ServeConfig,
    bad_request,
    bool_field,
    chat_prompt,
    generation_config,
    int_field,
    refuse_unsupported,
    token_pieces,
)
from evalsuite.serve.tokenizer_api import encode_text


@dataclass
class _Prompt:
    text: str
    ids: list[int] | None  # token-tier models: the ids the model sees (a string's BOS included, token ids as given)
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
        if model is MISSING or model is None:
            raise bad_request("you must provide a model parameter", "model")
        if not isinstance(model, str):
            raise bad_request("'model' must be a string", "model")
        if model != self.name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.name}`)",
                           param="model", code="model_not_found")  # fmt: skip

    # -- the tokenizer ---------------------------------------------------------------------------------------

    def tokenizer_info(self) -> dict:
        return tokenizer_api.tokenizer_info(self.tokenizer, self.adapter.max_length)

    def tokenize(self, body: dict) -> dict:
        if "model" in body:
            self._check_model(body["model"])

        def chat_text(b: dict) -> str:
            return chat_prompt(self._messages(b), self.tokenizer)

        return tokenizer_api.tokenize(self.tokenizer, body, self.adapter.max_length, chat_text)

    def detokenize(self, body: dict) -> dict:
        if "model" in body:
            self._check_model(body["model"])
        return tokenizer_api.detokenize(self.tokenizer, body)

    # -- prompts ---------------------------------------------------------------------------------------------

    def _prompts(self, body: dict) -> list[_Prompt]:
        value = body.get("prompt", MISSING)
        if value is MISSING or value is None:
            raise bad_request("you must provide a prompt", "prompt")
        if isinstance(value, str):
            raw = [value]
        elif isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raw = [value]
        elif isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
            raw = value
        else:
            raise bad_request("'prompt' must be a string, a list of strings or token ids", "prompt")
        prompts = []
        for p in raw:
            if isinstance(p, str):
                ids = encode_text(self.tokenizer, p)
                prompts.append(_Prompt(p, ids if self.engine.tokens else None, len(ids)))
            elif p and all(isinstance(v, int) and not isinstance(v, bool) for v in p):
                if not self.engine.tokens:
                    raise bad_request("token-id prompts need a model with token-level access", "prompt")
                prompts.append(_Prompt(self.tokenizer.decode(p), list(p), len(p)))
            else:
                raise bad_request("'prompt' must be a string, a list of strings or token ids", "prompt")
        if self.engine.tokens and any(not p.ids for p in prompts):
            raise bad_request("the prompt is empty (and the tokenizer adds no BOS token)", "prompt")
        return prompts

    def _check_length(self, prompts: list[_Prompt], max_tokens: int) -> None:
        limit = self.adapter.max_length
        if limit is None:
            return
        for p in prompts:
            if p.n_tokens + max_tokens > limit:
                raise bad_request(
                    f"This model's maximum context length is {limit} tokens. However, you requested "
                    f"{p.n_tokens + max_tokens} tokens ({p.n_tokens} in the prompt, {max_tokens} for the "
                    "completion). Please reduce the prompt or max_tokens.",
                    "prompt" if p.n_tokens > limit else "max_tokens",
                    "context_length_exceeded",
                )

    # -- completions -----------------------------------------------------------------------------------------

    async def completions(self, body: dict, tokenize) -> dict | AsyncIterator[dict]:
        """The reply (or, with ``stream``, the chunks as they are made). ``tokenize`` runs a function off the loop."""
        self._check_model(body.get("model", MISSING))
        refuse_unsupported(body)
        echo, stream = bool_field(body, "echo"), bool_field(body, "stream")
        max_tokens = int_field(body, "max_tokens", COMPLETION_MAX_TOKENS, 0)
        logprobs = int_field(body, "logprobs", None, 0, MAX_LOGPROBS)
        if max_tokens == 0 and not echo:
            raise bad_request("max_tokens must be at least 1 (0 only with echo=true)", "max_tokens")
        if logprobs is not None and not self.engine.tokens:
            raise bad_request(f"logprobs need a model with token-level access; {self.name} is text-only", "logprobs")
        if stream and logprobs is not None:
            raise bad_request("logprobs are not supported with stream=true", "logprobs")
        config = generation_config(body, max(1, max_tokens))
        prompts = await tokenize(self._prompts, body)
        self._check_length(prompts, max_tokens)
        self.engine.metrics.prompt(sum(p.n_tokens for p in prompts))
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            return self._completion_stream(rid, created, prompts, config, max_tokens, echo, body)
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
        return {"id": rid, "object": "text_completion", "created": created, "model": self.name, "choices": choices,
                "usage": usage}  # fmt: skip

    def _model_prompt(self, prompt: _Prompt) -> list[int] | str:
        return prompt.ids if self.engine.tokens else prompt.text

    async def _generate(self, prompt: _Prompt, config: GenerationConfig, max_tokens: int) -> Generation:
        if max_tokens == 0:
            return Generation("", [], "length")
        return await self.engine.generate(self._model_prompt(prompt), config)

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

    async def _live(self, prompt: _Prompt, config: GenerationConfig, max_tokens: int, out: list):
        """The text of one generation as it is made (``out`` receives the finished :class:`Generation`)."""
        if max_tokens == 0:
            out.append(Generation("", [], "length"))
            return
        stream = self.engine.stream(self._model_prompt(prompt), config)
        live = LiveText(self.tokenizer, config.stop)
        try:
            async for ids in stream:
                text = live.add(ids)
                if text:
                    yield text
        finally:
            stream.cancel()  # a no-op once finished; a client gone mid-stream frees its row
        rest = live.finish(stream.generation)
        if rest:
            yield rest
        out.append(stream.generation)

    async def _completion_stream(self, rid: str, created: int, prompts: list[_Prompt], config: GenerationConfig,
                                 max_tokens: int, echo: bool, body: dict) -> AsyncIterator[dict]:  # fmt: skip
        """Chunks sent as tokens are made: per choice, the echoed prompt, the text, then its finish reason."""
        base = {"id": rid, "object": "text_completion", "created": created, "model": self.name}
        usage = {"prompt_tokens": sum(p.n_tokens for p in prompts), "completion_tokens": 0}
        for index, p in enumerate(prompts):
            gens: list[Generation] = []
            head = [p.text] if echo and p.text else []
            async for text in _prepend(head, self._live(p, config, max_tokens, gens)):
                yield {**base, "choices": [{"index": index, "text": text, "logprobs": None, "finish_reason": None}]}
            usage["completion_tokens"] += self._generated_tokens(gens[0])
            end = {"index": index, "text": "", "logprobs": None, **self._finish(gens[0], config.stop)}
            yield {**base, "choices": [end]}
        if (body.get("stream_options") or {}).get("include_usage"):
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            yield {**base, "choices": [], "usage": usage}

    # -- chat ------------------------------------------------------------------------------------------------

    def _messages(self, body: dict) -> list[dict]:
        messages = body.get("messages", MISSING)
        if messages is MISSING or messages is None:
            raise bad_request("you must provide messages", "messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty list", "messages")
        out = []
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(f"messages[{i}] must be an object with a 'role'", f"messages.{i}")
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                if not all(isinstance(c, dict) and c.get("type") == "text" for c in content):
                    raise bad_request(f"messages[{i}]: only text content parts are supported", f"messages.{i}.content")
                content = "".join(str(c.get("text", "")) for c in content)
            if content is None:
                content = ""
            if not isinstance(content, str):
                raise bad_request(f"messages[{i}].content must be a string", f"messages.{i}.content")
            out.append({"role": m["role"], "content": content})
        return out

    async def chat(self, body: dict, tokenize) -> dict | AsyncIterator[dict]:
        self._check_model(body.get("model", MISSING))
        refuse_unsupported(body)
        if bool_field(body, "logprobs"):
            raise bad_request("logprobs are not supported on chat completions here; use /v1/completions", "logprobs")
        stream = bool_field(body, "stream")
        default = self.config.chat_max_tokens
        max_tokens = int_field(body, "max_completion_tokens", None, 1)
        max_tokens = max_tokens if max_tokens is not None else int_field(body, "max_tokens", default, 1)
        config = generation_config(body, max_tokens)
        messages = self._messages(body)

        def build():
            text = chat_prompt(messages, self.tokenizer)
            return self._prompts({"prompt": text})

        (prompt,) = await tokenize(build)
        self._check_length([prompt], max_tokens)
        self.engine.metrics.prompt(prompt.n_tokens)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if stream:
            return self._chat_stream(rid, created, prompt, config, max_tokens, body)
        gen = await self._generate(prompt, config, max_tokens)
        usage = {"prompt_tokens": prompt.n_tokens, "completion_tokens": self._generated_tokens(gen)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {"id": rid, "object": "chat.completion", "created": created, "model": self.name, "usage": usage,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": gen.text}, "logprobs": None,
                             **self._finish(gen, config.stop)}]}  # fmt: skip

    async def _chat_stream(self, rid: str, created: int, prompt: _Prompt, config: GenerationConfig,
                           max_tokens: int, body: dict) -> AsyncIterator[dict]:  # fmt: skip
        base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.name}
        yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
        gens: list[Generation] = []
        async for text in self._live(prompt, config, max_tokens, gens):
            yield {**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
        yield {**base, "choices": [{"index": 0, "delta": {}, **self._finish(gens[0], config.stop)}]}
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": prompt.n_tokens, "completion_tokens": self._generated_tokens(gens[0])}
            yield {**base, "choices": [], "usage": {**usage, "total_tokens": sum(usage.values())}}


async def _prepend(head: list[str], rest: AsyncIterator[str]) -> AsyncIterator[str]:
    for text in head:
        yield text
    async for text in rest:
        yield text
