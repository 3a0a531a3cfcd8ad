"""The text-level 2-hop needle test: what to hide and how to score it (the prompts are built by
:mod:`evalsuite.tasks.niah`; the DRT token-level passkey is :mod:`evalsuite.tasks.drt_passkey`).

**Tokenizer-agnostic** (:func:`two_hop_item`, our design: there is no canonical "2-hop NIAH"). Two chained facts
about invented names, written as FoX-style needle sentences::

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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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
