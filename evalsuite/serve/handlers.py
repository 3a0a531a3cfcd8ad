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
from evalsuite.serve.fields import MAX_PROMPT_LOGPROBS, check_fields, choice_configs, sampler_config
from evalsuite.serve.live import LiveText
from evalsuite.serve.logprobs import completion_logprobs, prompt_logprobs
from evalsuite.serve.protocol import (
    COMPLETION_MAX_TOKENS,
    MAX_LOGPROBS,
    MISSING,
    APIError,
    ServeConfig,
    bad_request,
    bool_field,
    chat_prompt,
    int_field,
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
        self._check_tokenizer_request(body, "tokenize")

        def chat_text(b: dict) -> str:
            return chat_prompt(self._messages(b), self.tokenizer)

        return tokenizer_api.tokenize(self.tokenizer, body, self.adapter.max_length, chat_text)

    def detokenize(self, body: dict) -> dict:
        self._check_tokenizer_request(body, "detokenize")
        return tokenizer_api.detokenize(self.tokenizer, body)

    def _check_tokenizer_request(self, body: dict, endpoint: str) -> None:
        """The fields of a tokenizer route: ``model`` optional (vLLM's), the rest as :func:`check_fields` says."""
        if body.get("model") is not None:
            self._check_model(body["model"])
        check_fields(body, endpoint)

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
        """The reply (or, with ``stream``, the chunks as they are made). ``tokenize`` runs a function off the loop.
        Choices: ``n`` per prompt, prompt by prompt."""
        self._check_model(body.get("model", MISSING))
        check_fields(body, "completions")
        echo, stream = bool_field(body, "echo"), bool_field(body, "stream")
        max_tokens = int_field(body, "max_tokens", COMPLETION_MAX_TOKENS, 0)
        logprobs = int_field(body, "logprobs", None, 0, MAX_LOGPROBS)
        if max_tokens == 0 and not echo:
            raise bad_request("max_tokens must be at least 1 (0 only with echo=true)", "max_tokens")
        if logprobs is not None and not self.engine.tokens:
            raise bad_request(f"logprobs need a model with token-level access; {self.name} is text-only", "logprobs")
        if stream and logprobs is not None:
            raise bad_request("logprobs are not supported with stream=true", "logprobs")
        configs, top_prompt = self._sampling(body, max_tokens, stream)
        prompts = await tokenize(self._prompts, body)
        self._check_length(prompts, max_tokens)
        usage = {"prompt_tokens": sum(p.n_tokens for p in prompts), "completion_tokens": 0}
        self.engine.metrics.prompt(usage["prompt_tokens"])
        rows = [(p, c) for p in prompts for c in configs]
        head = {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": self.name}  # fmt: skip
        if stream:
            return self._completion_stream(head, rows, max_tokens, echo, usage, body)
        gens = await asyncio.gather(*(self._generate(p, c, max_tokens) for p, c in rows))
        scored = {id(p): await self._prompt_logprobs(p, top_prompt) for p in prompts} if top_prompt is not None else {}
        choices = []
        for index, ((p, config), gen) in enumerate(zip(rows, gens, strict=True)):
            choice = {"index": index, "text": (p.text if echo else "") + gen.text, "logprobs": None,
                      **self._finish(gen, config)}  # fmt: skip
            if logprobs is not None:
                choice["logprobs"] = await self._logprobs(p, gen, logprobs, echo)
            if scored:
                choice["prompt_logprobs"] = scored[id(p)]
            choices.append(choice)
            usage["completion_tokens"] += self._generated_tokens(gen)
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        return {**head, "choices": choices, "usage": usage}

    def _sampling(self, body: dict, max_tokens: int, stream: bool) -> tuple[list[GenerationConfig], int | None]:
        """(one config per choice, ``prompt_logprobs`` or None) of a request, refusing the sampler settings the
        adapter would not honour."""
        config = sampler_config(body, max(1, max_tokens), self.tokenizer.vocab_size)
        unsupported = [name for name in config.extras() if name not in self.adapter.sampler_extras]
        if unsupported:
            raise bad_request(f"'{unsupported[0]}' is not supported by model {self.name} (the suite's own models "
                              "implement it)", unsupported[0])  # fmt: skip
        top_prompt = int_field(body, "prompt_logprobs", None, 0, MAX_PROMPT_LOGPROBS)
        if top_prompt is not None and not self.engine.tokens:
            raise bad_request(f"prompt_logprobs need a model with token-level access; {self.name} is text-only",
                              "prompt_logprobs")  # fmt: skip
        if top_prompt is not None and stream:
            raise bad_request("prompt_logprobs are not supported with stream=true", "prompt_logprobs")
        return choice_configs(body, config), top_prompt

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

    def _finish(self, gen: Generation, config: GenerationConfig) -> dict:
        """OpenAI's ``finish_reason`` and vLLM's ``stop_reason``: the stop string or stop token id that ended it,
        null for EOS."""
        if gen.finish_reason == "length":
            return {"finish_reason": "length", "stop_reason": None}
        if gen.finish_reason == "stop" and gen.token_ids and gen.token_ids[-1] in config.stop_token_ids:
            return {"finish_reason": "stop", "stop_reason": gen.token_ids[-1]}
        if gen.finish_reason != "stop" or not config.stop:
            return {"finish_reason": "stop", "stop_reason": None}
        full = self.tokenizer.decode(gen.token_ids) if gen.token_ids else gen.text
        hits = sorted((full.find(s), s) for s in config.stop if full.find(s) >= 0)
        return {"finish_reason": "stop", "stop_reason": hits[0][1] if hits else None}

    async def _logprobs(self, prompt: _Prompt, gen: Generation, top: int, echo: bool) -> dict:
        values, _, tops = await self.engine.run(self.engine.score, prompt.ids + gen.token_ids, top)
        return await asyncio.to_thread(completion_logprobs, self.tokenizer, (prompt.text, prompt.ids), gen,
                                       (values, tops), top, echo)  # fmt: skip

    async def _prompt_logprobs(self, prompt: _Prompt, top: int) -> list[dict | None]:
        scores = await self.engine.run(self.engine.score, prompt.ids, top)
        return await asyncio.to_thread(prompt_logprobs, self.tokenizer, prompt.ids, scores)

    # -- streams ---------------------------------------------------------------------------------------------

    async def _live(self, rows: list[tuple[_Prompt, GenerationConfig]],
                    max_tokens: int) -> AsyncIterator[tuple[int, str | Generation | None]]:  # fmt: skip
        """Every row's generation submitted at once (so they may share a batch), then told row by row as it is
        made: ``(index, None)`` as the row begins, ``(index, text)`` as its text grows (:class:`LiveText`), then
        ``(index, the finished Generation)``. Closing the iterator early (the client went away) takes every
        unfinished row out of its batch."""
        streams = [self.engine.stream(self._model_prompt(p), c) if max_tokens else None for p, c in rows]
        try:
            for index, ((_, config), stream) in enumerate(zip(rows, streams, strict=True)):
                yield index, None
                if stream is None:
                    yield index, Generation("", [], "length")
                    continue
                live = LiveText(self.tokenizer, config.stop)
                async for ids in stream:
                    text = live.add(ids)
                    if text:
                        yield index, text
                rest = live.finish(stream.generation)
                if rest:
                    yield index, rest
                yield index, stream.generation
        finally:
            for stream in streams:
                if stream is not None:
                    stream.cancel()  # a no-op once finished

    async def _completion_stream(self, head: dict, rows: list, max_tokens: int, echo: bool, usage: dict,
                                 body: dict) -> AsyncIterator[dict]:  # fmt: skip
        """Chunks sent as tokens are made: choice after choice, the echoed prompt, the text, then its finish."""
        async for index, item in self._live(rows, max_tokens):
            prompt, config = rows[index]
            choice = {"index": index, "text": item, "logprobs": None, "finish_reason": None}
            if item is None and echo and prompt.text:
                choice["text"] = prompt.text
            elif isinstance(item, Generation):
                usage["completion_tokens"] += self._generated_tokens(item)
                choice = {**choice, "text": "", **self._finish(item, config)}
            if choice["text"] is not None:
                yield {**head, "choices": [choice]}
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {**head, "choices": [], "usage": {**usage, "total_tokens": sum(usage.values())}}

    async def _chat_stream(self, head: dict, rows: list, max_tokens: int, usage: dict,
                           body: dict) -> AsyncIterator[dict]:  # fmt: skip
        """Chunks sent as tokens are made: choice after choice, the assistant's role, the text, then its finish."""
        head = {**head, "object": "chat.completion.chunk"}
        async for index, item in self._live(rows, max_tokens):
            choice = {"index": index, "delta": {"content": item}, "finish_reason": None}
            if item is None:
                choice["delta"] = {"role": "assistant", "content": ""}
            elif isinstance(item, Generation):
                usage["completion_tokens"] += self._generated_tokens(item)
                choice = {"index": index, "delta": {}, **self._finish(item, rows[index][1])}
            yield {**head, "choices": [choice]}
        if (body.get("stream_options") or {}).get("include_usage"):
            yield {**head, "choices": [], "usage": {**usage, "total_tokens": sum(usage.values())}}

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
        check_fields(body, "chat")
        stream = bool_field(body, "stream")
        default = self.config.chat_max_tokens
        max_tokens = int_field(body, "max_completion_tokens", None, 1)
        max_tokens = max_tokens if max_tokens is not None else int_field(body, "max_tokens", default, 1)
        configs, top_prompt = self._sampling(body, max_tokens, stream)
        messages = self._messages(body)

        def build():
            text = chat_prompt(messages, self.tokenizer)
            return self._prompts({"prompt": text})

        (prompt,) = await tokenize(build)
        self._check_length([prompt], max_tokens)
        self.engine.metrics.prompt(prompt.n_tokens)
        usage = {"prompt_tokens": prompt.n_tokens, "completion_tokens": 0}
        head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": self.name}  # fmt: skip
        if stream:
            return self._chat_stream(head, [(prompt, c) for c in configs], max_tokens, usage, body)
        gens = await asyncio.gather(*(self._generate(prompt, c, max_tokens) for c in configs))
        usage["completion_tokens"] = sum(map(self._generated_tokens, gens))
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        choices = [{"index": i, "message": {"role": "assistant", "content": gen.text}, "logprobs": None,
                    **self._finish(gen, c)} for i, (c, gen) in enumerate(zip(configs, gens, strict=True))]  # fmt: skip
        reply = {**head, "usage": usage, "choices": choices}
        if top_prompt is not None:  # vLLM puts them beside the choices: every choice has the one prompt
            reply["prompt_logprobs"] = await self._prompt_logprobs(prompt, top_prompt)
        return reply
