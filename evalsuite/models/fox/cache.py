"""The FoX family's decoding state: every layer's preallocated KV cache (and cumulative log forget), the shared
filled length and the left-padding starts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalsuite.models.base import DecodeState


@dataclass
class LayerCache:
    """Decoding state of one attention layer, preallocated for ``capacity`` positions.

    k, v: ``[B, capacity, H, hd]`` (k after QK-norm and RoPE); cum: ``[B, capacity, H]`` float32
    cumulative log-forget; k_prev/v_prev: ``[B, H, hd]`` last projected rows for the KV-shift.
    """

    k: torch.Tensor
    v: torch.Tensor
    cum: torch.Tensor | None
    k_prev: torch.Tensor | None = None
    v_prev: torch.Tensor | None = None


class KVCache(DecodeState):
    """All layers' caches plus the shared length and left-padding starts (``kind="kv-cache"``); ``config`` is the
    model's :class:`~evalsuite.models.fox.model.FoxConfig`."""

    kind = "kv-cache"

    def __init__(self, config, batch: int, capacity: int, device, dtype, start=None):
        H, hd = config.num_heads, config.head_dim
        gated = config.fgate_type != "none" or start is not None  # padding needs a decay bias
        self.layers = [
            LayerCache(
                k=torch.empty(batch, capacity, H, hd, device=device, dtype=dtype),
                v=torch.empty(batch, capacity, H, hd, device=device, dtype=dtype),
                cum=torch.empty(batch, capacity, H, device=device, dtype=torch.float32) if gated else None,
            )
            for _ in range(config.num_layers)
        ]
        self.capacity = capacity
        self.length = 0
        self.start = start  # [B] long or None

    def positions(self, batch: int, new: int, device) -> torch.Tensor:
        """Absolute positions ``[B, new]`` of the next ``new`` tokens, counted from each sequence's start."""
        pos = torch.arange(self.length, self.length + new, device=device)[None].expand(batch, new)
        if self.start is not None:
            pos = (pos - self.start[:, None]).clamp(min=0)
        return pos

    def nbytes(self) -> int:
        """Filled rows of k, v and the cumulative log-forget, plus the KV-shift rows, over all layers."""
        total = 0
        for layer in self.layers:
            for t in (layer.k, layer.v, layer.cum):
                if t is not None:
                    total += t[:, : self.length].numel() * t.element_size()
            for t in (layer.k_prev, layer.v_prev):
                if t is not None:
                    total += t.numel() * t.element_size()
        return total
