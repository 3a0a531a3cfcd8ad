"""NIAH prompts: FoX's needle insertion and prompt text (see :mod:`evalsuite.tasks.niah` for the rules), and the
2-hop prompts built the same way."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from evalsuite.data.haystack import SYNTHETIC, Haystack, decode_skip_special, load_haystack
from evalsuite.errors import UserError
from evalsuite.tasks import multihop
from evalsuite.tokenizers import Tokenizer

BUFFER = 200  # FoX/gkamradt "final_context_length_buffer"

# FoX's strings (config-prompt-{easy,standard}.yaml, prompt.py, config-eval.yaml), verbatim.
STANDARD_NEEDLE = "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n"
EASY_NEEDLE = (
    "\nWhat is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is eat a "
    "sandwich and sit in Dolores Park on a sunny day.\n"
)
QUESTION = "What is the best thing to do in San Francisco? Answer: The best thing to do in San Francisco is"
JUDGE_QUESTION = "What is the best thing to do in San Francisco?"
JUDGE_REFERENCE = STANDARD_NEEDLE
QUIZ = (
    "\n\nThere is an important piece of information hidden inside the above document. Now that you've read the "
    "document, I will quiz you about it. Answer the following question: "
)
# The offline scorer's key phrases for the San Francisco fact (metrics/match.py has the rule).
KEY_PHRASES = ("eat a sandwich", "dolores park")


def insert_needles(context: str, needles: Sequence[tuple[str, float]], length: int, tokenizer: Tokenizer) -> str:
    """FoX's ``insert_needle``, generalised to several needles; with one needle it is FoX's exactly.

    The context is encoded without BOS and, when context + needles exceed ``length - 200`` tokens, cut to
    ``length - 200 - len(needles)``. Each needle's point is ``int(n * depth / 100)`` on that cut context,
    moved back to just after the previous ``.`` token (or the start); depth 100 means the end. Needles
    sharing a point keep the given order. Returns the decoded text.
    """
    tokens = tokenizer.encode(context, add_bos=False)
    needle_ids = [tokenizer.encode(text, add_bos=False) for text, _ in needles]
    period = set(tokenizer.encode(".", add_bos=False))
    limit = length - BUFFER
    total = sum(map(len, needle_ids))
    if limit - total < 1:
        raise UserError(f"length {length} is too short for the {BUFFER}-token buffer and {total} needle tokens")
    if len(tokens) + total > limit:
        tokens = tokens[: limit - total]
    points = []
    for _, depth in needles:
        if depth == 100:
            points.append(len(tokens))
            continue
        point = int(len(tokens) * (depth / 100))
        while point > 0 and tokens[point - 1] not in period:
            point -= 1
        points.append(point)
    out: list[int] = []
    prev = 0
    for i in sorted(range(len(needles)), key=lambda i: (points[i], i)):
        out += tokens[prev : points[i]] + needle_ids[i]
        prev = points[i]
    out += tokens[prev:]
    return decode_skip_special(tokenizer, out)


def needle_prompt(
    haystack: Haystack, tokenizer: Tokenizer, length: int, needles: Sequence[tuple[str, float]], question: str
) -> str:
    """``context + QUIZ + question`` for a cell with the given needles."""
    context = insert_needles(haystack.context(length, tokenizer), needles, length, tokenizer)
    return context + QUIZ + question


def build_prompt(
    tokenizer: Tokenizer,
    mode: str,
    length: int,
    depth: float,
    haystack: Haystack | str = SYNTHETIC,
    *,
    grid_max_length: int | None = None,
    seed: int = 0,
) -> str:
    """The prompt text of an easy/standard cell, exactly as FoX builds it.

    ``haystack`` is a loaded :class:`Haystack` or a source (``synthetic`` or a path), loaded here for a grid
    whose longest length is ``grid_max_length`` (default ``length``; FoX repeats a short haystack until it
    covers the grid's longest length, which can shift a short haystack's text at the repeat seam).
    """
    if mode not in ("easy", "standard"):
        raise UserError(f"build_prompt covers the easy and standard modes, not {mode!r}")
    check_depth(depth)
    if not isinstance(haystack, Haystack):
        haystack = load_haystack(haystack, tokenizer, max(grid_max_length or length, length), seed)
    needle = EASY_NEEDLE if mode == "easy" else STANDARD_NEEDLE
    return needle_prompt(haystack, tokenizer, length, [(needle, depth)], QUESTION)


def two_hop_prompts(haystack: Haystack, tokenizer: Tokenizer, length: int, item: multihop.TwoHopItem) -> dict:
    """The 2-hop prompt and its 1-hop control (same context, question about the town): {hops: prompt}."""
    context = insert_needles(haystack.context(length, tokenizer), item.needles(), length, tokenizer)
    return {hops: context + QUIZ + item.question(hops) for hops in (2, 1)}


def prompt_sha256(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()


def check_depth(depth: float) -> None:
    """UserError unless ``depth`` is a percentage."""
    if not 0 <= depth <= 100:
        raise UserError(f"needle depth {depth} is outside 0..100 (percent)")
