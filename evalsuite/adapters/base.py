"""The two adapter tiers every task talks to (never to a model directly).

**Text tier** (:class:`TextAdapter`): what any model can do, API models included -- generate a continuation
until a stop string (:meth:`~TextAdapter.generate_until`) and, where declared, the log-likelihood of a
continuation (:meth:`~TextAdapter.loglikelihood`, lm-eval's request type). A text adapter still names a
tokenizer, used to count and cut prompts (NIAH lengths, truncation).

**Token tier** (:class:`TokenAdapter`): models whose logits we can read. It adds logits over token ids in chunks
(:meth:`~TokenAdapter.chunked_logits`; a ``T x V`` matrix never exists at long context), and on top of that
per-token NLL, teacher-forced argmax and cached generation from token ids. The text-tier methods come for free.

Each adapter declares its ``capabilities``; a task names what it needs and the runner refuses a model that
lacks it, up front, with one line. Identity and lengths are typed fields (:class:`ModelInfo`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from evalsuite.errors import UserError
from evalsuite.generation.types import Generation, GenerationConfig
from evalsuite.tokenizers import Tokenizer

# Capability names (a task's ``needs`` is a set of these).
GENERATE = "generate"  # generate_until
LOGLIKELIHOOD = "loglikelihood"  # loglikelihood of continuations
TOKENS = "tokens"  # token tier: chunked logits, token NLL, argmax, generation from ids
TEXT_CAPABILITIES = frozenset({GENERATE, LOGLIKELIHOOD})
TOKEN_CAPABILITIES = frozenset({GENERATE, LOGLIKELIHOOD, TOKENS})


@dataclass(frozen=True)
class ModelInfo:
    """What a result must say about the model. ``weights_id``: a checkpoint's sha256, ``random-init-seed-N``,
    or an API model's name and version; ``tokenizer``: the spec counting lengths; lengths in tokens."""

    name: str
    weights_id: str
    tokenizer: str
    dtype: str
    train_length: int | None = None
    max_length: int | None = None


class TextAdapter(ABC):
    """Text in, text out. Subclasses set ``info``, ``tokenizer`` and ``capabilities``."""

    info: ModelInfo
    tokenizer: Tokenizer
    capabilities: frozenset[str] = frozenset({GENERATE})
    device: torch.device = torch.device("cpu")
    # Generation settings beyond the basic ones (generation.types.SAMPLER_EXTRAS) that generate honours, and whether
    # generate takes one GenerationConfig per prompt (each row with its own settings and seed) besides one for all.
    sampler_extras: frozenset[str] = frozenset()
    per_row_configs: bool = False

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def max_length(self) -> int | None:
        return self.info.max_length

    @property
    def train_length(self) -> int | None:
        return self.info.train_length

    def check_length(self, n: int) -> None:
        """UserError when ``n`` tokens exceed the model's ``max_length``."""
        if self.max_length is not None and n > self.max_length:
            raise UserError(f"{n} tokens exceed model {self.name}'s max_length {self.max_length}")

    def identity(self) -> dict:
        """What makes this model's results differ from another's (enters every run's config hash)."""
        i = self.info
        return {"model": i.name, "checkpoint_sha256": i.weights_id, "tokenizer": i.tokenizer, "dtype": i.dtype}

    def provenance(self) -> dict:
        """Stored with every result: the identity plus whatever else the adapter knows (card, device, ...)."""
        return {**self.identity(), "train_length": self.info.train_length, "max_length": self.info.max_length}

    def attach_run(self, run_dir: Path) -> None:  # noqa: B027 - an optional hook, not an abstract method
        """Called by the runner with the run directory before a task runs (the API adapter logs requests there)."""

    @abstractmethod
    def generate_until(self, prompts: Sequence[str], config: GenerationConfig) -> list[Generation]:
        """Continue each prompt text (the tokenizer's BOS convention applies)."""

    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        """For each ``(context, continuation)``: the continuation's summed log-probability and whether greedy
        decoding would produce it. Adapters without log-probabilities keep this default."""
        raise UserError(f"model {self.name} does not give log-likelihoods")


def chunk_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:meth:`TokenAdapter.chunk_nll` as a function (what ``torch.compile`` takes)."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


class TokenAdapter(TextAdapter):
    """A model whose logits are readable. Subclasses implement :meth:`chunked_logits` and :meth:`generate`."""

    capabilities = TOKEN_CAPABILITIES
    dtype: torch.dtype = torch.float32

    @abstractmethod
    def chunked_logits(self, input_ids: torch.Tensor) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(start, logits [B, chunk, V])`` for ``input_ids [B, T]`` (on the model's device), one chunk
        of positions at a time; ``logits[:, t]`` predicts the token after ``input_ids[:, start + t]``."""

    @abstractmethod
    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[Generation]:
        """Continue each prompt of token ids (BOS already included if wanted), with a cache."""

    def chunk_nll(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """NLL ``[B, chunk]`` float32 of ``targets`` ``[B, chunk]`` under ``logits`` ``[B, chunk, V]`` (softmax in
        float32). Adapters may run it compiled (:class:`~evalsuite.adapters.native.NativeAdapter`'s ``compile``)."""
        return chunk_nll(logits, targets)

    @torch.inference_mode()
    def token_nll(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """NLL of ``targets[b, t]`` given ``input_ids[b, :t+1]``.

        Args: input_ids, targets: ``[B, T]`` long (targets are the inputs shifted left by one).
        Returns: ``[B, T]`` float32 on the CPU.
        """
        return self.token_scores(input_ids, targets, argmax=False)[0]

    @torch.inference_mode()
    def token_argmax(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Greedy next token after every prefix (teacher forcing): ``[B, T]`` long on the CPU."""
        return self.token_scores(input_ids, None)[1]

    @torch.inference_mode()
    def token_scores(
        self, input_ids: torch.Tensor, targets: torch.Tensor | None, argmax: bool = True
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(NLL of ``targets`` or None, argmax or None without ``argmax``), both ``[B, T]`` on the CPU, from one pass
        over the logits."""
        nll, greedy = [], []
        if targets is not None:
            targets = targets.to(self.device)
        for s, logits in self.chunked_logits(input_ids):
            if argmax:
                greedy.append(logits.argmax(-1))
            if targets is not None:
                nll.append(self.chunk_nll(logits, targets[:, s : s + logits.shape[1]]))
        return (torch.cat(nll, 1).cpu() if nll else None), (torch.cat(greedy, 1).cpu() if argmax else None)

    def generate_until(self, prompts: Sequence[str], config: GenerationConfig) -> list[Generation]:
        return self.generate([self.tokenizer.encode(p) for p in prompts], config)

    @torch.inference_mode()
    def loglikelihood(self, requests: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        out = []
        for context, continuation in requests:
            ctx = self.tokenizer.encode(context)
            cont = self.tokenizer.encode(continuation, add_bos=False)
            if not ctx or not cont:
                raise UserError("loglikelihood needs a non-empty context (or a BOS token) and continuation")
            ids = torch.tensor([ctx + cont])
            nll, argmax = self.token_scores(ids[:, :-1], ids[:, 1:])
            n = len(cont)
            greedy = bool((argmax[0, -n:] == ids[0, -n:]).all())
            out.append((-float(nll[0, -n:].double().sum()), greedy))
        return out
