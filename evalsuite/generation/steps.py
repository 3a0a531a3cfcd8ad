"""A batch decoded one step at a time, for callers that decide between steps what runs next (the serve scheduler).

:func:`~evalsuite.generation.engine.generate` runs a whole generation in one call; :class:`DecodeRun` holds the
same decoder (the path :func:`~evalsuite.generation.engine.generate` would take) between calls instead: the prompt is
filled in passes of at most ``budget`` tokens (:meth:`DecodeRun.prefill`), then :meth:`DecodeRun.next_tokens` chooses
each row's next token under the row's own config -- with ``generate``'s own
:class:`~evalsuite.generation.sampling.TokenChooser`, so the tokens equal ``generate``'s -- and each
:meth:`DecodeRun.step` feeds one token per row and returns the next logits. How a row ends is the caller's to decide,
with :class:`~evalsuite.generation.finish.Finisher` as ``generate`` does.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence

import torch

from evalsuite.generation.engine import CudaGraphStep, EagerStepDecoder, _decoder
from evalsuite.generation.sampling import TokenChooser, per_row
from evalsuite.generation.types import GenerationConfig


class DecodeRun:
    """Left-padded prompts ``ids [B, T]`` (``start [B]`` or None) decoded by ``model`` into a state with room for
    the longest ``max_new_tokens`` of ``config`` (one for every row, or one per row, as ``generate`` takes it;
    ``eos``: the tokenizer's EOS id, masked under ``min_tokens``). ``context``: a context manager factory every model
    call runs under (the adapter's autocast).

    Use: :meth:`prefill` until it returns True, then :attr:`logits` ``[B, V]`` predict the first new token;
    :meth:`next_tokens` chooses it for every row, ``step(tokens [B])`` appends one token per row and returns the
    next ``[B, V]``; :meth:`next_tokens` again, and so on.
    """

    def __init__(self, model, ids: torch.Tensor, start: torch.Tensor | None,
                 config: GenerationConfig | Sequence[GenerationConfig], eos: int | None, *, path: str = "auto",
                 context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):  # fmt: skip
        self.model, self.context = model, context
        device = model.input_embedding.weight.device
        self.ids = ids.to(device)
        start = None if start is None else start.to(device)  # the state masks padding on the model's device
        B, T = ids.shape
        capacity = T + max(c.max_new_tokens for c in per_row(config, B))
        with self._calls():
            self.decoder, self.path = _decoder(model, path, device, B, capacity, start)
            self.chooser = TokenChooser(config, self.ids, start, model.vocab_size, eos, device)
        # a graph step returns the logits it leaves in its static buffer: the chooser, outside the graph, reads them
        self._graph = CudaGraphStep(model, self.decoder, choose=None) if self.path in ("graph", "compiled") else None
        # The first pass reaches every row's first real token: a pass that is all padding for some row is not one
        # the families' forward continues exactly from.
        self.min_first = 1 if start is None else int(start.max()) + 1
        self.filled = 0
        self.logits: torch.Tensor | None = None

    def _calls(self):
        stack = contextlib.ExitStack()
        stack.enter_context(torch.inference_mode())
        stack.enter_context(self.context())
        return stack

    @property
    def prefilled(self) -> bool:
        return self.logits is not None

    def prefill(self, budget: int | None = None) -> bool:
        """Fill the next ``budget`` prompt tokens (None: all) -> whether the prompt is in. The eager decoder takes the
        prompt in passes (each continuing the state, as ``CausalLM.prefill`` does); a static decoder in one."""
        T = self.ids.shape[1]
        with self._calls():
            if not isinstance(self.decoder, EagerStepDecoder) or budget is None or budget >= T - self.filled:
                if self.filled == 0:
                    hidden = self.decoder.prefill(self.ids)
                else:  # the rest of a prompt begun in passes
                    hidden = self.model(self.ids[:, self.filled :], state=self.decoder.state)[:, -1]
                self.filled = T
                self.logits = self.model.logits(hidden)
                return True
            chunk = min(budget, self.model.prefill_chunk or budget)
            if self.filled == 0:
                chunk = max(chunk, self.min_first)
            if chunk >= T - self.filled:
                return self.prefill(None)
            self.model(self.ids[:, self.filled : self.filled + chunk], state=self.decoder.state)
            self.filled += chunk
            return False

    def next_tokens(self) -> torch.Tensor:
        """The next token of every row, ``[B]`` long on the model's device, chosen from :attr:`logits` under each
        row's config (its logit rules, argmax or seeded draw); once per position, before :meth:`step`."""
        if not self.prefilled:
            raise RuntimeError("next_tokens before the prompt is prefilled")
        with self._calls():
            return self.chooser(self.logits)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens [B]`` (long, any device) -> the logits ``[B, V]`` of the next position."""
        if not self.prefilled:
            raise RuntimeError("step before the prompt is prefilled")
        tokens = tokens.to(self.ids.device)
        with self._calls():
            if self._graph is not None:
                self.logits = self._graph(tokens)
            else:
                self.logits = self.model.logits(self.decoder.step(tokens[:, None]))
        return self.logits
