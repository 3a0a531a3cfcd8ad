"""TransNormerLLM (TNL) with Lightning Attention (arXiv:2405.17381, §4 and App. E; the released HF modeling code).

Block (pre-norm): ``h = x + GLA(SRMSNorm(x)); y = h + SGLU(SRMSNorm(h))``; embeddings scaled by sqrt(D) unless
``no_scale_embedding``; final SRMSNorm; LM head tied to the embedding (the released code leaves
``tie_word_embeddings`` unset: HF's default, tied).

* SRMSNorm (eq. 14): ``x / sqrt(mean(x^2) + eps)``, no learnable gain (no norm in TNL has parameters).
* Token mixer (eq. 11, "GLA" in the Flash/Hua sense): ``q, k, v, u = W_qkvu x``; ``q, k = act(q), act(k)``
  (SiLU); optional LRPE on q and k; ``o = lightning(q, k, v)`` with a fixed per-head decay and no softmax or
  normaliser; ``y = W_out (SRMSNorm(o) * u)`` (``u`` ungated by any activation; ``use_output_gate=False`` drops it,
  the Table 5 ablation).
* Channel mixer SGLU (eq. 12): ``l3(l1(x) * l2(x))``, no activation.
* LRPE (eq. 9; "Mix" = first layer only): ``q, k -> [x cos(theta n), x sin(theta n)]``, doubling the head dim of
  q and k; ``theta [H, 1, hd]`` is a parameter initialised to ``10000^(-2 i / E)`` over the flattened width.
* Decay ``lambda = exp(-slope)`` per head and layer; two schedules (eq. 10 and the released code differ):
  ``"code"`` (default, what the released checkpoints use): ALiBi slopes ``2^(-8 h / H)`` times
  ``1 - l / (L - 1) + 1e-5``; ``"paper"``: eq. 10 read literally, ``slope = (8 h / H) (1 - l / L)``.

Decoding carries one float32 ``kv [B, H, dk, dv]`` per layer (``kind="recurrent"``), constant in context length.
Left padding: ``k`` and ``v`` are zeroed at padded positions (the HF code zeroes ``v``), and LRPE positions count
from each row's first real token, so a padded row decodes as if unpadded.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.kernels.lightning import BACKENDS, lightning_attention
from evalsuite.kernels.lightning import triton_available as lightning_triton_available
from evalsuite.models.base import EmbeddingHeadLM, RecurrentState, RecurrentStaticDecoder, normal_init_
from evalsuite.models.layers import rms_norm
from evalsuite.models.packed import PackedLinears, decode_linear, step_uses_pack

DECAY_SCHEDULES = ("code", "paper")
ACTIVATIONS = ("silu", "none")


@dataclass
class TNLConfig:
    """Hyperparameters. Defaults are TransNormerLLM-385M's (the class defaults of the released code)."""

    vocab_size: int = 64000
    hidden_size: int = 1024  # decoder_embed_dim
    num_layers: int = 24
    num_heads: int = 8
    attention_dim: int | None = None  # hidden_dim of the released code (q/k/v/u width); None: hidden_size
    glu_dim: int = 2816
    use_mlp: bool = True  # False: token-mixer-only blocks (Zoology MQAR)
    lrpe_layers: list[int] = field(default_factory=lambda: [0])  # "Mix": LRPE-d in the first layer only
    decay_schedule: str = "code"
    activation: str = "silu"  # on q and k (linear_act_fun)
    use_output_gate: bool = True
    no_scale_embedding: bool = False
    norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02

    def __post_init__(self):
        if self.decay_schedule not in DECAY_SCHEDULES:
            raise ValueError(f"decay_schedule must be one of {DECAY_SCHEDULES}, got {self.decay_schedule!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.inner_dim % self.num_heads:
            raise ValueError(f"attention width {self.inner_dim} is not divisible by num_heads {self.num_heads}")
        bad = [i for i in self.lrpe_layers if not 0 <= i < self.num_layers]
        if bad:
            raise ValueError(f"lrpe_layers {bad} are outside 0..{self.num_layers - 1}")
        self.lrpe_layers = sorted(set(self.lrpe_layers))

    @property
    def inner_dim(self) -> int:
        return self.attention_dim or self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.inner_dim // self.num_heads

    def to_dict(self) -> dict:
        return asdict(self)


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi's per-head slopes (Press et al., arXiv:2108.12409): ``2^(-8 i / n)`` for n a power of two, else the
    closest power's slopes interleaved with every other slope of twice that power."""

    def power_of_two(n):
        return [2 ** (-8 * (i + 1) / n) for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def decay_slopes(cfg: TNLConfig, layer: int) -> torch.Tensor:
    """``slope [H]`` float32 of ``layer`` (decay ``exp(-slope)``) under ``cfg.decay_schedule``."""
    H, L = cfg.num_heads, cfg.num_layers
    if cfg.decay_schedule == "paper":
        return torch.tensor([8 * (h + 1) / H * (1 - layer / L) for h in range(H)], dtype=torch.float32)
    factor = 1 - layer / (L - 1) + 1e-5 if L > 1 else 1 + 1e-5
    return torch.tensor(alibi_slopes(H), dtype=torch.float32) * factor


def lrpe_theta(num_heads: int, head_dim: int) -> torch.Tensor:
    """The released code's LRPE init: ``10000^(-2 i / E)`` for i < E = H * hd, as ``[H, 1, hd]``."""
    E = num_heads * head_dim
    return (10000.0 ** (-2.0 / E * torch.arange(E, dtype=torch.float32))).view(num_heads, 1, head_dim)


class TokenMixer(nn.Module):
    def __init__(self, cfg: TNLConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        E = cfg.inner_dim
        self.qkvu_proj = nn.Linear(cfg.hidden_size, 4 * E, bias=False)
        self.out_proj = nn.Linear(E, cfg.hidden_size, bias=False)
        self.use_lrpe = layer in cfg.lrpe_layers
        if self.use_lrpe:
            self.lrpe_theta = nn.Parameter(lrpe_theta(cfg.num_heads, cfg.head_dim))
        # Not a buffer: a model cast to bf16 would round the slopes (the decay compounds over thousands of steps).
        self._slope_cpu = decay_slopes(cfg, layer)
        self._slope_by_device: dict[torch.device, torch.Tensor] = {}

    def slope(self, device) -> torch.Tensor:
        """The layer's float32 decay slopes ``[H]`` on ``device`` (copied once per device)."""
        if device not in self._slope_by_device:
            self._slope_by_device[device] = self._slope_cpu.to(device)
        return self._slope_by_device[device]

    def _lrpe(self, x, positions):
        """``[B, T, H, hd] -> [B, T, H, 2 hd]``: ``[x cos(theta n), x sin(theta n)]`` at absolute positions n."""
        angle = positions.float()[:, :, None, None] * self.lrpe_theta.float()[None, None, :, 0, :]  # [B, T, H, hd]
        xf = x.float()
        return torch.cat([xf * angle.cos(), xf * angle.sin()], dim=-1).to(x.dtype)

    def forward(self, x, positions, pad=None, state=None, backend="auto"):
        """x ``[B, T, D]`` normed input; positions ``[B, T]``; pad ``[B, T]`` bool; state ``kv`` or None."""
        cfg = self.cfg
        B, T, _ = x.shape
        q, k, v, u = decode_linear(self.qkvu_proj, x).chunk(4, dim=-1)
        q, k, v = (t.reshape(B, T, cfg.num_heads, -1) for t in (q, k, v))
        if cfg.activation == "silu":
            q, k = F.silu(q), F.silu(k)
        if self.use_lrpe:
            q, k = self._lrpe(q, positions), self._lrpe(k, positions)
        if pad is not None:
            keep = ~pad[:, :, None, None]
            k, v = k * keep, v * keep
        o, new_state = lightning_attention(
            q, k, v, self.slope(x.device), initial_state=state, output_final_state=state is not None, backend=backend
        )
        o = rms_norm(o.reshape(B, T, -1), None, cfg.norm_eps)
        if cfg.use_output_gate:
            o = o * u
        return decode_linear(self.out_proj, o), new_state


class SGLU(nn.Module):
    """``l3(l1(x) * l2(x))``: the gated channel mixer without an activation (eq. 12)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.l1 = nn.Linear(d, hidden, bias=False)
        self.l2 = nn.Linear(d, hidden, bias=False)
        self.l3 = nn.Linear(hidden, d, bias=False)
        self.step_pack: PackedLinears | None = None

    def pack_step(self) -> None:
        """Let a decode step compute l1 and l2 as one GEMM (:mod:`evalsuite.models.packed`)."""
        if self.step_pack is None:
            self.step_pack = PackedLinears({"l1": self.l1, "l2": self.l2})
        self.step_pack.ensure()

    def forward(self, x):
        if step_uses_pack(self.step_pack, x):
            y = self.step_pack(x)
            return decode_linear(self.l3, y["l1"] * y["l2"])
        return self.l3(self.l1(x) * self.l2(x))


class Block(nn.Module):
    def __init__(self, cfg: TNLConfig, layer: int):
        super().__init__()
        self.eps = cfg.norm_eps
        self.token_mixer = TokenMixer(cfg, layer)
        if cfg.use_mlp:
            self.channel_mixer = SGLU(cfg.hidden_size, cfg.glu_dim)

    def forward(self, h, positions, pad, state, backend):
        a, new_state = self.token_mixer(rms_norm(h, None, self.eps), positions, pad, state, backend)
        h = h + a
        if hasattr(self, "channel_mixer"):
            h = h + self.channel_mixer(rms_norm(h, None, self.eps))
        return h, new_state


class TransNormerLLM(EmbeddingHeadLM):
    """Decoder-only TNL. ``forward`` returns final hidden states; ``logits`` applies the (tied) LM head."""

    backends = BACKENDS  # "auto" (Triton on CUDA, chunked PyTorch elsewhere), "triton", "chunked", "recurrent"
    reference_backend = "recurrent"  # the token loop of eq. 17 (kernels/lightning/reference.py)

    def __init__(self, cfg: TNLConfig):
        super().__init__()
        self.cfg = self.config = cfg
        self._init_embedding_and_head(cfg)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.embed_scale = 1.0 if cfg.no_scale_embedding else math.sqrt(cfg.hidden_size)

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """N(0, init_std^2) for every linear and embedding weight (the released code's init); LRPE theta at its
        fixed schedule. Seeded; no global RNG touched."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("lrpe_theta"):
                p.copy_(lrpe_theta(self.cfg.num_heads, self.cfg.head_dim))
            else:
                normal_init_(p, self.cfg.initializer_range, gen)

    def pack_step(self) -> None:
        """Stack each channel mixer's l1 and l2 for decode steps (the token mixer's maps are one matrix already)."""
        for block in self.blocks:
            if hasattr(block, "channel_mixer"):
                block.channel_mixer.pack_step()

    def new_state(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> RecurrentState:
        """Zero ``kv [B, H, dk, dv]`` float32 per layer (dk doubled on LRPE layers); ``capacity`` is irrelevant (the
        state does not grow)."""
        cfg, device = self.cfg, self.embed.weight.device
        H, hd = cfg.num_heads, cfg.head_dim
        widths = [hd * (2 if i in cfg.lrpe_layers else 1) for i in range(cfg.num_layers)]
        return RecurrentState([torch.zeros(batch, H, dk, hd, device=device) for dk in widths], start)

    def static_decoder(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> RecurrentStaticDecoder:
        probe = torch.empty(0, device=self.embed.weight.device, dtype=self.state_dtype())
        safe = self.attention_backend in ("auto", "triton") and lightning_triton_available(probe)
        return RecurrentStaticDecoder(self, batch, start, graph_safe=safe)

    def forward(self, input_ids: torch.Tensor, state: RecurrentState | None = None, start: torch.Tensor | None = None):
        """input_ids ``[B, T]`` -> hidden ``[B, T, D]``; with a state, continue it (and update it in place)."""
        (B, T), ids_device = input_ids.shape, input_ids.device
        start = state.start if state is not None else start
        absolute = state.absolute_positions(T, ids_device) if state is not None else torch.arange(T, device=ids_device)
        positions = absolute[None].expand(B, T)
        pad = None
        if start is not None:
            pad = positions < start[:, None]
            positions = (positions - start[:, None]).clamp(min=0)
        h = self.embed(input_ids) * self.embed_scale
        for i, block in enumerate(self.blocks):
            h, new = block(h, positions, pad, None if state is None else state.layers[i], self.attention_backend)
            if state is not None:
                state.set_layer(i, new)
        if state is not None:
            state.advance(T)
        return rms_norm(h, None, self.cfg.norm_eps)

    def decode_state_size(self, length: int, dtype: torch.dtype) -> dict:
        """The fixed float32 ``kv`` per layer and head (``2 hd x hd`` on LRPE layers), independent of ``length``."""
        cfg = self.cfg
        hd = cfg.head_dim
        elements = sum(cfg.num_heads * hd * hd * (2 if i in cfg.lrpe_layers else 1) for i in range(cfg.num_layers))
        return {"kind": "recurrent", "elements": elements, "bytes": 4 * elements, "dtype": "float32"}
