"""Which request fields ``evalsuite serve`` knows, and the sampler's fields parsed into :class:`GenerationConfig`.

An evaluation server that ignores a setting changes results behind its user's back, so every field of a request is
one of: implemented (read by the handlers), accepted at the one value that asks for nothing this server does not
do (any other value is a 400 naming the field), accepted because it cannot change a reply (listed with the
reason), or refused -- a 400 naming the field, for the OpenAI and vLLM fields this server does not implement and
for any field it does not know. JSON ``null`` is the field left out.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import replace

from evalsuite.generation.types import GenerationConfig
from evalsuite.serve.protocol import bad_request, bool_field, int_field, number_field, stop_field

MAX_N = 128  # choices per prompt (OpenAI's limit for chat)
MAX_PROMPT_LOGPROBS = 20  # vLLM's default max_logprobs
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, as vLLM; n > 1 adds the choice's index, within torch's seed range

# Read by the handlers of both endpoints (the sampler's fields: :func:`sampler_config`).
_COMMON = ("model", "max_tokens", "stream", "stream_options", "n", "seed", "temperature", "top_p", "top_k", "min_p",
           "stop", "stop_token_ids", "ignore_eos", "min_tokens", "repetition_penalty", "presence_penalty",
           "frequency_penalty", "logit_bias", "prompt_logprobs")  # fmt: skip
IMPLEMENTED = {
    "completions": frozenset({*_COMMON, "prompt", "echo", "logprobs", "best_of"}),
    "chat": frozenset({*_COMMON, "messages", "max_completion_tokens"}),
    # vLLM's tokenizer routes (:mod:`evalsuite.serve.tokenizer_api`)
    "tokenize": frozenset({"model", "prompt", "messages", "add_special_tokens"}),
    "detokenize": frozenset({"model", "tokens"}),
}

# Accepted whatever their value: they cannot change a reply.
MEANINGLESS = {
    "user": "an end-user id for a provider's abuse monitoring",
    "parallel_tool_calls": "only about tool calls, and tools are refused",
}

# Accepted at these values only (what this server does anyway); any other value is refused, with the reason.
_NO_TOOLS = "no tool calling"
_BOTH = {
    "response_format": (({"type": "text"},), "no JSON mode or schema"),
    "use_beam_search": ((False,), "no beam search"),
    "include_stop_str_in_output": ((False,), "stop strings are cut from the text"),
}
DEFAULT_ONLY: dict[str, dict[str, tuple[tuple, str]]] = {
    "completions": {**_BOTH, "suffix": (("",), "no insertion")},
    "chat": {
        **_BOTH,
        "logprobs": ((False,), "use /v1/completions for log-probabilities"),
        "top_logprobs": ((0,), "use /v1/completions for log-probabilities"),
        "echo": ((False,), "the reply does not repeat the last message"),
        "add_generation_prompt": ((True,), "the prompt always ends with the assistant's turn"),
        "continue_final_message": ((False,), "the prompt always ends with a new assistant turn"),
        "tools": (([],), _NO_TOOLS),
        "tool_choice": (("none", "auto"), _NO_TOOLS),  # without tools, "auto" calls none
        "functions": (([],), _NO_TOOLS),
        "function_call": (("none", "auto"), _NO_TOOLS),
    },
    "tokenize": {
        "add_generation_prompt": ((True,), "a chat prompt always ends with the assistant's turn"),
        "continue_final_message": ((False,), "a chat prompt always ends with a new assistant turn"),
        "return_token_strs": ((False,), "no token strings (/detokenize gives a token's text)"),
        "tools": (([],), _NO_TOOLS),
    },
    "detokenize": {},
}

# OpenAI and vLLM fields this server does not implement, refused whatever their value, with the reason.
_GUIDED = ("guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
           "guided_whitespace_pattern", "structured_outputs")  # fmt: skip
REFUSED = {
    **dict.fromkeys(_GUIDED, "no guided decoding"),
    "allowed_token_ids": "no token allow-lists (logit_bias does this)",
    "bad_words": "no word deny-lists (logit_bias does this for tokens)",
    "logits_processors": "no custom logits processors",
    "truncate_prompt_tokens": "prompts are never truncated; shorten the prompt",
    "length_penalty": "no beam search",
    "chat_template": "the chat template is the model's own",
    "chat_template_kwargs": "the chat template is the model's own",
}


def _same(value, accepted) -> bool:
    """JSON equality that keeps booleans apart from numbers (``false`` is not ``0``)."""
    return value == accepted and isinstance(value, bool) == isinstance(accepted, bool)


def check_fields(body: dict, endpoint: str) -> None:
    """A 400 naming the first field of ``body`` that ``endpoint`` (a key of :data:`IMPLEMENTED`) would not honour."""
    options = body.get("stream_options")
    valid = isinstance(options, dict) and not set(options) - {"include_usage"}
    if options is not None and "stream_options" in IMPLEMENTED[endpoint] and not valid:
        raise bad_request("'stream_options' must be an object with 'include_usage' only", "stream_options")
    default_only = DEFAULT_ONLY[endpoint]
    for name, value in body.items():
        if name in IMPLEMENTED[endpoint] or name in MEANINGLESS or value is None:
            continue
        if name in default_only:
            accepted, reason = default_only[name]
            if any(_same(value, a) for a in accepted):
                continue
            allowed = " or ".join(json.dumps(a) for a in accepted)
            raise bad_request(f"{name}={json.dumps(value)} is not supported by this server: {reason} (accepted: "
                              f"{allowed})", name)  # fmt: skip
        if name in REFUSED:
            raise bad_request(f"'{name}' is not supported by this server: {REFUSED[name]}", name)
        raise bad_request(f"unknown field '{name}': this server refuses the fields it does not implement rather "
                          "than ignore them", name)  # fmt: skip


def sampler_config(body: dict, max_tokens: int, vocab: int) -> GenerationConfig:
    """The sampling fields of a request (max_tokens >= 1 here; ``vocab``: token ids must lie below it)."""
    temperature = number_field(body, "temperature", 1.0, 0.0, 2.0)
    seed = int_field(body, "seed", None, *SEED_RANGE)
    if seed is None:
        seed = secrets.randbits(31) if temperature > 0 else 0
    min_tokens = int_field(body, "min_tokens", 0, 0)
    if min_tokens > max_tokens:
        raise bad_request(f"'min_tokens' must be at most max_tokens ({max_tokens}), got {min_tokens}", "min_tokens")
    return GenerationConfig(
        max_new_tokens=max_tokens,
        temperature=temperature,
        top_p=number_field(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
        top_k=int_field(body, "top_k", 0, 0) if body.get("top_k") != -1 else 0,  # vLLM's -1: no cut
        min_p=number_field(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=number_field(body, "repetition_penalty", 1.0, 0.0, float("inf"), low_open=True),
        presence_penalty=number_field(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=number_field(body, "frequency_penalty", 0.0, -2.0, 2.0),
        logit_bias=_logit_bias(body, vocab),
        min_tokens=min_tokens,
        stop=stop_field(body),
        stop_token_ids=_token_ids(body, "stop_token_ids", vocab),
        stop_at_eos=not bool_field(body, "ignore_eos"),
        seed=seed,
    )


def choice_configs(body: dict, config: GenerationConfig, prompts: int = 1) -> list[GenerationConfig]:
    """One config per choice of a request's ``n`` (``best_of``, where given, must equal it): choice i samples with
    seed ``seed + i`` (as vLLM), so choice 0 is the ``n=1`` reply of the same seed."""
    n = int_field(body, "n", 1, 1, MAX_N)
    best_of = int_field(body, "best_of", n, 1)
    if best_of != n:
        raise bad_request(f"'best_of' must equal n ({n}) here: no best-of ranking, got {best_of}", "best_of")
    return [replace(config, seed=config.seed + i) for i in range(n)]


def _token_ids(body: dict, name: str, vocab: int) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_token_id(v, vocab) for v in value):
        raise bad_request(f"'{name}' must be a list of token ids in [0, {vocab})", name)
    return list(value)


def _is_token_id(value, vocab: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab


def _logit_bias(body: dict, vocab: int) -> dict[int, float]:
    """OpenAI's ``logit_bias``: ``{"token id": bias in [-100, 100]}``."""
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    bias = {}
    for key, v in value.items():
        token = int(key) if isinstance(key, str) and key.strip().lstrip("-").isdigit() else None
        if token is None or not _is_token_id(token, vocab):
            raise bad_request(f"'logit_bias' keys must be token ids in [0, {vocab}), got {json.dumps(key)}",
                              "logit_bias")  # fmt: skip
        if isinstance(v, bool) or not isinstance(v, int | float) or not -100 <= v <= 100:
            raise bad_request(f"'logit_bias' values must be numbers in [-100, 100], got {json.dumps(v)}", "logit_bias")
        bias[token] = float(v)
    return bias
