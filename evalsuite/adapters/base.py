"""The one interface every task uses to talk to a model.

An adapter provides:

* ``token_nll(input_ids, targets)``: per-token negative log-likelihood, computed in chunks so the
  full ``T x V`` logit matrix never exists (64K x 50K fp32 logits would be 13 GB);
* ``generate(prompts, config)``: continuation with a cache (greedy or sampled, stop strings, EOS,
  max new tokens);
* ``tokenizer`` (encode/decode, BOS/EOS), ``max_length``, ``device``, ``dtype``;
* ``provenance()``: what a result record must carry about the model (card, weights hash, tokenizer...).

Native models, HF models, GGUF and API models all implement this class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from evalsuite.tokenizers import Tokenizer


@dataclass
class GenerationConfig:
    """How to continue a prompt. ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    stop_at_eos: bool = True
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if self.temperature < 0 or not 0 < self.top_p <= 1:
            raise ValueError("temperature must be >= 0 and top_p in (0, 1]")


@dataclass
class Generation:
    """One continuation: the text (cut before any stop string), its token ids, and why it ended."""

    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (stop string), "eos", or "length"


def apply_stop(text: str, stop: list[str]) -> tuple[str, bool]:
    """Cut ``text`` at the earliest stop string; report whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


class Adapter(ABC):
    name: str
    tokenizer: Tokenizer
    max_length: int | None
    device: torch.device
    dtype: torch.dtype

    @abstractmethod
    def token_nll(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """NLL of ``targets[b, t]`` given ``input_ids[b, :t+1]``.

        Args: input_ids, targets: ``[B, T]`` long (targets are the inputs shifted left by one).
        Returns: ``[B, T]`` float32 on the CPU.
        """

    def token_argmax(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Greedy next token after every prefix: ``argmax_v p(v | input_ids[b, :t+1])`` (teacher forcing).

        Args: input_ids: ``[B, T]`` long. Returns: ``[B, T]`` long on the CPU. Adapters without logits
        (e.g. chat-only APIs) cannot run teacher-forced tests and keep this default.
        """
        from evalsuite.errors import UserError

        raise UserError(f"model {self.name} cannot give next-token predictions for teacher-forced scoring")

    @abstractmethod
    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[Generation]:
        """Continue each prompt (token ids, BOS already included if wanted)."""

    @abstractmethod
    def provenance(self) -> dict:
        """Card, weights identity, tokenizer, device, dtype: stored with every result."""
