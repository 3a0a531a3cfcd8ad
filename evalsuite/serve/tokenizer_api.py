"""The served model's tokenizer over HTTP, as vLLM offers it (``POST /tokenize``, ``POST /detokenize``, ``GET
/tokenizer_info``): lm-eval's API models probe these to count and cut prompts with the server's own tokenizer, no
local tokenizer files needed. Also the one rule for BOS on string prompts (:func:`encode_text`); token-id prompts
are taken as given, BOS or not (as vLLM takes them)."""

from __future__ import annotations

from evalsuite.serve.protocol import MISSING, APIError, bad_request, bool_field
from evalsuite.tokenizers import Tokenizer


def encode_text(tokenizer: Tokenizer, text: str, add_special_tokens: bool = True) -> list[int]:
    """The ids of a string prompt: BOS first when the tokenizer's convention adds one (``tokenizer.add_bos``), unless
    the text already begins with the BOS token (a chat template's output, or a client's decoded token ids), which
    gets no second one; ``add_special_tokens=False``: the text's ids alone."""
    ids = tokenizer.encode(text, add_bos=False)
    if add_special_tokens and tokenizer.add_bos and ids[:1] != [tokenizer.bos_id]:
        ids = [tokenizer.bos_id, *ids]
    return ids


def special_text(tokenizer: Tokenizer, token_id: int | None) -> str | None:
    """The text of a special token, when it encodes back to that one id (else None: the token has no text form)."""
    if token_id is None:
        return None
    text = tokenizer.decode([token_id])
    return text if text and tokenizer.encode(text, add_bos=False) == [token_id] else None


def tokenizer_info(tokenizer: Tokenizer, max_length: int | None) -> dict:
    """``GET /tokenizer_info``: the special tokens as text and as ids, the BOS rule, the chat template if any."""
    template = getattr(getattr(tokenizer, "tok", None), "chat_template", None)  # HF tokenizers carry their template
    return {
        "tokenizer_class": type(tokenizer).__name__,
        "tokenizer": tokenizer.spec,
        "bos_token": special_text(tokenizer, tokenizer.bos_id),
        "eos_token": special_text(tokenizer, tokenizer.eos_id),
        "pad_token": special_text(tokenizer, getattr(tokenizer, "pad_id", None)),
        "bos_token_id": tokenizer.bos_id,
        "eos_token_id": tokenizer.eos_id,
        "add_bos_token": bool(tokenizer.add_bos),
        "vocab_size": tokenizer.vocab_size,
        "model_max_length": max_length,
        "chat_template": template if isinstance(template, str) else None,
    }


def tokenize(tokenizer: Tokenizer, body: dict, max_length: int | None, chat_prompt) -> dict:
    """``POST /tokenize``: ``{"prompt": text}`` or ``{"messages": [...]}`` (``chat_prompt(body) -> text``), with
    ``add_special_tokens`` (default true: :func:`encode_text`'s BOS rule) -> ``{"count", "max_model_len",
    "tokens"}``."""
    add = bool_field(body, "add_special_tokens", True)
    if body.get("messages") is not None:
        if body.get("prompt") is not None:
            raise bad_request("send 'prompt' or 'messages', not both", "prompt")
        text = chat_prompt(body)
    else:
        text = body.get("prompt", MISSING)
        if text is MISSING or not isinstance(text, str):
            raise bad_request("'prompt' must be a string (or send 'messages')", "prompt")
    ids = encode_text(tokenizer, text, add)
    return {"count": len(ids), "max_model_len": max_length, "tokens": ids}


def detokenize(tokenizer: Tokenizer, body: dict) -> dict:
    """``POST /detokenize``: ``{"tokens": [ids]}`` -> ``{"prompt": text}`` (special tokens kept as text)."""
    ids = body.get("tokens", MISSING)
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise bad_request("'tokens' must be a list of token ids", "tokens")
    if any(i < 0 or i >= tokenizer.vocab_size for i in ids):
        raise APIError(400, f"token ids must lie in [0, {tokenizer.vocab_size})", param="tokens")
    return {"prompt": tokenizer.decode(ids)}
