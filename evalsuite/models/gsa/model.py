"""Gated Slot Attention LM (GSA paper, arXiv:2409.07146, §3.3 and Fig. 2; fla's ``GSAForCausalLM`` layout).

Block (pre-norm, LLaMA-style, no positional encoding): ``h = x + GSA(RMSNorm(x)); y = h + SwiGLU(RMSNorm(h))``;
final RMSNorm; untied LM head (fla default).

GSA layer per head (eqs. 6, 8-9): ``q, k = swish(W_q x), swish(W_k x)``, ``v = silu(W_v x)``, forget gates
``alpha = sigmoid(W_alpha x)^(1/tau)`` for m slots (``log alpha = logsigmoid(.) / tau``), the two-pass slot memory of
:mod:`evalsuite.kernels.gated_slot`, then ``y = W_o RMSNorm(silu(o))`` over the merged heads. ``scale`` is the
softmax temperature over slots: 1.0 in fla's LM layer, ``1/sqrt(dk)`` in the authors' MQAR runs (their Zoology fork).

Decoding carries the fixed ``(hk [dk, m], hv [m, dv])`` float32 state per head and layer (``kind="recurrent"``):
``2 m d`` elements per layer whatever the context length (the paper's 128 L d at m = 64).
Left padding: padded tokens get ``log alpha = 0`` (no decay, no write), so they leave the state untouched.

Tensor layout: activations ``[B, T, D]``; heads ``[B, T, H, .]``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.kernels.gated_slot import BACKENDS, gated_slot_attention
from evalsuite.kernels.gated_slot import triton_available as gsa_triton_available
from evalsuite.models.base import EmbeddingHeadLM, RecurrentState, RecurrentStaticDecoder, normal_init_
from evalsuite.models.layers import RMSNorm, SwiGLU, rms_norm
from evalsuite.models.packed import PackedLinears, decode_linear, step_uses_pack

FEATURE_MAPS = ("swish", "relu", "identity")


@dataclass
class GSAConfig:
    """Hyperparameters; names follow fla's ``GSAConfig``. Defaults are the paper's 1.3B model (App. C)."""

    vocab_size: int = 32000
    hidden_size: int = 2048
    num_layers: int = 24
    num_heads: int = 4
    num_kv_heads: int | None = None  # grouped keys/values/gates (fla option); None: one per head
    num_slots: int = 64
    gate_logit_normalizer: float = 8.0  # tau: log alpha = logsigmoid(W_alpha x) / tau (paper footnote 2)
    scale: float | None = 1.0  # softmax temperature over slots; None: 1/sqrt(dk)
    expand_k: float = 1.0
    expand_v: float = 1.0
    feature_map: str = "swish"  # on q and k (v always gets SiLU)
    use_output_gate: bool = False  # 2024 fla option: o_proj(RMSNorm(o) * swish(g_proj(x)))
    use_norm: bool = True  # RMSNorm on the merged output
    hidden_ratio: float = 4
    intermediate_size: int | None = None
    use_mlp: bool = True  # False: mixer-only blocks (Zoology MQAR)
    norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.feature_map not in FEATURE_MAPS:
            raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {self.feature_map!r}")
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {kv}")
        for name, width in (("key", self.key_dim), ("value", self.value_dim)):
            if width % self.num_heads:
                raise ValueError(f"{name} width {width} is not divisible by num_heads {self.num_heads}")

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def key_dim(self) -> int:
        return int(self.hidden_size * self.expand_k)

    @property
    def value_dim(self) -> int:
        return int(self.hidden_size * self.expand_v)

    @property
    def head_k_dim(self) -> int:
        return self.key_dim // self.num_heads

    @property
    def head_v_dim(self) -> int:
        return self.value_dim // self.num_heads

    @property
    def mlp_size(self) -> int:
        """SwiGLU width: int(d * ratio * 2/3) rounded up to a multiple of 256 (fla's rule: 5632 at d = 2048)."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        return 256 * math.ceil(int(self.hidden_size * self.hidden_ratio * 2 / 3) / 256)

    def to_dict(self) -> dict:
        return asdict(self)


def _feature(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "swish":
        return F.silu(x)
    return F.relu(x) if kind == "relu" else x


class GatedSlotAttention(nn.Module):
    def __init__(self, cfg: GSAConfig):
        super().__init__()
        D, kv = cfg.hidden_size, cfg.kv_heads
        self.cfg = cfg
        self.q_proj = nn.Linear(D, cfg.key_dim, bias=False)
        self.k_proj = nn.Linear(D, kv * cfg.head_k_dim, bias=False)
        self.v_proj = nn.Linear(D, kv * cfg.head_v_dim, bias=False)
        self.f_proj = nn.Linear(D, kv * cfg.num_slots, bias=False)
        if cfg.use_output_gate:
            self.g_proj = nn.Linear(D, cfg.value_dim, bias=False)
        if cfg.use_norm:
            self.g_norm = RMSNorm(D, cfg.norm_eps)  # sized by hidden_size, as in fla (``g_norm`` in fla's layer)
        self.o_proj = nn.Linear(cfg.value_dim, D, bias=False)
        self.step_pack: PackedLinears | None = None

    def pack_step(self) -> None:
        """Let a decode step compute q, k, v, the slot gates and the output gate as one GEMM
        (:mod:`evalsuite.models.packed`)."""
        if self.step_pack is None:
            maps = {"q": self.q_proj, "k": self.k_proj, "v": self.v_proj, "f": self.f_proj}
            if self.cfg.use_output_gate:
                maps["g"] = self.g_proj
            self.step_pack = PackedLinears(maps)
        self.step_pack.ensure()

    def forget_gate(self) -> tuple[nn.Linear, float]:
        """The slot gates as ``(projection, tau)``: ``log alpha = logsigmoid(projection(x)) / tau`` (as FoX's
        ``forget_gate``, for :func:`evalsuite.tasks.mqar.cell.forget_gate_stats`)."""
        return self.f_proj, self.cfg.gate_logit_normalizer

    def forward(self, x, pad=None, state=None, backend="auto"):
        """x: ``[B, T, D]`` normed input; pad: ``[B, T]`` bool or None; state: this layer's ``(hk, hv)`` or None.
        Returns the output ``[B, T, D]`` and the new state (None without one)."""
        cfg = self.cfg
        B, T, _ = x.shape
        H, group = cfg.num_heads, cfg.num_heads // cfg.kv_heads
        if step_uses_pack(self.step_pack, x):
            maps = self.step_pack(x)
        else:
            names = ("q", "k", "v", "f") + (("g",) if cfg.use_output_gate else ())
            maps = {name: getattr(self, f"{name}_proj")(x) for name in names}
        q = _feature(maps["q"], cfg.feature_map).view(B, T, H, -1)
        k = _feature(maps["k"], cfg.feature_map).view(B, T, cfg.kv_heads, -1)
        v = F.silu(maps["v"]).view(B, T, cfg.kv_heads, -1)
        log_alpha = F.logsigmoid(maps["f"].float()).view(B, T, cfg.kv_heads, -1) / cfg.gate_logit_normalizer
        if group > 1:
            k, v, log_alpha = (t.repeat_interleave(group, dim=2) for t in (k, v, log_alpha))
        if pad is not None:
            log_alpha = log_alpha.masked_fill(pad[:, :, None, None], 0.0)  # alpha = 1, write 0: state untouched
        scale = cfg.scale if cfg.scale is not None else cfg.head_k_dim**-0.5
        o, new_state = gated_slot_attention(
            q,
            k,
            v,
            log_alpha,
            scale=scale,
            initial_state=state,
            output_final_state=state is not None,
            backend=backend,
        )
        o = o.reshape(B, T, -1)
        if cfg.use_output_gate:
            o = rms_norm(o, self.g_norm.weight, cfg.norm_eps) * F.silu(maps["g"])
        else:
            o = F.silu(o)
            if cfg.use_norm:
                o = self.g_norm(o)
        return decode_linear(self.o_proj, o), new_state


class Block(nn.Module):
    def __init__(self, cfg: GSAConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = GatedSlotAttention(cfg)
        if cfg.use_mlp:
            self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.hidden_size, cfg.mlp_size)

    def forward(self, h, pad, state, backend):
        a, new_state = self.attn(self.attn_norm(h), pad, state, backend)
        h = h + a
        return (h + self.mlp.step(self.mlp_norm(h)) if hasattr(self, "mlp") else h), new_state

    def pack_step(self) -> None:
        self.attn.pack_step()
        if hasattr(self, "mlp"):
            self.mlp.pack_step()


class GSAForCausalLM(EmbeddingHeadLM):
    """Decoder-only GSA LM. ``forward`` returns final hidden states; ``logits`` applies the LM head."""

    backends = BACKENDS  # "auto" (Triton on CUDA, chunked PyTorch elsewhere), "triton", "chunked", "recurrent"
    reference_backend = "recurrent"  # the token loop of eq. 6 (kernels/gated_slot/reference.py)

    def __init__(self, cfg: GSAConfig):
        super().__init__()
        self.cfg = self.config = cfg
        self._init_embedding_and_head(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """fla's ``_init_weights``: N(0, 0.02^2) weights, unit norms, ``o_proj``/``down_proj`` divided by
        sqrt(2 L) (GPT-2 rescale). Seeded; no global RNG touched."""
        gen = torch.Generator().manual_seed(seed)
        rescale = 1.0 / math.sqrt(2 * self.cfg.num_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                std = self.cfg.initializer_range * (
                    rescale if name.endswith(("o_proj.weight", "down_proj.weight")) else 1
                )
                normal_init_(p, std, gen)

    def pack_step(self) -> None:
        """Stack each layer's linear maps of one input for decode steps (:mod:`evalsuite.models.packed`)."""
        for block in self.blocks:
            block.pack_step()

    def new_state(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> RecurrentState:
        """Zero ``(hk [B, H, dk, m], hv [B, H, m, dv])`` float32 per layer; ``capacity`` is irrelevant (the state
        does not grow)."""
        cfg, device = self.cfg, self.embed.weight.device
        H, dk, dv, m = cfg.num_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.num_slots
        zeros = [
            (torch.zeros(batch, H, dk, m, device=device), torch.zeros(batch, H, m, dv, device=device))
            for _ in range(cfg.num_layers)
        ]
        return RecurrentState(zeros, start)

    def static_decoder(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> RecurrentStaticDecoder:
        probe = torch.empty(0, device=self.embed.weight.device, dtype=self.state_dtype())
        safe = self.attention_backend in ("auto", "triton") and gsa_triton_available(probe)
        return RecurrentStaticDecoder(self, batch, start, graph_safe=safe)

    def forward(self, input_ids: torch.Tensor, state: RecurrentState | None = None, start: torch.Tensor | None = None):
        """input_ids ``[B, T]`` -> hidden ``[B, T, D]``; with a state, continue it (and update it in place)."""
        T, ids_device = input_ids.shape[1], input_ids.device
        start = state.start if state is not None else start
        pad = None
        if start is not None:
            fresh = state is None
            absolute = torch.arange(T, device=ids_device) if fresh else state.absolute_positions(T, ids_device)
            pad = absolute[None, :] < start[:, None]
        h = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            h, new = block(h, pad, None if state is None else state.layers[i], self.attention_backend)
            if state is not None:
                state.set_layer(i, new)
        if state is not None:
            state.advance(T)
        return self.norm(h)

    def decode_state_size(self, length: int, dtype: torch.dtype) -> dict:
        """The fixed float32 slot state: per layer and head ``dk m + m dv`` elements, independent of ``length``."""
        cfg = self.cfg
        per_layer = cfg.num_heads * cfg.num_slots * (cfg.head_k_dim + cfg.head_v_dim)
        elements = cfg.num_layers * per_layer
        return {"kind": "recurrent", "elements": elements, "bytes": 4 * elements, "dtype": "float32"}
