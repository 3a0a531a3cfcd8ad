"""The OpenAI API's side of ``evalsuite serve``: settings, errors, chat prompts, token pieces and the parsing
of request bodies into :class:`GenerationConfig` (the field rules are in :mod:`evalsuite.serve`'s docstring)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from evalsuite.generation.types import GenerationConfig
from evalsuite.tokenizers import Tokenizer

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
    """Server settings. ``served_name`` defaults to the adapter's name; ``prefill_chunk``: prompt tokens a batch
    prefills per scheduler step (None: whole prompts), see :mod:`evalsuite.serve.scheduler`."""

    served_name: str | None = None
    max_batch: int = 8
    batch_window_ms: float = 5.0
    prefill_chunk: int | None = 512
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

MISSING = object()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def int_field(body: dict, name: str, default, low: int | None = None, high: int | None = None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{name}' must be an integer, got {json.dumps(value)}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise bad_request(f"'{name}' must be {span}, got {value}", name)
    return value


def number_field(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(f"'{name}' must be a number, got {json.dumps(value)}", name)
    if value < low or value > high or (low_open and value == low):
        raise bad_request(f"'{name}' must be in {'(' if low_open else '['}{low}, {high}], got {value}", name)
    return float(value)


def bool_field(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{name}' must be true or false, got {json.dumps(value)}", name)
    return value


def stop_field(body: dict) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        return [value] if value else []
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return [s for s in value if s]
    raise bad_request("'stop' must be a string or a list of strings", "stop")


def refuse_unsupported(body: dict) -> None:
    """Refuse, rather than ignore, the fields that would change the output and are not implemented."""
    if int_field(body, "n", 1, 1) != 1:
        raise bad_request("only n=1 is supported", "n")
    if int_field(body, "best_of", 1, 1) != 1:
        raise bad_request("only best_of=1 is supported", "best_of")
    for name in ("presence_penalty", "frequency_penalty"):
        if number_field(body, name, 0.0, -2.0, 2.0) != 0:
            raise bad_request(f"'{name}' is not supported", name)
    if body.get("logit_bias"):
        raise bad_request("'logit_bias' is not supported", "logit_bias")
    if body.get("suffix"):
        raise bad_request("'suffix' is not supported", "suffix")


def generation_config(body: dict, max_tokens: int) -> GenerationConfig:
    """The sampling fields of a request (max_tokens >= 1 here)."""
    temperature = number_field(body, "temperature", 1.0, 0.0, 2.0)
    seed = int_field(body, "seed", None)
    if seed is None:
        seed = secrets.randbits(31) if temperature > 0 else 0
    return GenerationConfig(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=int_field(body, "top_k", 0, 0) if body.get("top_k") != -1 else 0,  # vLLM's -1: no cut
        stop=stop_field(body),
        stop_at_eos=not bool_field(body, "ignore_eos"),
        seed=seed,
    )


def batch_key(config: GenerationConfig):
    """Requests with equal keys may share a batch: greedy ones with the same length, stops and EOS rule."""
    if config.temperature > 0:
        return object()  # sampled: alone, so its seed alone decides the sample
    return ("greedy", config.max_new_tokens, tuple(config.stop), config.stop_at_eos)
