"""Forgetting Attention in plain PyTorch: the reference twin of the Triton kernel.

Forgetting Attention (FoX paper, eq. 4-6) is causal softmax attention with a decay bias:

    o_i = sum_{j<=i} exp(s_ij) v_j / sum_{j<=i} exp(s_ij),   s_ij = q_i.k_j * scale + c_i - c_j

where ``c = cumsum(log f)`` over time (float32). Without a forget gate (``cum=None``) it is plain
causal attention, which the Transformer baselines use.

Layout everywhere: ``[B, T, H, D]`` for q/k/v and ``[B, T, H]`` for the cumulative log-forget.
Queries are the *last* ``Tq`` positions of the ``Tk`` keys (``Tq <= Tk``): a full forward pass has
``Tq == Tk``; cached decoding has a few queries against the whole cache.

Two functions:
* :func:`attention_blocked` never builds a ``Tq x Tk`` matrix: it walks query blocks and only the
  keys each block can see, so memory is ``O(block * Tk)``. This is what models use on CPU.
* :func:`attention_dense` is the obviously-correct textbook form (full matrix), for tests.
"""

from __future__ import annotations

import math

import torch

# Elements of one query-block score tile (B * H * block * keys). 2**24 fp32 = 64 MiB.
TILE_BUDGET = 2**24


def _check_shapes(q, k, v, cum_q, cum_k, key_start):
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4:
        raise ValueError(f"expected q, k, v as [B, T, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    B, Tq, H, D = q.shape
    if k.shape[0] != B or k.shape[2] != H or k.shape[3] != D or k.shape[1] < Tq:
        raise ValueError(f"k/v shape {tuple(k.shape)} does not fit q shape {tuple(q.shape)}")
    if (cum_q is None) != (cum_k is None):
        raise ValueError("give both cum_q and cum_k, or neither")
    if cum_q is not None and (cum_q.shape != (B, Tq, H) or cum_k.shape != (B, k.shape[1], H)):
        raise ValueError(f"cum_q/cum_k must be [B, Tq, H]/[B, Tk, H]; got {tuple(cum_q.shape)}/{tuple(cum_k.shape)}")
    if key_start is not None and key_start.shape != (B,):
        raise ValueError(f"key_start must be [B]; got {tuple(key_start.shape)}")


def _compute_dtype(q):
    """float32 arithmetic for half inputs (as the kernel accumulates), float64 for float64 inputs."""
    return torch.promote_types(q.dtype, torch.float32)


def _scores(q, k, cum_q, cum_k, q_pos, k_pos, key_start, scale):
    """Masked logits for one tile. q: [B, tq, H, D], k: [B, tk, H, D] -> [B, H, tq, tk] (fp32 or fp64)."""
    dt = _compute_dtype(q)
    s = torch.einsum("bqhd,bkhd->bhqk", q.to(dt), k.to(dt)) * scale
    if cum_q is not None:
        # c_i - c_j in full precision before adding: |c| grows with T, the difference stays small
        s = s + (cum_q.to(dt).permute(0, 2, 1)[..., :, None] - cum_k.to(dt).permute(0, 2, 1)[..., None, :])
    mask = k_pos[None, :] > q_pos[:, None]  # [tq, tk], True = hidden (future key)
    mask = mask[None, None]
    if key_start is not None:  # left padding: keys before key_start[b] are not part of sequence b
        mask = mask | (k_pos[None, None, None, :] < key_start[:, None, None, None])
    return s.masked_fill(mask, float("-inf"))


def attention_dense(q, k, v, cum_q=None, cum_k=None, *, scale=None, key_start=None):
    """Textbook Forgetting Attention with the full ``[B, H, Tq, Tk]`` matrix (tests only).

    Args:
        q: ``[B, Tq, H, D]``; k, v: ``[B, Tk, H, D]``.
        cum_q, cum_k: ``[B, Tq, H]``, ``[B, Tk, H]`` cumulative log forget gates, or None (no gate).
        scale: logit scale, default ``1/sqrt(D)``.
        key_start: ``[B]`` long, first valid key per sequence (left padding), or None.
    Returns:
        ``[B, Tq, H, D]`` in q's dtype.
    """
    _check_shapes(q, k, v, cum_q, cum_k, key_start)
    Tq, Tk, D = q.shape[1], k.shape[1], q.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    k_pos = torch.arange(Tk, device=q.device)
    q_pos = k_pos[Tk - Tq :]
    s = _scores(q, k, cum_q, cum_k, q_pos, k_pos, key_start, scale)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # rows with no visible key (padding) -> 0
    return torch.einsum("bhqk,bkhd->bqhd", p, v.to(p.dtype)).to(q.dtype)


def attention_blocked(q, k, v, cum_q=None, cum_k=None, *, scale=None, key_start=None, block=None):
    """Memory-efficient Forgetting Attention: exact, but never holds more than one query block's scores.

    Same arguments and result as :func:`attention_dense`. ``block`` (query rows per step) defaults to
    the largest power of two whose score tile fits :data:`TILE_BUDGET`. Each block only reads the keys it can
    see (causal), so a full pass costs about half the dense FLOPs. Differentiable through autograd.
    """
    _check_shapes(q, k, v, cum_q, cum_k, key_start)
    B, Tq, H, D = q.shape
    Tk = k.shape[1]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if block is None:
        block = 1 << max(4, int(math.log2(max(1, TILE_BUDGET // max(1, B * H * Tk)))))
    offset = Tk - Tq  # absolute position of query 0
    k_pos_all = torch.arange(Tk, device=q.device)
    out = []
    for start in range(0, Tq, block):
        stop = min(Tq, start + block)
        visible = offset + stop  # keys [0, visible) can be seen by some query in this block
        s = _scores(
            q[:, start:stop],
            k[:, :visible],
            None if cum_q is None else cum_q[:, start:stop],
            None if cum_k is None else cum_k[:, :visible],
            k_pos_all[offset + start : offset + stop],
            k_pos_all[:visible],
            key_start,
            scale,
        )
        p = torch.softmax(s, dim=-1).nan_to_num(0.0)
        out.append(torch.einsum("bhqk,bkhd->bqhd", p, v[:, :visible].to(p.dtype)))
    return torch.cat(out, dim=1).to(q.dtype)
