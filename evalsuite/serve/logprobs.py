"""The log-probabilities in ``evalsuite serve``'s replies, from :meth:`Engine.score <evalsuite.serve.engine.Engine.
score>`'s scores: OpenAI's ``logprobs`` of a completion choice and vLLM's ``prompt_logprobs``."""

from __future__ import annotations

from collections.abc import Sequence

from evalsuite.generation.types import Generation
from evalsuite.serve.protocol import token_pieces
from evalsuite.tokenizers import Tokenizer


def token_texts(text: str, pieces: Sequence[str]) -> list[str]:
    """One string per token: ``text`` cut where the token ``pieces`` end (clipped to it; the last token takes what
    is left), so that the strings join back to ``text`` exactly -- also where a stop string or stop token cut the
    text inside the tokens."""
    out, pos = [], 0
    for piece in pieces:
        end = min(pos + len(piece), len(text))
        out.append(text[pos:end])
        pos = end
    if out and pos < len(text):
        out[-1] += text[pos:]
    return out


def prompt_texts(tokenizer: Tokenizer, text: str, ids: Sequence[int]) -> list[str]:
    """The prompt's token strings, joining back to the prompt ``text``: a BOS token the tokenizer put before a text
    prompt adds no text (its string is ``""``); a BOS among token-id prompts is its decoded text, part of ``text``."""
    bos = tokenizer.bos_id
    silent = bool(ids) and bos is not None and ids[0] == bos and not text.startswith(tokenizer.decode(ids[:1]))
    pieces = [""] + token_pieces(tokenizer, ids[1:]) if silent else token_pieces(tokenizer, ids)
    return token_texts(text, pieces)


def completion_logprobs(tokenizer: Tokenizer, prompt: tuple[str, Sequence[int]], gen: Generation,
                        scores: tuple[list[float], list[list[tuple[int, float]]]], top: int,
                        echo: bool) -> dict:  # fmt: skip
    """OpenAI's ``logprobs`` of a completion choice: ``tokens`` (strings joining back to the choice's text: with
    ``echo`` the prompt's tokens, a BOS first, then the generated ones), ``token_logprobs`` (the first token's
    null), ``top_logprobs`` (``{token text: log-probability}`` of the ``top`` likeliest; nulls when ``top`` is 0)
    and ``text_offset`` (characters of the choice's text before each token).

    ``prompt``: (text, ids); ``scores``: (log-probabilities, top tokens) of prompt + generated ids, for t >= 1.
    """
    text, ids = prompt
    values, tops = scores
    strings = token_texts(gen.text, token_pieces(tokenizer, gen.token_ids))
    token_logprobs = [None, *values]
    top_logprobs = [None] + [_top(tokenizer, row) for row in tops] if top else [None] * len(token_logprobs)
    first = len(ids)
    if echo:
        strings, first = prompt_texts(tokenizer, text, ids) + strings, 0
    offsets, pos = [], 0
    for s in strings:
        offsets.append(pos)
        pos += len(s)
    return {"tokens": strings, "token_logprobs": token_logprobs[first:], "top_logprobs": top_logprobs[first:],
            "text_offset": offsets}  # fmt: skip


def _top(tokenizer: Tokenizer, row: list[tuple[int, float]]) -> dict[str, float]:
    """``{token text: log-probability}``, likeliest first (tokens decoding to the same text keep the best)."""
    out: dict[str, float] = {}
    for token_id, value in row:
        out.setdefault(tokenizer.decode([token_id]), value)
    return out


Scores = tuple[list[float], list[int], list[list[tuple[int, float]]]]  # Engine.score's: logprobs, ranks, tops


def prompt_logprobs(tokenizer: Tokenizer, ids: Sequence[int], scores: Scores) -> list[dict | None]:
    """vLLM's ``prompt_logprobs``: null for the first prompt token, then per token ``{token id: {"logprob",
    "rank", "decoded_token"}}`` of the prompt's token (first; rank 1 is the likeliest) and the likeliest ones.

    ``scores``: :meth:`Engine.score`'s (log-probabilities, ranks, top tokens) of ``ids``."""
    values, ranks, tops = scores
    out: list[dict | None] = [None]
    for t in range(1, len(ids)):
        entry = {str(ids[t]): {"logprob": values[t - 1], "rank": ranks[t - 1],
                               "decoded_token": tokenizer.decode([ids[t]])}}  # fmt: skip
        for rank, (token_id, value) in enumerate(tops[t - 1] if tops else [], 1):
            entry.setdefault(str(token_id), {"logprob": value, "rank": rank,
                                             "decoded_token": tokenizer.decode([token_id])})  # fmt: skip
        out.append(entry)
    return out
