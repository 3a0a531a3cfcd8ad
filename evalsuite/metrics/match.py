"""Offline, deterministic scoring of a generated answer: does it state the needle's fact?

The rule (documented in the README, ``evalsuite niah``):

1. Normalise both the prediction and the key phrases: Unicode NFKC, lower case, every character that is
   not a letter or digit becomes a space, runs of spaces collapse to one.
2. A key phrase is *stated* when it occurs in the normalised prediction as whole words.
3. The answer matches (1) when every key phrase of the fact is stated; otherwise 0. When the task has
   distractor facts (the 2-hop test), a distractor that is stated *earlier* than the true fact makes the
   answer wrong (0): the model named the wrong chain first.
4. The 0-1 match maps to the judge's 1-10 scale as ``1 + 9 * match`` (1 = wrong, 10 = right), so offline
   and judged heatmaps share a colour scale.

``recall`` (the fraction of the key phrases' words present anywhere in the prediction) is kept as a softer
diagnostic; it does not enter the score.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

_NOT_ALNUM = re.compile(r"[\W_]+", re.UNICODE)


def normalize(text: str) -> str:
    """NFKC, lower case, non-alphanumerics to single spaces, stripped."""
    return _NOT_ALNUM.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def phrase_position(phrase: str, text: str) -> int | None:
    """Index in normalised ``text`` where normalised ``phrase`` first occurs as whole words, or None."""
    p, t = normalize(phrase), normalize(text)
    if not p:
        return None
    i = f" {t} ".find(f" {p} ")
    return None if i < 0 else i


def fact_position(key_phrases: Sequence[str], text: str) -> int | None:
    """Where the fact is stated: the position of its last-occurring key phrase, or None if one is missing."""
    positions = [phrase_position(k, text) for k in key_phrases]
    if not positions or any(p is None for p in positions):
        return None
    return max(positions)


@dataclass(frozen=True)
class MatchResult:
    match: int  # 0 or 1
    score: int  # 1 + 9 * match: the judge's 1-10 scale
    recall: float  # fraction of key words present (diagnostic)


def match_answer(prediction: str, key_phrases: Sequence[str], distractors: Sequence[Sequence[str]] = ()) -> MatchResult:
    """Score ``prediction`` against a fact given as key phrases, with optional distractor facts."""
    if not key_phrases:
        raise ValueError("a fact needs at least one key phrase")
    where = fact_position(key_phrases, prediction)
    ok = where is not None
    if ok:
        for other in distractors:
            there = fact_position(other, prediction)
            if there is not None and there < where:
                ok = False
                break
    words = [w for k in key_phrases for w in normalize(k).split()]
    present = set(normalize(prediction).split())
    recall = sum(w in present for w in words) / len(words) if words else 0.0
    return MatchResult(match=int(ok), score=1 + 9 * int(ok), recall=recall)
