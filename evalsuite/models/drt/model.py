"""DRT: the Differentiable Retrieval-based Transformer with Grouped Cross-Attention (Hu et al., arXiv:2410.01651,
§3.1-3.2), as the authors' released code runs it.

* **Landmarks are internal.** ``forward(ids [B, T])`` inserts the landmark token ``landmark_id`` after every
  ``chunk_size - 1`` text tokens (a chunk is ``chunk_size`` positions: 63 tokens and a landmark in the released
  config), runs the model over the expanded sequence and returns the hidden states of the text positions only, so
  logits and every per-token loss see no landmark position. Any T works: a trailing partial chunk just has no
  landmark yet, and the result is the same as feeding the tokens one at a time. An input token equal to
  ``landmark_id`` is an ordinary token.
* **Lower layers** (the first ``lower_layers``, default half): pre-norm Llama blocks, causal sliding-window
  self-attention (a query sees the ``window`` previous positions and itself, landmarks included) with ALiBi,
  SwiGLU.
* **Chunk encoder** (§3.1): ``enc_prenorm`` of the lower output, each complete chunk (landmark included) through a
  bidirectional Llama encoder with RoPE inside the chunk, final norm. The landmark embedding ``l_k`` is its output at
  the landmark; chunk keys/values ``chunk_k_proj``/``chunk_v_proj`` of its output, shared by all upper layers; the
  landmark row is zeroed (``zero_landmark_kv``, the released 64-position chunks) or dropped (65-position chunks).
* **Retrieval** (§3.1 eq. 1; the released code's form): for group g and chunk t, query ``lmk_norms[g](h)`` at
  t's landmark, with h the output of the layer before the group (so group g sees what groups < g retrieved);
  scores ``q . l_k / sqrt(D)`` for k < t; top-``min(top_k, t)``, with Gumbel(0, 1) noise added for the choice only
  and only in training (§3.2); weights = softmax of the chosen, un-noised scores. Chunk t + 1 (its landmark
  included) uses the retrieval made at chunk t's landmark; chunks 0 and 1 get no GCA output.
* **Upper layers**: self-attention as below, then GCA over the retrieved chunks (per-chunk softmax-off-by-one,
  mixed by the weights, eqs. 2-3), wired as in the released code (:class:`~evalsuite.models.drt.layers.DecoderLayer`).
* Final norm, LM head tied to the embedding (``tie_word_embeddings``).
* **The Base LM** of the paper's Table 3 (12 sliding-window layers, otherwise DRT's shape) is ``lower_layers =
  num_layers``: no upper layer, so no landmark is inserted, no chunk is encoded or stored, nothing is retrieved.

Gradients reach the retriever (``lmk_norms``, the encoder, the lower layers) through the fusion weights: the top-k
choice is discrete, the weights are a softmax of the chosen scores.

Decoding keeps a chunk memory (:mod:`evalsuite.models.drt.memory`); the full forward is the same code run with no
memory, so both agree to rounding. Without gradients, an input longer than ``segment_length`` tokens runs in
segments through the state's memory or a temporary one (bounded activations, the same result; the released code's
``segment_len`` evaluation).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn

from evalsuite.kernels.grouped_cross import BACKENDS
from evalsuite.models.base import EmbeddingHeadLM, normal_init_
from evalsuite.models.drt.decoder import DrtStaticDecoder
from evalsuite.models.drt.layers import ChunkEncoder, DecoderLayer, GCAPlan, drt_alibi_slopes
from evalsuite.models.drt.memory import ChunkMemory, ChunkMemoryState, Retrieval, RowGroup
from evalsuite.models.layers import RMSNorm

LMK_NORM_EPS = 1e-5  # the released code builds lmk_norms with flash-attn RMSNorm's default eps, not rms_norm_eps


@dataclass
class DRTConfig:
    """Hyperparameters. Defaults: the paper's 128M DRT (12 layers, d 768, 12 heads, FFN 2048, W 512, top-8 chunks of
    64 positions; arXiv:2410.01651 §4.1.2, App. A) with the released ``config_63.json`` details (vocabulary 50265 =
    GPT-2 + pad 50257, mask 50263, landmark 50264)."""

    vocab_size: int = 50265
    landmark_id: int | None = None  # None: vocab_size - 1 (50264 at the default vocabulary: the released chunk_id)
    hidden_size: int = 768
    num_layers: int = 12
    lower_layers: int | None = None  # None: num_layers // 2 (the paper's N/2); the rest are upper layers
    # lower_layers == num_layers: every layer a window layer, no landmark, no retrieval (the paper's Base LM, Table 3)
    num_heads: int = 12
    intermediate_size: int = 2048
    use_mlp: bool = True  # False: attention-only blocks everywhere (Zoology's MQAR)
    retrieval_groups: int = 1  # G: the upper layers split evenly into G groups, each retrieving on its own
    chunk_size: int = 64  # positions per chunk: chunk_size - 1 tokens and a landmark
    top_k: int = 8
    window: int = 512  # sliding window of the self-attention, in positions (landmarks included)
    encoder_layers: int = 2
    softmax_one: bool = True
    zero_landmark_kv: bool = True  # zero the landmark's row of the chunk keys/values (False: drop it)
    rms_norm_eps: float = 1e-5
    encoder_norm_eps: float = 1e-6
    rope_base: float = 10000.0  # the chunk encoder's RoPE
    tie_word_embeddings: bool = True
    gumbel_noise: bool = True  # Gumbel top-k in training (never at evaluation)
    initializer_range: float = 0.02
    offload_chunk_memory: bool = False  # decode states keep the chunk store in CPU memory

    def __post_init__(self):
        if self.landmark_id is None:
            self.landmark_id = self.vocab_size - 1
        if self.lower_layers is None:
            self.lower_layers = self.num_layers // 2
        checks = [
            (self.vocab_size >= 2, f"vocab_size must be at least 2, got {self.vocab_size}"),
            (self.num_heads >= 1, f"num_heads must be at least 1, got {self.num_heads}"),
            (
                0 <= self.landmark_id < self.vocab_size,
                f"landmark_id {self.landmark_id} is outside the vocabulary 0..{self.vocab_size - 1}",
            ),
            (
                self.hidden_size % max(self.num_heads, 1) == 0,
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}",
            ),
            ((self.hidden_size // max(self.num_heads, 1)) % 2 == 0, "the head dim must be even (RoPE in the encoder)"),
            (self.retrieval_groups >= 1, f"retrieval_groups must be at least 1, got {self.retrieval_groups}"),
            (
                0 <= self.lower_layers <= self.num_layers,
                f"lower_layers must lie in 0..num_layers, got {self.lower_layers}",
            ),
            (
                not self.retrieves
                or (self.upper_layers >= self.retrieval_groups and self.upper_layers % self.retrieval_groups == 0),
                f"{self.upper_layers} upper layer(s) (num_layers {self.num_layers} - lower_layers {self.lower_layers}) "
                f"do not split evenly into retrieval_groups={self.retrieval_groups} non-empty groups",
            ),
            (self.chunk_size >= 2, f"chunk_size must be at least 2 (tokens + landmark), got {self.chunk_size}"),
            (self.top_k >= 1, f"top_k must be at least 1, got {self.top_k}"),
            (self.window >= 1, f"window must be at least 1, got {self.window}"),
            (self.encoder_layers >= 0, f"encoder_layers must be non-negative, got {self.encoder_layers}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def upper_layers(self) -> int:
        return self.num_layers - self.lower_layers

    @property
    def retrieves(self) -> bool:
        """Whether the model has upper layers (else it is a sliding-window LM: no landmarks, no chunk encoder)."""
        return self.upper_layers > 0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def chunk_kv_rows(self) -> int:
        """Rows of a chunk's keys/values: all positions (landmark row zeroed) or all but the landmark."""
        return self.chunk_size if self.zero_landmark_kv else self.chunk_size - 1

    def to_dict(self) -> dict:
        return asdict(self)


def _pad_slots(t: torch.Tensor, slots: int, dim: int) -> torch.Tensor:
    """Zero-pad dimension ``dim`` of ``t`` to ``slots`` entries."""
    missing = slots - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t, t.new_zeros(shape)], dim)


class _Bank:
    """The chunks one call can retrieve: the memory's stored chunks followed by the ones this call completes."""

    def __init__(self, memory: ChunkMemory | None, landmarks, k_new, v_new):
        self.memory, self.k_new, self.v_new = memory, k_new, v_new
        self.num_old = 0 if memory is None else memory.num_chunks
        old = None if memory is None else memory.landmarks
        self.landmarks = old if landmarks is None else landmarks if old is None else torch.cat([old, landmarks], 1)

    def gather(self, idx: torch.Tensor, new_reachable: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values ``[B, ..., S, H, hd]`` of the chunks at ``idx [B, ...]``; ``new_reachable``: whether any
        index may point at a chunk completed in this call."""
        n_old = self.num_old
        rows = torch.arange(idx.shape[0], device=idx.device).view(-1, *[1] * (idx.dim() - 1))
        if n_old == 0:
            return self.k_new[rows, idx], self.v_new[rows, idx]
        k, v = self.memory.store.gather(idx.clamp(max=n_old - 1), idx.device)
        if new_reachable:
            old = (idx < n_old).view(*idx.shape, 1, 1, 1)
            new = (idx - n_old).clamp(min=0)
            k = torch.where(old, k, self.k_new[rows, new])
            v = torch.where(old, v, self.v_new[rows, new])
        return k, v


class DRTForCausalLM(EmbeddingHeadLM):
    """Decoder-only DRT. ``forward`` returns the text positions' final hidden states; ``logits`` applies the tied
    head. ``attention_backend`` picks the GCA kernel: ``"triton"``, ``"reference"`` (plain PyTorch) or ``"auto"``."""

    backends = BACKENDS
    reference_backend = "reference"

    def __init__(self, cfg: DRTConfig):
        super().__init__()
        self.cfg = self.config = cfg
        self._init_embedding_and_head(cfg)
        G = cfg.retrieval_groups if cfg.retrieves else 0  # the Base LM: no group, no retrieval parts
        self.lower_layers = nn.ModuleList(DecoderLayer(cfg, upper=False) for _ in range(cfg.lower_layers))
        per_group = cfg.upper_layers // max(G, 1)
        self.upper_layers = nn.ModuleList(
            nn.ModuleList(DecoderLayer(cfg, upper=True) for _ in range(per_group)) for _ in range(G)
        )
        self.lmk_norms = nn.ModuleList(RMSNorm(cfg.hidden_size, LMK_NORM_EPS) for _ in range(G))
        if G:
            self.encoder = ChunkEncoder(cfg)
            self.enc_prenorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
            self.chunk_k_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
            self.chunk_v_proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=False)
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.gumbel_generator: torch.Generator | None = None  # None: the global RNG (like dropout)
        self.segment_length: int | None = 16384  # no-grad inputs longer than this run in segments

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """N(0, initializer_range^2) for every linear and embedding weight (the released code's HF-Llama init), unit
        norm gains, the ALiBi slopes. Seeded; no global RNG touched."""
        gen = torch.Generator().manual_seed(seed)
        for p in self.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                normal_init_(p, self.cfg.initializer_range, gen)
        for name, b in self.named_buffers():
            if name.endswith("self_attn.m"):
                b.copy_(drt_alibi_slopes(self.cfg.num_heads))

    # -- the forward pass -------------------------------------------------------------------------------------

    def forward(self, input_ids: torch.Tensor, state: ChunkMemoryState | None = None, start=None) -> torch.Tensor:
        """ids ``[B, T]`` -> hidden ``[B, T, D]`` of the text positions. With a state, continue it (its own left
        padding applies); ``start`` ``[B]`` marks left padding otherwise. Rows with different padding have different
        chunk grids and run as separate sub-batches (hidden states at padding positions are zero)."""
        if state is not None:
            T = input_ids.shape[1]
            groups = [(g.rows, min(max(g.start - state.length, 0), T), g.memory) for g in state.groups]
            state.length += T
        elif start is None:
            groups = [(None, 0, None)]
        else:
            groups = [(rows, min(s, input_ids.shape[1]), None) for rows, s in _row_groups(start)]
        if len(groups) == 1 and groups[0][0] is None and groups[0][1] == 0:
            return self._stream(input_ids, groups[0][2])
        out = None
        for rows, skip, memory in groups:
            if skip == input_ids.shape[1]:
                continue
            hid = self._stream((input_ids if rows is None else input_ids[rows])[:, skip:], memory)
            if out is None:
                out = hid.new_zeros(*input_ids.shape, hid.shape[-1])
            out[(slice(None) if rows is None else rows), skip:] = hid
        if out is None:
            out = self.embed.weight.new_zeros(*input_ids.shape, self.cfg.hidden_size)
        return out

    def _stream(self, ids: torch.Tensor, memory: ChunkMemory | None) -> torch.Tensor:
        """Text ids of rows sharing one chunk grid (continuing ``memory``, or from its start) -> hidden states."""
        B, T = ids.shape
        if T == 0:
            return self.embed.weight.new_zeros(B, 0, self.cfg.hidden_size)
        seg = self.segment_length
        if seg and T > seg and not torch.is_grad_enabled():  # a long input (or prefill): segment by segment
            memory = memory or self._memory(B, T, self.cfg.offload_chunk_memory)
            return torch.cat([self._stream(ids[:, s : s + seg], memory) for s in range(0, T, seg)], 1)
        n = self.cfg.chunk_size - 1
        before = 0 if memory is None else memory.tokens
        rel, expanded = slice(None), ids  # the Base LM: every position is a text token
        if self.cfg.retrieves:
            t = torch.arange(before, before + T, device=ids.device)
            offset, end = before + before // n, before + T + (before + T) // n
            rel = t + t // n - offset  # where the text tokens go among the call's positions; landmarks elsewhere
            expanded = ids.new_full((B, end - offset), self.cfg.landmark_id)
            expanded[:, rel] = ids
        hidden = self._run(expanded, memory)
        if memory is not None:
            memory.tokens += T
        return hidden[:, rel]

    def _run(self, ids: torch.Tensor, memory: ChunkMemory | None) -> torch.Tensor:
        """Positions ``ids [B, E]`` (text and landmarks) continuing ``memory`` (or a fresh sequence) -> final hidden
        states ``[B, E, D]``; the memory takes this call's results."""
        cfg, backend = self.cfg, self.attention_backend
        P, W = cfg.chunk_size, cfg.window
        B, E = ids.shape
        offset = 0 if memory is None else memory.positions
        c0, phase = divmod(offset, P)  # the chunk in progress and how many of its positions came before
        layers = [*self.lower_layers, *(layer for group in self.upper_layers for layer in group)]
        caches = [None] * len(layers) if memory is None else memory.window
        h = self.embed(ids)
        window_kv = []
        for i, layer in enumerate(self.lower_layers):
            h, kv = layer(h, caches[i], W)
            window_kv.append(kv)
        # The chunk encoder runs on every chunk this call completes (its start may lie in an earlier call).
        lower = h if memory is None or memory.partial is None else torch.cat([memory.partial, h], 1)
        if not cfg.retrieves:
            lower = lower[:, :0]  # the Base LM keeps no chunk
        n_new = lower.shape[1] // P
        encoded = self._encode(lower[:, : n_new * P]) if n_new else (None, None, None)
        bank = _Bank(memory, *encoded)
        landmark_pos = torch.arange(n_new, device=ids.device) * P + (P - 1 - phase)
        Q = (phase + E - 1) // P + 1  # query chunks c0 .. c0 + Q - 1
        retrievals, i = [], len(self.lower_layers)
        for g, group in enumerate(self.upper_layers):
            new = self._retrieve(g, h[:, landmark_pos], c0, bank) if n_new else None
            plan = self._plan(None if memory is None else memory.retrieval[g], new, Q, phase, E)
            for layer in group:
                h, kv = layer(h, caches[i], W, plan, backend)
                window_kv.append(kv)
                i += 1
            retrievals.append(new)
        if memory is not None:
            memory.commit(window_kv, lower[:, n_new * P :], *encoded, retrievals, E, W)
        return self.norm(h)

    def _encode(self, lower: torch.Tensor):
        """Lower outputs of ``n`` complete chunks ``[B, n P, D]`` -> landmark embeddings ``[B, n, D]`` and chunk keys
        and values ``[B, n, S, H, hd]``."""
        cfg = self.cfg
        B, P, D = lower.shape[0], cfg.chunk_size, cfg.hidden_size
        enc = self.encoder(self.enc_prenorm(lower).reshape(-1, P, D)).view(B, -1, P, D)
        k, v = self.chunk_k_proj(enc), self.chunk_v_proj(enc)
        if cfg.zero_landmark_kv:  # "equivalent to softmax + 1" in the released code's words
            keep = (torch.arange(P, device=lower.device) < P - 1)[:, None]
            k, v = k * keep, v * keep
        else:
            k, v = k[:, :, :-1], v[:, :, :-1]
        heads = (cfg.num_heads, cfg.head_dim)
        return enc[:, :, -1], k.unflatten(-1, heads), v.unflatten(-1, heads)

    def _retrieve(self, g: int, h_landmarks: torch.Tensor, c0: int, bank: _Bank) -> Retrieval:
        """Retrieval of group ``g`` at the landmarks of chunks ``c0 .. c0 + n - 1`` (hidden states ``[B, n, D]``):
        each chunk t scores chunks < t; indices, weights ``[B, n, K]`` with ``K = min(top_k, c0 + n - 1)`` slots, and
        the chosen chunks' keys/values."""
        cfg = self.cfg
        B, n, D = h_landmarks.shape
        chunk = c0 + torch.arange(n, device=h_landmarks.device)
        K = min(cfg.top_k, c0 + n - 1)
        if K <= 0:
            empty = torch.zeros(B, n, 0, device=h_landmarks.device)
            return Retrieval(empty.long(), empty, None, None)
        q = self.lmk_norms[g](h_landmarks)
        with torch.autocast(q.device.type, enabled=False):  # scores in float32: the choice must not hinge on bf16
            scores = torch.einsum("bnd,bjd->bnj", q.float(), bank.landmarks.float()) / math.sqrt(D)
        visible = torch.arange(scores.shape[-1], device=q.device)[None, :] < chunk[:, None]  # [n, N]
        scores = scores.masked_fill(~visible, float("-inf"))
        choose = scores
        if self.training and cfg.gumbel_noise:  # Gumbel top-k (§3.2): noise for the choice only
            gen = self.gumbel_generator
            choose = scores - torch.empty_like(scores).exponential_(generator=gen).log()
        idx = choose.topk(K, dim=-1).indices  # [B, n, K]; the visible chunks come first
        valid = torch.arange(K, device=q.device)[None, :] < chunk[:, None]  # [n, K]
        logits = scores.gather(-1, idx).masked_fill(~valid, float("-inf"))
        logits = torch.where(valid.any(-1, keepdim=True), logits, 0.0)  # a chunk with nothing visible: no NaN
        weights = torch.softmax(logits, -1) * valid
        idx = idx.masked_fill(~valid, 0)
        k, v = bank.gather(idx, new_reachable=n >= 2)
        return Retrieval(idx, weights, k, v)

    def _plan(self, prev: Retrieval | None, new: Retrieval | None, Q: int, phase: int, E: int) -> GCAPlan | None:
        """What the call's ``Q`` query chunks cross-attend to: the first uses the memory's current retrieval
        (``prev``), chunk c0 + j (j >= 1) the retrieval at landmark c0 + j - 1 (``new``). None: nothing to attend."""
        used = None if new is None or Q == 1 else new
        K = max(0 if prev is None else prev.slots, 0 if used is None else used.slots)
        if K == 0:
            return None
        cfg = self.cfg
        B = (prev or used).indices.shape[0]
        like = (prev if prev is not None and prev.k is not None else used).k
        if prev is None or prev.k is None:
            k0 = like.new_zeros(B, 1, K, *like.shape[-3:])
            v0, w0 = k0, like.new_zeros(B, 1, K, dtype=torch.float32)
        else:
            k0, v0 = _pad_slots(prev.k, K, 1)[:, None], _pad_slots(prev.v, K, 1)[:, None]
            w0 = _pad_slots(prev.weights, K, 1)[:, None]
        if used is None:
            k, v, w = k0, v0, w0
        else:
            k = torch.cat([k0, _pad_slots(used.k[:, : Q - 1], K, 2)], 1)
            v = torch.cat([v0, _pad_slots(used.v[:, : Q - 1], K, 2)], 1)
            w = torch.cat([w0, _pad_slots(used.weights[:, : Q - 1], K, 2)], 1)
        return GCAPlan(k, v, w, phase, E, cfg.chunk_size)

    # -- decoding ---------------------------------------------------------------------------------------------

    def _memory(self, batch: int, capacity: int, offload: bool) -> ChunkMemory:
        chunks = -(-max(capacity, 1) // (self.cfg.chunk_size - 1))
        return ChunkMemory(batch, self.cfg.num_layers, len(self.upper_layers), chunks, offload)

    def new_state(self, batch: int, capacity: int, start=None, offload: bool | None = None) -> ChunkMemoryState:
        """An empty chunk memory for ``batch`` sequences of up to ``capacity`` tokens (the chunk store is preallocated
        for them and grows beyond). ``offload`` (default: the config's ``offload_chunk_memory``) keeps the chunk
        store in CPU memory. Rows with different ``start`` (left padding) get separate memories."""
        offload = self.cfg.offload_chunk_memory if offload is None else offload
        if start is None:
            groups = [RowGroup(None, 0, self._memory(batch, capacity, offload))]
        else:
            groups = [
                RowGroup(rows, s, self._memory(len(rows), capacity - s, offload)) for rows, s in _row_groups(start)
            ]
        return ChunkMemoryState(groups, batch, start, offload)

    def static_decoder(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> DrtStaticDecoder:
        return DrtStaticDecoder(self, batch, capacity, start)

    def decode_state_size(self, length: int, dtype: torch.dtype) -> dict:
        """What a :class:`ChunkMemoryState` holds per sequence after ``length`` tokens (``E = length + N`` positions,
        ``N = length // (chunk_size - 1)`` chunks): per layer the window's keys and values (``min(E, window)``
        positions), the unfinished chunk's lower outputs (``E mod chunk_size`` positions), the store's keys and
        values (``N`` chunks), the landmark embeddings, and per group the current retrieval (``min(top_k, N - 1)``
        chunks' keys and values, int64 indices, float32 weights). Keys and values are in ``dtype``; hidden states
        (unfinished chunk, landmarks) in the weights' dtype (the residual stream's, also under autocast)."""
        cfg = self.cfg
        D, S = cfg.hidden_size, cfg.chunk_kv_rows
        N = length // (cfg.chunk_size - 1) if cfg.retrieves else 0
        E = length + N
        K = min(cfg.top_k, N - 1) if N >= 1 else 0
        kv = 2 * cfg.num_layers * min(E, cfg.window) * D + 2 * N * S * D + cfg.retrieval_groups * 2 * K * S * D
        hidden = ((E % cfg.chunk_size) if cfg.retrieves else 0) * D + N * D
        small = cfg.retrieval_groups * K  # indices (int64) and weights (float32)
        item = torch.empty((), dtype=dtype).element_size()
        hidden_item = self.embed.weight.element_size()
        return {
            "kind": ChunkMemoryState.kind,
            "elements": kv + hidden + 2 * small,
            "bytes": kv * item + hidden * hidden_item + small * (8 + 4),
            "dtype": str(dtype).removeprefix("torch."),
        }


def _row_groups(start: torch.Tensor) -> list[tuple[torch.Tensor | None, int]]:
    """Rows grouped by left padding: ``[(rows, start)]``; a batch with one padding is one group (rows None)."""
    values = start.tolist()
    if len(set(values)) == 1:
        return [(None, int(values[0]))]
    return [(torch.tensor([b for b, s in enumerate(values) if s == v], device=start.device), v)
            for v in sorted(set(values))]  # fmt: skip


__all__ = ["DRTConfig", "DRTForCausalLM"]
