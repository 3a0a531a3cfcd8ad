"""How the decode engine turns a step's logits into the next tokens, each row under its own settings
(:class:`~evalsuite.generation.types.GenerationConfig`; one config per row, or one for every row).

:class:`TokenChooser` is the one choice of both decoding loops, the decode engine's whole-call ``generate`` and the
step-by-step :class:`~evalsuite.generation.steps.DecodeRun` (the serve scheduler), so a request gives the same tokens
through either. It applies :class:`LogitRules` -- the rules that change the logits before the choice: ``logit_bias``,
``min_tokens``, the repetition, frequency and presence penalties, as per-row tensors on the model's device with the
token counts they need, so a greedy batch still chooses on the device without a host sync -- then the choice,
:func:`sample_next`: argmax for greedy rows, and for sampled rows temperature, ``min_p``, ``top_k``, ``top_p`` and a
draw on the CPU from the row's ``torch.Generator`` (:func:`generators`; so a seed gives the same tokens on every
device, and with one config per row a row's tokens depend on its own seed alone, not on the other rows of its batch).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from evalsuite.generation.types import GenerationConfig


def per_row(config: GenerationConfig | Sequence[GenerationConfig], batch: int) -> list[GenerationConfig]:
    """One config per row: ``config`` repeated, or the list checked for length."""
    if isinstance(config, GenerationConfig):
        return [config] * batch
    configs = list(config)
    if len(configs) != batch:
        raise ValueError(f"{len(configs)} generation configs for {batch} rows")
    return configs


def _column(values: Sequence[float], device=None) -> torch.Tensor:
    """One value per row as a float32 ``[B, 1]`` tensor (it broadcasts over the vocabulary)."""
    return torch.tensor(values, dtype=torch.float32, device=device)[:, None]


class LogitRules:
    """The logit rules of one generate call's rows (see :class:`GenerationConfig`), in vLLM's order: logit_bias,
    the min_tokens mask, then the repetition, frequency and presence penalties.

    ``prompts``: the left-padded prompt ids ``[B, T]`` and ``start`` ``[B]`` (first real token, or None), read for
    the repetition penalty; ``eos``: the tokenizer's EOS id or None (masked under min_tokens in the rows that stop at
    EOS). State: the output token counts ``[B, V]`` and the number of tokens made, advanced by :meth:`update`.
    ``active`` is False when no row sets any rule: then :class:`TokenChooser` skips it, the logits untouched.
    """

    def __init__(self, configs: Sequence[GenerationConfig], prompts: torch.Tensor, start: torch.Tensor | None,
                 vocab: int, eos: int | None, device: torch.device):  # fmt: skip
        B = len(configs)
        self.made = 0
        self.bias = self.banned = self.min_tokens = self.counts = self.seen = None

        for c in configs:
            if any(i >= vocab for i in [*c.logit_bias, *c.stop_token_ids]):
                raise ValueError(f"logit_bias and stop_token_ids must be token ids below the vocabulary size {vocab}")
        if any(c.logit_bias for c in configs):
            bias = torch.zeros(B, vocab)
            for b, c in enumerate(configs):
                bias[b, list(c.logit_bias)] = torch.tensor(list(c.logit_bias.values()), dtype=torch.float32)
            self.bias = bias.to(device)
        if any(c.min_tokens for c in configs):
            self.min_tokens = torch.tensor([c.min_tokens for c in configs], device=device)
            banned = torch.zeros(B, vocab, dtype=torch.bool)
            for b, c in enumerate(configs):
                banned[b, [*c.stop_token_ids, *([eos] if eos is not None and c.stop_at_eos else [])]] = True
            self.banned = banned.to(device)
        self.rep = _column([c.repetition_penalty for c in configs], device)
        self.frequency = _column([c.frequency_penalty for c in configs], device)
        self.presence = _column([c.presence_penalty for c in configs], device)
        if any(c.repetition_penalty != 1 or c.frequency_penalty or c.presence_penalty for c in configs):
            self.counts = torch.zeros(B, vocab, device=device)
        if any(c.repetition_penalty != 1 for c in configs):
            T = prompts.shape[1]
            real = torch.ones(B, T, device=device)
            if start is not None:  # left padding is not part of a prompt
                real = (torch.arange(T, device=device) >= start.to(device)[:, None]).float()
            self.seen = torch.zeros(B, vocab, device=device).scatter_add_(1, prompts.to(device), real) > 0
        self.active = any(x is not None for x in (self.bias, self.min_tokens, self.counts))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits ``[B, V]`` -> the ruled logits ``[B, V]`` float32 (rows without rules unchanged)."""
        logits = logits.float()
        if self.bias is not None:
            logits = logits + self.bias
        if self.min_tokens is not None:
            early = (self.min_tokens > self.made)[:, None]
            logits = logits.masked_fill(early & self.banned, float("-inf"))
        if self.counts is not None:
            present = self.counts > 0
            if self.seen is not None:
                penalised = torch.where(logits > 0, logits / self.rep, logits * self.rep)
                logits = torch.where(self.seen | present, penalised, logits)
            logits = logits - self.frequency * self.counts - self.presence * present
        return logits

    def update(self, tok: torch.Tensor) -> None:
        """Count the tokens ``tok [B]`` just chosen."""
        self.made += 1
        if self.counts is not None:
            self.counts.scatter_add_(1, tok[:, None], torch.ones_like(self.counts[:, :1]))


def generators(config: GenerationConfig | Sequence[GenerationConfig], batch: int) -> list[torch.Generator]:
    """The draws' generators, one per row: one config for every row -> one generator of its seed, shared (the
    sampled rows draw from it in turn); one config per row -> each row its own generator of its own seed, so a
    row's tokens depend on its seed alone, not on the other rows of its batch."""
    if isinstance(config, GenerationConfig):
        return [torch.Generator().manual_seed(config.seed)] * batch
    return [torch.Generator().manual_seed(c.seed) for c in per_row(config, batch)]


class TokenChooser:
    """The next token of every row of one batch from a step's logits: the rows' :class:`LogitRules`, then the
    argmax for greedy rows (on the device, no host sync) or :func:`sample_next`'s draw from the row's generator
    (:func:`generators`). Called once per position, in order: it counts the tokens it chose (the penalties and
    ``min_tokens`` read the counts).

    ``config``: one for every row or one per row; ``prompts`` ``[B, T]``, ``start``, ``vocab``, ``eos``, ``device``
    as :class:`LogitRules` takes them. ``plain``: every row greedy without rules, the choice the bare argmax (which
    a greedy CUDA graph takes in).
    """

    def __init__(self, config: GenerationConfig | Sequence[GenerationConfig], prompts: torch.Tensor,
                 start: torch.Tensor | None, vocab: int, eos: int | None, device: torch.device):  # fmt: skip
        B = prompts.shape[0]
        self.configs = per_row(config, B)
        self.rules = LogitRules(self.configs, prompts, start, vocab, eos, device)
        self.greedy = all(c.temperature == 0 for c in self.configs)
        self.plain = self.greedy and not self.rules.active
        self.gens = None if self.greedy else generators(config, B)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits ``[B, V]`` -> token ids ``[B]`` on the logits' device."""
        if self.plain:
            return logits.argmax(-1)
        if self.rules.active:
            logits = self.rules(logits)
        tok = logits.argmax(-1) if self.greedy else sample_next(logits, self.configs, self.gens)
        self.rules.update(tok)
        return tok


def sample_next(logits: torch.Tensor, config: GenerationConfig | Sequence[GenerationConfig],
                gen: torch.Generator | Sequence[torch.Generator]) -> torch.Tensor:  # fmt: skip
    """logits ``[B, V]`` -> token ids ``[B]`` on the logits' device: argmax for greedy rows (temperature 0), else
    temperature, min_p, top-k then top-p and a draw on the CPU (so seeds agree across devices).

    ``config``: one for every row, or one per row; ``gen``: one generator drawing a uniform for every sampled row in
    turn, or one per row (each row draws from its own: its tokens do not depend on the other rows). The draw:
    :func:`inverse_cdf`.
    """
    B = logits.shape[0]
    configs = per_row(config, B)
    gens = [gen] * B if isinstance(gen, torch.Generator) else list(gen)
    sampled = [b for b, c in enumerate(configs) if c.temperature > 0]
    if not sampled:
        return logits.argmax(-1)
    rows = logits if len(sampled) == B else logits[torch.tensor(sampled, device=logits.device)]
    probs = filtered_probs(rows.float().cpu(), [configs[b] for b in sampled])
    if all(gens[b] is gens[sampled[0]] for b in sampled):  # one generator: a uniform per row, row after row
        u = torch.rand(len(sampled), generator=gens[sampled[0]], dtype=torch.float64)
    else:
        u = torch.cat([torch.rand(1, generator=gens[b], dtype=torch.float64) for b in sampled])
    drawn = inverse_cdf(probs, u).to(logits.device)
    if len(sampled) == B:
        return drawn
    tok = logits.argmax(-1)
    tok[torch.tensor(sampled, device=logits.device)] = drawn
    return tok


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs ``[S, V]`` (unnormalised, >= 0) and uniforms ``u [S]`` in [0, 1) float64 -> token ids ``[S]``: per row
    the first token whose cumulative probability passes ``u`` times the row's total (float64 sums; a zero
    probability is never taken). One uniform per row, rather than ``torch.multinomial``'s one exponential per
    vocabulary entry, keeps a draw from a row's own generator cheap in a large batch."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    chosen = torch.searchsorted(cdf, u[:, None] * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last token of nonzero probability: u * total rounding up to total
    return torch.minimum(chosen, last)[:, 0]


def filtered_probs(logits: torch.Tensor, configs: Sequence[GenerationConfig]) -> torch.Tensor:
    """float32 logits ``[S, V]`` of sampled rows -> probabilities ``[S, V]`` after each row's temperature, min_p,
    top_k and top_p (renormalised after each cut a row makes; a row without a cut is left bit for bit as it was)."""
    probs = torch.softmax(logits / _column([c.temperature for c in configs]), dim=-1)
    min_p = _column([c.min_p for c in configs])
    if bool((min_p > 0).any()):
        kept = probs * (probs >= min_p * probs.max(-1, keepdim=True).values)
        probs = torch.where(min_p > 0, kept / kept.sum(-1, keepdim=True), probs)
    top_k = torch.tensor([c.top_k for c in configs])[:, None]
    if bool((top_k > 0).any()):
        kth = probs.sort(dim=-1, descending=True).values.gather(-1, top_k.clamp(1, probs.shape[-1]) - 1)
        kept = probs * (probs >= kth)  # ties with the k-th likeliest stay
        probs = torch.where(top_k > 0, kept / kept.sum(-1, keepdim=True), probs)
    top_p = _column([c.top_p for c in configs])
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p = sorted_p * (sorted_p.cumsum(-1) - sorted_p < top_p)  # the smallest prefix reaching top_p
        probs = torch.where(top_p < 1, torch.zeros_like(probs).scatter(-1, order, sorted_p), probs)
    return probs
