"""How the decode engine turns a step's logits into the next tokens, each row under its own settings
(:class:`~evalsuite.generation.types.GenerationConfig`; one config per row, or one for every row).

:class:`TokenChooser` is the one choice of both decoding loops, the decode engine's whole-call ``generate`` and the
step-by-step :class:`~evalsuite.generation.steps.DecodeRun` (the serve scheduler), so a request gives the same tokens
through either. It applies :class:`LogitRules` -- the rules that change the logits before the choice: ``logit_bias``,
``min_tokens``, the repetition, frequency and presence penalties, as per-row tensors on the model's device with the
token counts they need -- then the choice, :func:`sample_next`: argmax for greedy rows, and for sampled rows
temperature, ``min_p``, ``top_k``, ``top_p`` and an inverse-CDF draw. All of it runs on the model's device as tensor
ops (a batch's settings are made tensors once, :class:`SamplerRows`), so no token costs a host sync and a CUDA graph
can hold the whole choice.

The draws are counter-based (:mod:`evalsuite.generation.philox`): row b's uniform at step n is Philox of the counter
(n, stream) under its seed's key -- stream 0 when each row has its own config, so a row's tokens depend on its own
seed alone, not on the other rows of its batch; stream b when one config serves every row, so its rows draw apart. A
chooser makes its rows' uniforms at once (:func:`draw_uniforms`) and a step reads them at the step counter, a device
tensor advanced in place. The integers are the same on every device, so a seed gives the same uniforms on a CPU and a
GPU, and the same tokens up to float ties between them and the cumulative probabilities they pick from (which the
device's and dtype's logits move); on one device, every path (``generate`` or ``DecodeRun``; eager, static, graph)
draws the same tokens from the same logits. This mapping of seeds to tokens replaced a CPU draw from a
``torch.Generator`` per seed (a host sync per token), whose tokens for a seed were others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from evalsuite.generation.philox import seed_keys, uniforms
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
    EOS). State: the output token counts ``[B, V]`` and the number of tokens made (:attr:`made`, a long scalar on the
    device, so a CUDA graph replays its update), advanced by :meth:`update`.
    ``active`` is False when no row sets any rule: then :class:`TokenChooser` skips it, the logits untouched.
    """

    def __init__(self, configs: Sequence[GenerationConfig], prompts: torch.Tensor, start: torch.Tensor | None,
                 vocab: int, eos: int | None, device: torch.device):  # fmt: skip
        B = len(configs)
        self.made = torch.zeros((), dtype=torch.long, device=device)
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
        self.made += 1  # in place: a captured step advances the count it reads
        if self.counts is not None:
            self.counts.scatter_add_(1, tok[:, None], torch.ones_like(self.counts[:, :1]))


@dataclass(frozen=True)
class SamplerRows:
    """A batch's sampler settings as tensors on its device, made once (:meth:`of`) so that a step reads no Python
    value of them: ``temperature`` ``[B, 1]`` float32 (1 in greedy rows, whose draw is not taken); ``min_p``,
    ``top_k`` (long) and ``top_p`` ``[B, 1]``, each None when no row cuts by it; ``greedy`` ``[B]`` bool, None when
    no row is greedy; ``k_max``, the largest ``top_k`` (one ``topk`` of that width serves every row's cut)."""

    temperature: torch.Tensor
    min_p: torch.Tensor | None = None
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    greedy: torch.Tensor | None = None
    k_max: int = 0

    @classmethod
    def of(cls, configs: Sequence[GenerationConfig], device=None) -> SamplerRows:
        greedy, top_k = [c.temperature == 0 for c in configs], [c.top_k for c in configs]
        return cls(
            temperature=_column([c.temperature or 1.0 for c in configs], device),
            min_p=_column([c.min_p for c in configs], device) if any(c.min_p > 0 for c in configs) else None,
            top_k=torch.tensor(top_k, device=device)[:, None] if any(top_k) else None,
            top_p=_column([c.top_p for c in configs], device) if any(c.top_p < 1 for c in configs) else None,
            greedy=torch.tensor(greedy, device=device) if any(greedy) else None,
            k_max=max(top_k),
        )


def draw_uniforms(config: GenerationConfig | Sequence[GenerationConfig], batch: int, steps: int,
                  device=None) -> torch.Tensor:  # fmt: skip
    """The uniforms of a batch's draws, ``[B, steps]`` float64 on ``device``: row b's at step n from the counter (n,
    stream) under its seed's key (:func:`~evalsuite.generation.philox.uniforms`). One config for every row: its seed,
    stream b (the rows draw apart); one config per row: each row's own seed, stream 0 (a row's draws depend on its
    seed alone)."""
    configs = per_row(config, batch)
    stream = torch.arange(batch, device=device)
    if not isinstance(config, GenerationConfig):
        stream = torch.zeros_like(stream)
    return uniforms(seed_keys([c.seed for c in configs], device), stream, steps)


class TokenChooser:
    """The next token of every row of one batch from a step's logits: the rows' :class:`LogitRules`, then the
    argmax for greedy rows or :func:`sample_next`'s draw, on the device without a host sync. Called once per
    position, in order, at most the longest ``max_new_tokens`` times: it counts the tokens it chose (the penalties,
    ``min_tokens`` and the draws' step counter read the counts).

    ``config``: one for every row or one per row; ``prompts`` ``[B, T]``, ``start``, ``vocab``, ``eos``, ``device``
    as :class:`LogitRules` takes them. ``plain``: every row greedy without rules, the choice the bare argmax.
    """

    def __init__(self, config: GenerationConfig | Sequence[GenerationConfig], prompts: torch.Tensor,
                 start: torch.Tensor | None, vocab: int, eos: int | None, device: torch.device):  # fmt: skip
        B = prompts.shape[0]
        self.configs = per_row(config, B)
        self.rules = LogitRules(self.configs, prompts, start, vocab, eos, device)
        self.greedy = all(c.temperature == 0 for c in self.configs)
        self.plain = self.greedy and not self.rules.active
        if not self.greedy:
            self.rows = SamplerRows.of(self.configs, device)
            self.uniforms = draw_uniforms(config, B, max(c.max_new_tokens for c in self.configs), device)

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        """logits ``[B, V]`` -> token ids ``[B]`` on the logits' device."""
        if self.plain:
            return logits.argmax(-1)
        if self.rules.active:
            logits = self.rules(logits)
        if self.greedy:
            tok = logits.argmax(-1)
        else:  # the uniforms at the step counter: an index on the device, not a Python int
            tok = sample_next(logits, self.rows, self.uniforms.index_select(1, self.rules.made.view(1))[:, 0])
        self.rules.update(tok)
        return tok


def sample_next(logits: torch.Tensor, rows: SamplerRows, u: torch.Tensor) -> torch.Tensor:
    """logits ``[B, V]`` (the logit rules applied), the batch's :class:`SamplerRows` and one uniform per row ``u
    [B]`` float64 -> token ids ``[B]`` on the logits' device: the argmax in greedy rows; in the others temperature,
    min_p, top_k then top_p (:func:`filtered_probs`) and :func:`inverse_cdf`'s draw. Tensor ops alone, no value read
    on the host: it runs on the device without a sync, and inside a CUDA graph's capture."""
    drawn = inverse_cdf(filtered_probs(logits.float(), rows), u)
    return drawn if rows.greedy is None else torch.where(rows.greedy, logits.argmax(-1), drawn)


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """probs ``[S, V]`` (unnormalised, >= 0) and uniforms ``u [S]`` in [0, 1) float64 -> token ids ``[S]``: per row
    the first token whose cumulative probability passes ``u`` times the row's total (float64 sums; a zero
    probability is never taken). One uniform per row, rather than one per vocabulary entry (``torch.multinomial``,
    Gumbel-max), keeps a call's uniforms ``[B, steps]`` small enough to make all at once."""
    cdf = probs.double().cumsum(-1)
    total = cdf[:, -1:].contiguous()
    chosen = torch.searchsorted(cdf, u[:, None] * total, right=True)
    last = torch.searchsorted(cdf, total)  # the last token of nonzero probability: u * total rounding up to total
    return torch.minimum(chosen, last)[:, 0]


def filtered_probs(logits: torch.Tensor, rows: SamplerRows) -> torch.Tensor:
    """float32 logits ``[B, V]`` -> probabilities ``[B, V]`` after each row's temperature, min_p, top_k and top_p
    (:class:`SamplerRows`; renormalised after the min_p and top_k cuts, not after top_p's, which :func:`inverse_cdf`
    needs not; a row without a cut is left bit for bit as it was). The top-p sort is stable, so tied probabilities
    are cut in the same order on every device."""
    probs = torch.softmax(logits / rows.temperature, dim=-1)
    if rows.min_p is not None:
        kept = probs * (probs >= rows.min_p * probs.max(-1, keepdim=True).values)
        probs = torch.where(rows.min_p > 0, kept / kept.sum(-1, keepdim=True), probs)
    if rows.top_k is not None:
        k = min(rows.k_max, probs.shape[-1])
        kth = probs.topk(k, dim=-1).values.gather(-1, rows.top_k.clamp(1, k) - 1)
        kept = probs * (probs >= kth)  # ties with the k-th likeliest stay
        probs = torch.where(rows.top_k > 0, kept / kept.sum(-1, keepdim=True), probs)
    if rows.top_p is not None:
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        sorted_p = sorted_p * (sorted_p.cumsum(-1) - sorted_p < rows.top_p)  # the smallest prefix reaching top_p
        probs = torch.where(rows.top_p < 1, torch.zeros_like(probs).scatter(-1, order, sorted_p), probs)
    return probs
