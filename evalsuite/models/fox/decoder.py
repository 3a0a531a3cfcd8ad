"""The FoX family's static decoder: the KV cache of :class:`~evalsuite.models.fox.cache.KVCache`,
preallocated for the whole generation, with its filled length kept on the device, so the one-token step has fixed
shapes and one captured CUDA graph replays it at every position.

The step is :meth:`ForgettingAttention.step` in every block: one launch of the Triton decode kernel writes the new
row's k, v and cumulative log forget at the device length and attends over the cache up to it
(:func:`~evalsuite.kernels.forgetting.append_and_attend`; ``index_copy_`` and the reference elsewhere). Prefill is
the ordinary forward pass with the cache (the training kernels over the prompt), in passes of ``prefill_chunk``
tokens.
"""

from __future__ import annotations

import torch

from evalsuite.kernels.forgetting import cached_attention_graph_safe
from evalsuite.models.base import DeviceStepDecoder


class FoxStaticDecoder(DeviceStepDecoder):
    """Static decoding for a :class:`~evalsuite.models.fox.model.ForgettingTransformer` (any of its four
    architectures). ``length`` (``[1]`` long, on the model's device) counts the cached positions."""

    def __init__(self, model, batch: int, capacity: int, start: torch.Tensor | None = None):
        self.model = model
        model.pack_step()  # one GEMM per input for the step's small matrix products (evalsuite/models/packed.py)
        self.state = model.new_state(batch, capacity, start)
        device = model.embed.weight.device
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.graph_safe = cached_attention_graph_safe(self.state.layers[0].k, model.attention_backend)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.prefill(input_ids, self.state)
        self.length.fill_(self.state.length)
        for layer in self.state.layers:  # own the KV-shift rows (views into the prefill's activations) for step()
            layer.k_prev = None if layer.k_prev is None else layer.k_prev.clone()
            layer.v_prev = None if layer.v_prev is None else layer.v_prev.clone()
        return hidden

    def _step_on_device(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The step without host-side state: what a CUDA graph replays (and ``torch.compile`` may fuse)."""
        model, state = self.model, self.state
        B = input_ids.shape[0]
        positions = self.length.expand(B)[:, None]  # absolute positions counted from each sequence's start
        if state.start is not None:
            positions = (positions - state.start[:, None]).clamp(min=0)
        h = model.embed(input_ids)
        for block, cache in zip(model.blocks, state.layers, strict=True):
            h = block.step(h, positions, cache, self.length, state.start, model.attention_backend)
        self.length += 1
        return model.norm(h)[:, -1]
