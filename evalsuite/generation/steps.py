"""A batch decoded one step at a time, for callers that decide between steps what runs next (the serve scheduler).

:func:`~evalsuite.generation.engine.generate` runs a whole generation in one call; :class:`DecodeRun` holds the
same decoder (the path :func:`~evalsuite.generation.engine.generate` would take) between calls instead: the prompt is
filled in passes of at most ``budget`` tokens (:meth:`DecodeRun.prefill`), then each :meth:`DecodeRun.step` feeds
one token per row and returns the next logits. The caller chooses the tokens, so the sampling rules stay where they
are (:func:`~evalsuite.generation.engine.sample_next`), and the logits equal those of ``generate``'s loop step for
step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from evalsuite.generation.engine import CudaGraphStep, EagerStepDecoder, _decoder


class DecodeRun:
    """Left-padded prompts ``ids [B, T]`` (``start [B]`` or None) decoded by ``model`` into a state of ``capacity``
    positions. ``context``: a context manager factory every model call runs under (the adapter's autocast).

    Use: :meth:`prefill` until it returns True, then :attr:`logits` ``[B, V]`` predict the first new token;
    ``step(tokens [B])`` appends one token per row and returns the next ``[B, V]``.
    """

    def __init__(self, model, ids: torch.Tensor, start: torch.Tensor | None, capacity: int, *, path: str = "auto",
                 context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):  # fmt: skip
        self.model, self.context = model, context
        device = model.input_embedding.weight.device
        self.ids = ids.to(device)
        with self._calls():
            self.decoder, self.path = _decoder(model, path, device, ids.shape[0], capacity, start)
        # a graph step returns the logits it leaves in its static buffer: a sampler outside the graph reads them
        self._graph = CudaGraphStep(model, self.decoder, greedy=False) if self.path in ("graph", "compiled") else None
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
