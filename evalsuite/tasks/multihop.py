"""2-hop needle tests: what to hide and how to score it (the prompts are built by :mod:`evalsuite.tasks.niah`).

Two flavours.

**Text-level, tokenizer-agnostic** (:func:`two_hop_item`, our design; no canonical "2-hop NIAH" exists,
see eval_protocols.md §3.5). Two chained facts about invented names, written as FoX-style needle sentences::

    hop 1 (A -> B):  "\\n<person> lives in <town>.\\n"
    hop 2 (B -> C):  "\\nThe best thing to do in <town> is <activity>.\\n"

plus a distractor chain of the same shape (another person, town and activity). The question names only the
person, so the answer needs both hops, and it keeps FoX's completion cue::

    What is the best thing to do in the town where <person> lives? Answer: The best thing to do in the town
    where <person> lives is

The hop-2 needle (the one holding the answer) sits at the grid depth; the hop-1 needle and the two distractor
needles sit at independent depths drawn per cell. The **1-hop control** asks about the town directly
("What is the best thing to do in <town>? ...") over the *same* context, so the two scores differ only by
the hop. Scoring: the activity must be stated and no distractor activity stated before it
(:mod:`evalsuite.metrics.match`).

**Token-level, DRT** (:func:`drt_sample`, the multi-hop passkey test of the DRT/GCA paper, as described in
gca.md §4.3): six values of 5 random token ids; needles ``|DEF<v_a>-><v_b>|`` for the chain v0->v1->v2 and
the distractor chain v3->v4->v5, shuffled and inserted at sorted random positions of an L-token haystack
window; the query ``|The path from<v0>is<v1>,<v2>`` is placed so that "is" starts the last 64-token chunk.
Scoring is teacher-forced: one forward pass, argmax at each answer position (:func:`drt_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from evalsuite.adapters.base import Adapter
from evalsuite.errors import UserError
from evalsuite.tokenizers import Tokenizer

# ---------------------------------------------------------------------------------------------
# Text-level 2-hop
# ---------------------------------------------------------------------------------------------

# Invented names and phrases: unlikely in any haystack, and each activity is a distinct 4-word phrase.
FIRST_NAMES = ("Ilse", "Tomasz", "Marisol", "Anneke", "Brannoc", "Odalys", "Kaveh", "Liesel", "Rurik", "Soraya")
LAST_NAMES = ("Vantreck", "Oyelaran", "Quillfeather", "Marchetti", "Szabo", "Achterberg", "Nakashima", "Ferreira")
TOWNS = (
    "Brindlemere",
    "Port Casimir",
    "Oskarvik",
    "Little Tamsin",
    "Velmora",
    "Harrowgate Cove",
    "Sant Elian",
    "Kettlewick",
    "Norrfjall",
    "Ambervale",
)
VERBS = ("ride", "paint", "feed", "photograph", "race", "count", "follow", "climb")
ADJECTIVES = ("copper", "striped", "silver", "crooked", "velvet", "amber", "painted", "hollow")
NOUNS = ("ferries", "lighthouses", "goats", "windmills", "kites", "herons", "tramcars", "bell towers")


@dataclass(frozen=True)
class Chain:
    """One fact chain: person -> town -> activity."""

    person: str
    town: str
    activity: str

    @property
    def hop1(self) -> str:
        return f"\n{self.person} lives in {self.town}.\n"

    @property
    def hop2(self) -> str:
        return f"\nThe best thing to do in {self.town} is {self.activity}.\n"


def draw_chains(rng: np.random.Generator, n: int = 2) -> list[Chain]:
    """``n`` chains sharing no person, town, verb, adjective or noun (so no partial answer is ambiguous)."""
    pick = [rng.permutation(len(pool))[:n] for pool in (FIRST_NAMES, LAST_NAMES, TOWNS, VERBS, ADJECTIVES, NOUNS)]
    first, last, town, verb, adj, noun = pick
    return [
        Chain(
            person=f"{FIRST_NAMES[first[i]]} {LAST_NAMES[last[i]]}",
            town=TOWNS[town[i]],
            activity=f"{VERBS[verb[i]]} the {ADJECTIVES[adj[i]]} {NOUNS[noun[i]]}",
        )
        for i in range(n)
    ]


@dataclass(frozen=True)
class TwoHopItem:
    """One text-level 2-hop cell: the chains, where each needle goes, and the two questions."""

    target: Chain
    distractor: Chain
    depth: float  # the hop-2 (answer) needle: the grid depth
    hop1_depth: float
    distractor_depths: tuple[float, float]

    def needles(self) -> list[tuple[str, float]]:
        """(needle text, depth %) in insertion-tie order: target hop 1, target hop 2, distractor hops."""
        t, d = self.target, self.distractor
        return [
            (t.hop1, self.hop1_depth),
            (t.hop2, self.depth),
            (d.hop1, self.distractor_depths[0]),
            (d.hop2, self.distractor_depths[1]),
        ]

    def question(self, hops: int) -> str:
        """The prompt's question with FoX's completion cue; ``hops`` 2 names the person, 1 the town."""
        subject = f"the town where {self.target.person} lives" if hops == 2 else self.target.town
        return f"What is the best thing to do in {subject}? Answer: The best thing to do in {subject} is"

    def judge_question(self, hops: int) -> str:
        """The question as the judge sees it (FoX passes the bare question, without the answer cue)."""
        return self.question(hops).split(" Answer:")[0]

    def judge_reference(self, hops: int) -> str:
        """The ground truth for the judge: the fact that answers the question, as a needle-style sentence."""
        t = self.target
        if hops == 1:
            return t.hop2
        return f"\n{t.person} lives in {t.town}, and the best thing to do in {t.town} is {t.activity}.\n"

    def to_dict(self) -> dict:
        return {
            "target": vars(self.target),
            "distractor": vars(self.distractor),
            "depth_hop2": self.depth,
            "depth_hop1": self.hop1_depth,
            "distractor_depths": list(self.distractor_depths),
        }


def two_hop_item(length: int, depth: float, sample: int, seed: int) -> TwoHopItem:
    """The item of cell (length, depth, sample): entities and the other needles' depths from a seeded RNG."""
    rng = np.random.default_rng([seed, length, round(depth * 1000), sample])
    target, distractor = draw_chains(rng)
    others = rng.integers(0, 101, size=3)  # whole percentages, like the grid's depths
    return TwoHopItem(target, distractor, depth, float(others[0]), (float(others[1]), float(others[2])))


# ---------------------------------------------------------------------------------------------
# DRT token-level multi-hop passkey
# ---------------------------------------------------------------------------------------------

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
        values: the random values, ``(hops + 1) * (noise + 1)`` lists of token ids.
    """

    input_ids: list[int]
    answer_start: int
    answer_len: int
    needle_starts: list[int]
    query_start: int
    values: list[list[int]]


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


def drt_scores(adapter: Adapter, samples: Sequence[DrtSample]) -> list[dict]:
    """Teacher-forced scores of same-length samples, one forward pass for the batch.

    Per sample: ``accuracy`` (DRT's rule: the greedy token at the last answer position is right),
    ``answer_token_acc`` (fraction of the answer's tokens predicted right), ``answer_exact`` (all of them),
    and the predicted answer ids.
    """
    T = len(samples[0].input_ids)
    if any(len(s.input_ids) != T for s in samples):
        raise ValueError("drt_scores needs samples of one length")
    ids = torch.tensor([s.input_ids for s in samples], dtype=torch.long)
    pred = adapter.token_argmax(ids[:, :-1])  # pred[:, t] predicts ids[:, t + 1]
    out = []
    for b, s in enumerate(samples):
        lo, hi = s.answer_start, s.answer_start + s.answer_len
        guess = pred[b, lo - 1 : hi - 1].tolist()
        truth = s.input_ids[lo:hi]
        hits = [int(g == t) for g, t in zip(guess, truth, strict=True)]
        out.append(
            {
                "accuracy": hits[-1],
                "answer_token_acc": sum(hits) / len(hits),
                "answer_exact": int(all(hits)),
                "predicted_ids": guess,
                "answer_ids": truth,
            }
        )
    return out
