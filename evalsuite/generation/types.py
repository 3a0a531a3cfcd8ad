"""What a generation request asks for and what it returns: the types shared by the adapters and the decode engine
(:mod:`evalsuite.generation.engine`), kept below both so neither imports the other."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationConfig:
    """How to continue a prompt. ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_at_eos: bool = True
    seed: int = 0
    top_k: int = 0  # sampling: keep the k likeliest tokens (0: no cut); applied before top_p, as transformers does

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("temperature must be >= 0, top_p in (0, 1] and top_k >= 0")


@dataclass
class Generation:
    """One continuation: the text (cut before any stop string), its token ids (empty when the model does not
    expose them), and why it ended: ``"stop"`` (stop string), ``"eos"`` or ``"length"``."""

    text: str
    token_ids: list[int]
    finish_reason: str


def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string; report whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
