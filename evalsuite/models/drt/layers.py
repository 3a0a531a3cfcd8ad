"""DRT's building blocks (Hu et al., arXiv:2410.01651, §3.1 and §4.1.2): the decoder's causal sliding-window
self-attention with ALiBi, the lower and upper decoder layers (an upper layer adds Grouped Cross-Attention), and the
bidirectional chunk encoder.

Module and tensor names follow the authors' released code, so its state dicts map one to one
(:mod:`evalsuite.models.drt.released`). Tensor layout: activations ``[B, T, D]``; heads ``[B, T, H, hd]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.kernels.grouped_cross import grouped_cross_attention
from evalsuite.models.layers import RMSNorm, SwiGLU, rope


def drt_alibi_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes ``2^(-8 (h + 1) / H)`` for h < H, float32 ``[H]`` (for every H, also when it is not a power of two:
    the released code's formula, not ALiBi's interleaved one)."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / num_heads) for h in range(num_heads)], dtype=torch.float32)


def window_bias(q_pos: torch.Tensor, k_pos: torch.Tensor, slopes: torch.Tensor, window: int) -> torch.Tensor:
    """Additive attention bias ``[H, Tq, Tk]``: ``-m_h (i - j)`` where ``0 <= i - j <= window``, ``-inf`` elsewhere
    (i, j: positions of query and key)."""
    dist = q_pos[:, None] - k_pos[None, :]
    bias = -slopes[:, None, None] * dist.to(slopes.dtype)
    return bias.masked_fill(~((dist >= 0) & (dist <= window)), float("-inf"))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def sliding_window_attention(q, k, v, slopes, window: int, block: int | None = None) -> torch.Tensor:
    """Causal sliding-window attention with ALiBi, without a ``T x T`` buffer.

    q ``[B, Tq, H, hd]`` are the queries of the last ``Tq`` of the ``Tk`` key positions; k, v ``[B, Tk, H, hd]``
    (the first ``Tk - Tq`` rows: cached past positions). A query at position i attends to the keys at positions
    ``i - window .. i`` (``window + 1`` positions, itself included: flash-attn's ``window_size=(window, 0)``, as the
    released code calls it) with the bias ``-m_h (i - j)`` (``slopes`` ``[H]``), scale ``1/sqrt(hd)``.

    Queries go in blocks of ``block`` (default ``max(window, 128)``), each against at most ``block + window`` keys
    (keys ``[block_start - window, block_end)``), through ``scaled_dot_product_attention`` with an additive mask.
    Scores, bias and softmax run in float32 (float64 for float64 inputs), autocast off: a bf16 bias would round
    ALiBi's distances. Returns ``[B, Tq, H, hd]`` in q's dtype.

    The work and memory per token do not grow with T: a whole sequence (no past, ``window <= block``) goes through
    :func:`_blocks_at_once`; otherwise :func:`_blocks_in_turn`.
    """
    Tq, Tk = q.shape[1], k.shape[1]
    block = block or max(window, 128)
    compute = _compute_dtype(q)
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf = (t.to(compute) for t in (q, k, v))
        m = slopes.to(device=q.device, dtype=compute)
        if Tk == Tq and window <= block < Tq:
            out = _blocks_at_once(qf, kf, vf, m, window, block)
        else:
            out = _blocks_in_turn(qf, kf, vf, m, window, block)
    return out.to(q.dtype)


def _blocks_at_once(q, k, v, m, window: int, block: int) -> torch.Tensor:
    """:func:`sliding_window_attention` of a whole sequence (no past keys, ``window <= block < T``) in two SDPA
    calls: the first query block against its own keys, then every later block, folded into the batch, against the
    block before it and its own (``2 block`` keys, one ``[H, block, 2 block]`` mask for all). One call per layer
    whatever T, where a call per block would shrink the work of each as T grows at a fixed number of tokens.
    ``[B, T, H, hd]`` in the compute dtype, in and out. The sequence is padded to whole blocks: a padded key lies
    after every real query (masked as the future), a padded query's row is dropped."""
    B, T, H, hd = q.shape
    n = -(-T // block)
    q, k, v = (F.pad(t, (0, 0, 0, 0, 0, n * block - T)).view(B, n, block, H, hd) for t in (q, k, v))
    q_first, q_rest = q.split([1, n - 1], 1)
    pos = torch.arange(2 * block, device=q.device)
    first_mask = window_bias(pos[:block], pos[:block], m, window)
    first = F.scaled_dot_product_attention(*(t[:, 0].transpose(1, 2) for t in (q_first, k[:, :1], v[:, :1])),
                                           attn_mask=first_mask)  # fmt: skip
    keys, values = (torch.cat([t[:, :-1], t[:, 1:]], 2).transpose(2, 3).flatten(0, 1) for t in (k, v))
    rest = F.scaled_dot_product_attention(q_rest.transpose(2, 3).flatten(0, 1), keys, values,
                                          attn_mask=window_bias(pos[block:], pos, m, window))  # fmt: skip
    out = torch.cat([first.transpose(1, 2), rest.view(B, n - 1, H, block, hd).transpose(2, 3).flatten(1, 2)], 1)
    return out[:, :T]


def _blocks_in_turn(q, k, v, m, window: int, block: int) -> torch.Tensor:
    """:func:`sliding_window_attention` one query block at a time (past keys, or blocks shorter than the window).
    ``[B, Tq, H, hd]`` / ``[B, Tk, H, hd]`` in the compute dtype, in and out. A block's queries, keys and values are
    pieces of one ``split`` (a slice of the whole tensor per block would make the backward build a whole-size
    gradient per block), and the blocks away from the sequence's ends share one mask (saved once for the
    backward)."""
    Tq, Tk = q.shape[1], k.shape[1]
    past = Tk - Tq
    qf, kf, vf = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, T, hd]
    starts = [0, *range(past, Tk, block)] if past else list(range(0, Tk, block))  # key pieces' first rows
    sizes = [b - a for a, b in zip(starts, [*starts[1:], Tk], strict=True)]
    k_pieces, v_pieces = kf.split(sizes, 2), vf.split(sizes, 2)
    shared, outs = None, []  # shared: the mask of a full block whose keys start `window` rows before its queries
    for s, q_block in zip(range(0, Tq, block), qf.split(block, 2), strict=True):
        e = s + q_block.shape[2]
        lo = max(0, past + s - window)
        q_pos = torch.arange(past + s, past + e, device=q.device)
        k_pos = torch.arange(lo, past + e, device=q.device)
        if past + s - window >= 0 and e - s == block:
            shared = window_bias(q_pos, k_pos, m, window) if shared is None else shared
            mask = shared
        else:
            mask = window_bias(q_pos, k_pos, m, window)
        keys = _rows(k_pieces, starts, lo, past + e)
        values = _rows(v_pieces, starts, lo, past + e)
        outs.append(F.scaled_dot_product_attention(q_block, keys, values, attn_mask=mask))
    return torch.cat(outs, 2).transpose(1, 2)


def _rows(pieces, starts: list[int], lo: int, hi: int) -> torch.Tensor:
    """Rows ``[lo, hi)`` along dim 2 of the tensor split into ``pieces`` at ``starts``: the overlapping pieces, each
    sliced only where it is cut (a slice's backward is the size of its piece), concatenated."""
    parts = []
    for piece, a in zip(pieces, starts, strict=True):
        b = a + piece.shape[2]
        if b <= lo or a >= hi:
            continue
        cut = piece if (a >= lo and b <= hi) else piece[:, :, max(lo, a) - a : min(hi, b) - a]
        parts.append(cut)
    return parts[0] if len(parts) == 1 else torch.cat(parts, 2)


def ring_window_attention(q, k, v, ring: WindowRing, slopes) -> torch.Tensor:
    """:func:`sliding_window_attention` of one new position over the ring of cached keys of a static decoder
    (graph-safe: fixed shapes, positions on the device).

    q, k, v ``[B, 1, H, hd]``: the new position's (at ``ring.position``); the keys are the ring's (at the positions
    ``ring.slot_pos``; empty slots lie far outside the window) and k itself. Same ALiBi bias, window and float32
    softmax; the keys come in ring order, not by position (the sum is the same up to rounding). Returns
    ``[B, 1, H, hd]`` in q's dtype."""
    compute = _compute_dtype(q)
    with torch.autocast(q.device.type, enabled=False):
        keys = torch.cat([ring.k, k], 1).to(compute).transpose(1, 2)  # [B, H, W + 1, hd]
        values = torch.cat([ring.v, v], 1).to(compute).transpose(1, 2)
        k_pos = torch.cat([ring.slot_pos, ring.position])
        mask = window_bias(ring.position, k_pos, slopes.to(device=q.device, dtype=compute), ring.window)
        o = F.scaled_dot_product_attention(q.to(compute).transpose(1, 2), keys, values, attn_mask=mask)
    return o.transpose(1, 2).to(q.dtype)


@dataclass
class WindowRing:
    """One layer's keys and values of the last ``window`` positions in a static decoder: ``k, v [B, W, H, hd]``,
    position p in slot ``p % W``. ``slot_pos [W]`` (the position in each slot; :data:`EMPTY_SLOT` if none) and
    ``position [1]`` (the next position) are long tensors shared by every layer's ring and advanced by the
    decoder after each step."""

    k: torch.Tensor
    v: torch.Tensor
    slot_pos: torch.Tensor
    position: torch.Tensor
    window: int

    def write(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Put the new position's ``k, v [B, 1, H, hd]`` in its slot (the one of the position ``window`` back, which
        the next query no longer sees)."""
        slot = self.position % self.window
        self.k.index_copy_(1, slot, k.to(self.k.dtype))
        self.v.index_copy_(1, slot, v.to(self.v.dtype))


EMPTY_SLOT = -(1 << 40)  # the position of an empty ring slot: beyond every window


def sliding_window_attention_dense(q, k, v, slopes, window: int) -> torch.Tensor:
    """The textbook form of :func:`sliding_window_attention` (one ``Tq x Tk`` score matrix, explicit softmax): the
    test oracle."""
    Tq, Tk, hd = q.shape[1], k.shape[1], q.shape[-1]
    compute = _compute_dtype(q)
    qf, kf, vf = q.to(compute), k.to(compute), v.to(compute)
    pos = torch.arange(Tk, device=q.device)
    bias = window_bias(pos[Tk - Tq :], pos, slopes.to(compute), window)  # [H, Tq, Tk]
    scores = torch.einsum("bihd,bjhd->bhij", qf, kf) / hd**0.5 + bias
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(scores, -1), vf).to(q.dtype)


class WindowAttention(nn.Module):
    """The decoder's self-attention: projections, causal sliding window, ALiBi. ``m`` is a persistent buffer holding
    the slopes, as in the released state dicts (loaded with them, reset by ``init_weights``)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, hidden_size // num_heads
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, nn.Linear(hidden_size, hidden_size, bias=False))
        self.register_buffer("m", drt_alibi_slopes(num_heads))

    def forward(self, x, cache: tuple[torch.Tensor, torch.Tensor] | None, window: int):
        """x ``[B, T, D]`` (normed); cache: keys and values of up to ``window`` earlier positions or None. Returns
        the output ``[B, T, D]`` and the keys and values of the cached plus new positions."""
        B, T, D = x.shape
        q, k, v = (p(x).view(B, T, self.num_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        if cache is not None:
            k, v = torch.cat([cache[0], k], 1), torch.cat([cache[1], v], 1)
        o = sliding_window_attention(q, k, v, self.m, window)
        return self.o_proj(o.reshape(B, T, D)), (k, v)

    def step(self, x, ring: WindowRing):
        """:meth:`forward` of one new position ``x [B, 1, D]`` over a static ring (graph-safe); writes its keys and
        values into the ring."""
        B, _, D = x.shape
        q, k, v = (p(x).view(B, 1, self.num_heads, self.head_dim) for p in (self.q_proj, self.k_proj, self.v_proj))
        o = ring_window_attention(q, k, v, ring, self.m)
        ring.write(k, v)
        return self.o_proj(o.reshape(B, 1, D))


@dataclass
class GCAPlan:
    """What one call's upper layers of a retrieval group cross-attend to: the ``Q`` query chunks the call's positions
    touch (the first may have started in an earlier call, ``phase`` positions before), each with its retrieved chunks'
    keys and values ``k, v [B, Q, K, S, H, hd]`` and fusion weights ``w [B, Q, K]`` (float32; 0 for an empty slot)."""

    k: torch.Tensor
    v: torch.Tensor
    w: torch.Tensor
    phase: int
    length: int
    chunk_size: int

    def grid(self, x: torch.Tensor) -> torch.Tensor:
        """``[B, E, H, hd]`` -> ``[B, Q, Sq, H, hd]``: the call's positions laid out by chunk (padded to the chunk
        grid when they span several chunks; ``Sq = E`` when all lie in one)."""
        Q = self.w.shape[1]
        if Q == 1:
            return x[:, None]
        back = Q * self.chunk_size - self.phase - self.length
        return F.pad(x, (0, 0, 0, 0, self.phase, back)).unflatten(1, (Q, self.chunk_size))

    def ungrid(self, o: torch.Tensor) -> torch.Tensor:
        if o.shape[1] == 1:
            return o[:, 0]
        return o.flatten(1, 2)[:, self.phase : self.phase + self.length]


class GroupedCrossAttention(nn.Module):
    """GCA (§3.1 eqs. 2-3): ``o_proj(sum_k w_k Softmax_1(Q K_k^T / sqrt(hd)) V_k)`` with ``Q = q_proj(pre_norm(r))``;
    the retrieved chunks' keys and values come from the encoder (shared by all upper layers), not from this layer."""

    def __init__(self, hidden_size: int, num_heads: int, eps: float, softmax_one: bool):
        super().__init__()
        self.num_heads, self.softmax_one = num_heads, softmax_one
        self.pre_norm = RMSNorm(hidden_size, eps)
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, r: torch.Tensor, plan: GCAPlan, backend: str) -> torch.Tensor:
        B, E, D = r.shape
        q = self.q_proj(self.pre_norm(r)).view(B, E, self.num_heads, -1)
        o = grouped_cross_attention(plan.grid(q), plan.k, plan.v, plan.w, softmax_one=self.softmax_one, backend=backend)
        return self.o_proj(plan.ungrid(o).reshape(B, E, D))


class DecoderLayer(nn.Module):
    """A pre-norm Llama block with sliding-window ALiBi self-attention; with ``upper=True`` also GCA.

    Upper layers use the released code's wiring (the paper's ``Norm(H + O)`` feeds the MLP only)::

        r = h + SelfAttn(input_layernorm(h))
        out = r + MLP(post_attention_layernorm(r + GCA(r)))

    Without an MLP (``use_mlp=False``, attention-only MQAR blocks) the GCA output is added to the residual,
    ``out = r + GCA(r)``, the only way it can reach the stream.
    """

    def __init__(self, cfg, upper: bool):
        super().__init__()
        D = cfg.hidden_size
        self.input_layernorm = RMSNorm(D, cfg.rms_norm_eps)
        self.self_attn = WindowAttention(D, cfg.num_heads)
        if upper:
            self.gca = GroupedCrossAttention(D, cfg.num_heads, cfg.rms_norm_eps, cfg.softmax_one)
        if cfg.use_mlp:
            self.post_attention_layernorm = RMSNorm(D, cfg.rms_norm_eps)
            self.mlp = SwiGLU(D, cfg.intermediate_size)

    def forward(self, h, cache, window: int, plan: GCAPlan | None = None, backend: str = "auto"):
        a, kv = self.self_attn(self.input_layernorm(h), cache, window)
        return self._rest(h, a, plan, backend), kv

    def step(self, h, ring: WindowRing, plan: GCAPlan | None, backend: str):
        """:meth:`forward` of one new position over a static ring (a static decoder's step)."""
        return self._rest(h, self.self_attn.step(self.input_layernorm(h), ring), plan, backend)

    def _rest(self, h, a, plan, backend):
        """The block after its self-attention output ``a``: GCA (with a plan) and the MLP, wired as above."""
        r = h + a
        o = self.gca(r, plan, backend) if plan is not None else None
        if not hasattr(self, "mlp"):
            return r if o is None else r + o
        return r + self.mlp(self.post_attention_layernorm(r if o is None else r + o))


class EncoderLayer(nn.Module):
    """A pre-norm Llama block with bidirectional attention inside one chunk and RoPE at positions ``0..S-1`` (the
    paper's "inner-chunk positional encoding", §3.1)."""

    def __init__(self, cfg):
        super().__init__()
        D = cfg.hidden_size
        self.num_heads, self.rope_base = cfg.num_heads, cfg.rope_base
        self.input_layernorm = RMSNorm(D, cfg.encoder_norm_eps)
        self.self_attn = nn.Module()
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, name, nn.Linear(D, D, bias=False))
        if cfg.use_mlp:
            self.post_attention_layernorm = RMSNorm(D, cfg.encoder_norm_eps)
            self.mlp = SwiGLU(D, cfg.intermediate_size)

    def forward(self, x, positions):
        B, S, D = x.shape
        a = self.self_attn
        y = self.input_layernorm(x)
        q, k, v = (p(y).view(B, S, self.num_heads, -1) for p in (a.q_proj, a.k_proj, a.v_proj))
        q, k = rope(q, positions, self.rope_base), rope(k, positions, self.rope_base)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        x = x + a.o_proj(o.transpose(1, 2).reshape(B, S, D))
        return x + self.mlp(self.post_attention_layernorm(x)) if hasattr(self, "mlp") else x


class ChunkEncoder(nn.Module):
    """The bidirectional chunk encoder (§3.1): ``encoder_layers`` blocks over each chunk separately, then a norm."""

    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.encoder_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.encoder_norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x ``[N, S, D]`` (N chunks of S positions) -> ``[N, S, D]``."""
        positions = torch.arange(x.shape[1], device=x.device)[None].expand(x.shape[0], -1)
        for layer in self.layers:
            x = layer(x, positions)
        return self.norm(x)
