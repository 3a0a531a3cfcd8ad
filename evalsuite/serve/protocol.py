"""The OpenAI API's side of ``evalsuite serve``: settings, errors, chat prompts, token pieces, the validators of
single fields and the batch key (which fields a request may carry, and the sampler's: :mod:`evalsuite.serve.fields`;
the rules in :mod:`evalsuite.serve`'s docstring)."""

from __future__ import annotations

import json
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


def batch_key(config: GenerationConfig, per_row: bool):
    """Requests with equal keys may share a batch: those with the same length, stop strings and EOS rule. With an
    adapter that takes a config per row (each row its own sampler settings and seed, so a sample does not depend on
    its batch) that is all; else only greedy requests without sampler extras share, each other request runs alone."""
    shared = (config.max_new_tokens, tuple(config.stop), config.stop_at_eos)
    if not per_row and (config.temperature > 0 or config.extras()):
        return object()
    return shared
