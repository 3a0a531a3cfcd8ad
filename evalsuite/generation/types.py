"""What a generation request asks for and what it returns: the types shared by the adapters and the decode engine
(:mod:`evalsuite.generation.engine`), kept below both so neither imports the other."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

# The settings beyond the basic ones (length, temperature, top_p, top_k, stop strings, EOS, seed) that an adapter's
# generate may or may not honour; an adapter lists those it does in ``TextAdapter.sampler_extras``.
SAMPLER_EXTRAS = (
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "min_tokens",
    "stop_token_ids",
)


@dataclass
class GenerationConfig:
    """How to continue a prompt. ``temperature == 0`` means greedy decoding.

    The logit rules (greedy and sampled alike; the OpenAI and vLLM definitions): ``logit_bias`` adds to a token id's
    logit; ``min_tokens`` masks EOS and ``stop_token_ids`` until that many tokens are made (stop strings count from
    there too); ``repetition_penalty`` divides a positive logit and multiplies a negative one of every token already
    in the prompt or the output (CTRL, arXiv:1909.05858, Section 4.1); ``frequency_penalty`` subtracts the penalty
    times a token's count in the output, ``presence_penalty`` the penalty once for a token the output holds. Then
    sampling: temperature, ``min_p`` (keep the tokens of at least ``min_p`` times the likeliest one's probability,
    arXiv:2407.01082), ``top_k``, ``top_p``. A token of ``stop_token_ids`` ends the row: kept in the token ids,
    not in the text.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_at_eos: bool = True
    seed: int = 0
    top_k: int = 0  # sampling: keep the k likeliest tokens (0: no cut); applied before top_p, as transformers does
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")
        if not 0 <= self.min_p <= 1 or not self.repetition_penalty > 0:
            raise ValueError("min_p must be in [0, 1] and repetition_penalty > 0")
        if not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError("min_tokens must be between 0 and max_new_tokens")
        ids = [*self.logit_bias, *self.stop_token_ids]
        if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
            raise ValueError("logit_bias keys and stop_token_ids must be token ids (integers >= 0)")
        values = (self.presence_penalty, self.frequency_penalty, *self.logit_bias.values())
        if not all(math.isfinite(v) for v in values):
            raise ValueError("penalties and logit_bias values must be finite")

    def extras(self) -> list[str]:
        """The names of :data:`SAMPLER_EXTRAS` this config sets away from their defaults."""
        default = GenerationConfig()
        return [name for name in SAMPLER_EXTRAS if getattr(self, name) != getattr(default, name)]


@dataclass
class Generation:
    """One continuation: the text (cut before any stop string), its token ids (empty when the model does not
    expose them), and why it ended: ``"stop"`` (stop string or stop token), ``"eos"`` or ``"length"``."""

    text: str
    token_ids: list[int]
    finish_reason: str


def apply_stop(text: str, stop: list[str], after: int = 0) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string that ends past character ``after``; report whether one was found."""
    found = (text.find(s, max(0, after - len(s) + 1)) for s in stop if s)
    cut = min((i for i in found if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
