"""Layers shared by the model families: RMSNorm variants, rotary embeddings, SwiGLU, the KV-shift projection.

Tensor layout: activations ``[B, T, D]``; heads ``[B, T, H, hd]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.models.packed import PackedLinears, decode_linear, step_uses_pack


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32, returned in x's dtype."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


class HeadRMSNorm(nn.Module):
    """RMSNorm applied to each head separately on ``[..., H, hd]``; scale shared ([hd]) or per head ([H*hd])."""

    def __init__(self, num_heads: int, head_dim: int, eps: float, shared: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(head_dim if shared else num_heads * head_dim))
        self.num_heads, self.head_dim, self.eps = num_heads, head_dim, eps

    def forward(self, x):  # x: [..., H, hd]
        return rms_norm(x, self.weight.view(-1, self.head_dim), self.eps)


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotary embedding (RoFormer, arXiv:2104.09864), GPT-NeoX "rotate half" pairing, full head dim.

    x: ``[B, T, H, hd]``; positions: ``[B, T]`` absolute positions.
    """
    hd = x.shape[-1]
    inv_freq = base ** (-torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    angles = positions.float()[..., None] * inv_freq  # [B, T, hd/2]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, :, None, :].to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, :, None, :].to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))`` (Shazeer, arXiv:2002.05202)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, hidden, bias=False)
        self.up_proj = nn.Linear(d, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, d, bias=False)
        self.step_pack: PackedLinears | None = None

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    def pack_step(self) -> None:
        """Let :meth:`step` compute gate and up as one GEMM (:mod:`evalsuite.models.packed`)."""
        if self.step_pack is None:
            self.step_pack = PackedLinears({"gate": self.gate_proj, "up": self.up_proj})
        self.step_pack.ensure()

    def step(self, x):
        """:meth:`forward` for a decode step, with gate and up stacked once :meth:`pack_step` ran."""
        if not step_uses_pack(self.step_pack, x):
            return self(x)
        y = self.step_pack(x)
        return decode_linear(self.down_proj, F.silu(y["gate"]) * y["up"])


class ShiftProjection(nn.Module):
    """KV-shift (FoX paper, arXiv:2503.02130, eq. 14): ``out_t = a_t * W x_{t-1} + (1 - a_t) * W x_t`` with
    ``a_t = sigmoid(w_h . x_t)``.

    One mixing coefficient per head and token; the previous row of the first token is zero (or the cached row
    during decoding). Returns ``[B, T, H, hd]`` and the last projected row ``[B, H, hd]``.
    """

    def __init__(self, d: int, num_heads: int):
        super().__init__()
        self.linear = nn.Linear(d, d, bias=False)
        self.shift = nn.Linear(d, num_heads, bias=False)
        self.num_heads = num_heads

    def forward(self, x, prev: torch.Tensor | None, pad: torch.Tensor | None):
        return self.mix(self.linear(x), self.shift(x), prev, pad)

    def mix(self, projected, shift_logits, prev: torch.Tensor | None, pad: torch.Tensor | None):
        """:meth:`forward` from ``linear(x)`` ``[B, T, D]`` and ``shift(x)`` ``[B, T, H]`` (computed elsewhere,
        e.g. stacked with other maps of x in a decode step)."""
        B, T, _ = projected.shape
        out = projected.view(B, T, self.num_heads, -1)
        if pad is not None:  # padding rows must not leak into the first real token
            out = out.masked_fill(pad[:, :, None, None], 0.0)
        alpha = torch.sigmoid(shift_logits.float())[..., None]  # [B, T, H, 1]
        first = torch.zeros_like(out[:, :1]) if prev is None else prev[:, None].to(out.dtype)
        previous = torch.cat([first, out[:, :-1]], dim=1)
        mixed = alpha * previous.float() + (1 - alpha) * out.float()
        return mixed.to(out.dtype), out[:, -1]
