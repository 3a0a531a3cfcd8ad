"""The DRT paper's passkey and 2-hop samples (Grouped Cross Attention, arXiv:2410.01651, §4.2-4.3), as token ids.

Built here, below the tasks, because both the passkey task (:mod:`evalsuite.tasks.drt_passkey`, which scores them)
and LM training (:mod:`evalsuite.training.lm_train`, which fine-tunes on them) use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from evalsuite.errors import UserError
from evalsuite.tokenizers import Tokenizer

DRT_CHUNK = 64  # DRT's chunk size: the query's "is" starts the last chunk


@dataclass
class DrtSample:
    """One teacher-forced DRT multi-hop sample.

    Attributes:
        input_ids: the sequence up to and including the last answer token (``L - chunk + answer_len + 1``
            ids); the DRT window's masked tail after it carries no targets and is left out.
        answer_start: index of the first answer token (the token after "is").
        answer_len: ``hops * value_tokens + hops - 1`` (11 for the paper's 2 hops of 5 tokens).
        needle_starts: index of each needle, chain needles first (v0->v1, v1->v2, ...), then distractors.
        query_start: index of ``|The path from``.
        values: the random values, ``(hops + 1) * (noise + 1)`` lists of token ids (the passkey: one list).
        scored: the answer position DRT's accuracy checks (2-hop: the last, -1; passkey: the first, 0).
    """

    input_ids: list[int]
    answer_start: int
    answer_len: int
    needle_starts: list[int]
    query_start: int
    values: list[list[int]]
    scored: int = -1


def _random_values(rng: np.random.Generator, n: int, size: int, tokenizer: Tokenizer) -> list[list[int]]:
    """``n`` values of ``size`` ids uniform in [0, min(50256, vocab)) with special ids redrawn (DRT: [0, 50256))."""
    high = min(50256, tokenizer.vocab_size)
    special = {i for i in (tokenizer.bos_id, tokenizer.eos_id) if i is not None}
    out = []
    for _ in range(n):
        ids = rng.integers(0, high, size=size)
        while bad := [j for j, v in enumerate(ids) if int(v) in special]:
            ids[bad] = rng.integers(0, high, size=len(bad))
        out.append([int(v) for v in ids])
    return out


def drt_sample(
    window: Sequence[int],
    tokenizer: Tokenizer,
    rng: np.random.Generator,
    *,
    hops: int = 2,
    noise: int = 1,
    value_tokens: int = 5,
    chunk: int = DRT_CHUNK,
    keep_prefix: int = 0,
) -> DrtSample:
    """Build one DRT multi-hop sample from an ``L``-token haystack window (``L`` a multiple of ``chunk``).

    ``keep_prefix`` leading ids (BOS) stay in front: needles go after them (DRT's windows have no BOS).
    """
    L = len(window)
    if L % chunk:
        raise UserError(f"DRT multi-hop length {L} must be a multiple of the chunk size {chunk}")
    enc = lambda s: tokenizer.encode(s, add_bos=False)  # noqa: E731 - a local shorthand
    values = _random_values(rng, (hops + 1) * (noise + 1), value_tokens, tokenizer)
    needles, owner = [], []
    for group in range(noise + 1):
        for hop in range(hops):
            a, b = values[group * (hops + 1) + hop], values[group * (hops + 1) + hop + 1]
            needles.append(enc("|DEF") + a + enc("->") + b + enc("|"))
            owner.append(len(owner))
    order = rng.permutation(len(needles))  # shuffled needles, placed at sorted positions
    answer = [t for v in values[1 : hops + 1] for t in (*enc(","), *v)][len(enc(",")) :]
    query = enc("|The path from") + values[0] + enc("is") + answer
    answer_len = hops * value_tokens + (hops - 1) * len(enc(","))
    if chunk <= len(query):
        raise UserError(f"DRT query of {len(query)} tokens does not fit in a chunk of {chunk}")
    reserve = chunk - 1 - answer_len + len(query)  # the query ends up in front of the last chunk
    room = L - sum(map(len, needles)) - reserve
    if room - keep_prefix < len(needles):
        raise UserError(f"DRT multi-hop length {L} is too short for its needles and query")
    positions = np.sort(rng.choice(room - keep_prefix, size=len(needles), replace=False) + keep_prefix)

    seq: list[int] = []
    starts = [0] * len(needles)
    prev = 0
    for pos, k in zip(positions.tolist(), order.tolist(), strict=True):
        seq += list(window[prev:pos])
        starts[owner[k]] = len(seq)
        seq += needles[k]
        prev = pos
    seq += list(window[prev:])
    query_start = L - reserve
    seq = (seq[:query_start] + query + seq[query_start:])[:L]
    answer_start = query_start + len(query) - answer_len
    final = answer_start + answer_len - 1  # = L - chunk + answer_len when "is" is one token
    return DrtSample(seq[: final + 1], answer_start, answer_len, starts, query_start, values)


def passkey_sample(
    window: Sequence[int],
    tokenizer: Tokenizer,
    rng: np.random.Generator,
    *,
    value_tokens: int = 5,
    chunk: int = DRT_CHUNK,
    keep_prefix: int = 0,
) -> DrtSample:
    """Build one DRT passkey sample (arXiv:2410.01651 §4.2; the released ``PasskeyRetrieval`` layout) from an
    ``L``-token haystack window, ``L`` a multiple of ``chunk``; ``keep_prefix`` leading ids (BOS) stay in front."""
    L = len(window)
    if L % chunk:
        raise UserError(f"DRT passkey length {L} must be a multiple of the chunk size {chunk}")
    enc = lambda s: tokenizer.encode(s, add_bos=False)  # noqa: E731 - a local shorthand
    key = _random_values(rng, 1, value_tokens, tokenizer)[0]
    needle = enc("|") + enc("The passkey is:") + key + enc("|")
    question = enc("|What is the passkey? The passkey is")
    room = L - 2 * chunk - len(needle)  # the needle ends at least one chunk before the question's chunk
    query_start = L - chunk - (len(question) - 1)  # "is", the question's last token, starts the last chunk
    if room <= keep_prefix or query_start <= keep_prefix:
        raise UserError(f"DRT passkey length {L} is too short for its needle and question")
    at = int(rng.integers(keep_prefix, room))
    seq = list(window[:at]) + needle + list(window[at:])
    seq = seq[:query_start] + question + key
    answer_start = query_start + len(question)
    return DrtSample(seq[: answer_start + value_tokens], answer_start, value_tokens, [at], query_start, [key], scored=0)
