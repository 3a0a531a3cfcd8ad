"""Forgetting Transformer and the Transformer baselines (FoX paper, arXiv:2503.02130, §2-3 and Appendix A/D).

One readable module covers the four architectures of the paper, as the official code does
(Transformer (Pro) *is* the FoX model without a forget gate and with RoPE):

=====================  ===========  ======  ====================================================
card architecture      forget gate  RoPE    Pro extras (QK-norm, output gate+norm, KV-shift)
=====================  ===========  ======  ====================================================
FoX (LLaMA)            "full"       no      no
FoX (Pro)              "full"       no      yes
Transformer (LLaMA)    "none"       θ=5e5   no
Transformer (Pro)      "none"       θ=5e5   yes
=====================  ===========  ======  ====================================================

Block (pre-norm): ``h = x + Attn(RMSNorm(x)); y = h + SwiGLU(RMSNorm(h))``; final RMSNorm; untied head (or tied:
``tie_word_embeddings``).
Attention per head: ``o_i = softmax_j(q_i.k_j/sqrt(d) + c_i - c_j) v_j`` with ``c = cumsum(log f)`` and
``f_t = sigmoid(w_f.x_t + b_f)`` (``fgate_type="full"``), ``sigmoid(b)`` (``"bias_only"``, learnable, or
``"fixed"``, a buffer: ALiBi-equivalent), or no gate (``"none"``).

Tensor layout: activations ``[B, T, D]``; heads ``[B, T, H, hd]``; log-forget ``[B, T, H]`` (float32).
Left padding is supported through ``start`` (``[B]`` long): tokens before ``start[b]`` are padding.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.errors import UserError
from evalsuite.kernels.forgetting import BACKENDS, append_and_attend, attention, cumsum_over_time
from evalsuite.models.base import EmbeddingHeadLM, normal_init_
from evalsuite.models.fox.cache import KVCache, LayerCache
from evalsuite.models.fox.decoder import FoxStaticDecoder
from evalsuite.models.layers import HeadRMSNorm, RMSNorm, ShiftProjection, SwiGLU, rope
from evalsuite.models.packed import PackedLinears, decode_linear

FGATE_TYPES = ("full", "bias_only", "fixed", "none")
# Added to the cumulative log-forget of padding keys, so a real query weights them exp(-2^20) == 0. Not larger: the
# kernels take exp2(s * log2e - m * log2e) as one fused multiply-add, whose unrounded product differs from the rounded
# m * log2e by up to half an ulp; a real query whose first key blocks are all padding has m = s ~ -PAD_BIAS, and at
# 1e30 that half ulp is 6e21, so exp2 overflows to inf and the row's output to NaN on GPU (generate_check, 760M FoX
# (Pro), 3072 padding tokens). At 2^20 the error is below 0.13 (tests/test_forgetting_triton.py).
PAD_BIAS = 2.0**20


@dataclass
class FoxConfig:
    """Hyperparameters; names follow the paper. Defaults are the 760M FoX (Pro) of the paper."""

    vocab_size: int = 50257
    hidden_size: int = 1536
    num_layers: int = 24
    num_heads: int = 24
    hidden_ratio: float = 3.5  # SwiGLU width ratio: 4 for LLaMA blocks, 3.5 for Pro (paper footnote 2)
    intermediate_size: int | None = None  # overrides hidden_ratio when set
    use_mlp: bool = True  # False: attention-only blocks (e.g. the MQAR setups of GSA/Zoology)
    fgate_type: str = "full"  # "full" | "bias_only" | "fixed" | "none"
    # Appendix D init of the gate bias: per-head time scales log-spaced over [T_min, T_max]. For bias_only/fixed
    # gates it is the paper's init; for the full gate it initialises b_f of w_f.x + b_f (None: zero, the paper's
    # default for the full gate; the official code's fgate_bias_init option). T_min == T_max: one constant bias.
    decay_time_min: float | None = None
    decay_time_max: float | None = None
    use_rope: bool = False
    rope_base: float = 500000.0
    qk_norm: bool = True
    qk_norm_shared: bool = False  # one [hd] scale for all heads (the released checkpoints, footnote 4)
    use_output_gate: bool = True
    use_output_norm: bool = True
    use_k_shift: bool = True
    use_v_shift: bool = True
    norm_eps: float = 1e-6
    qk_norm_eps: float = 1e-5  # the official layer's constructor default, not norm_eps
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False  # True: the LM head is the input embedding (Zoology's MQAR models)

    def __post_init__(self):
        if self.fgate_type not in FGATE_TYPES:
            raise ValueError(f"fgate_type must be one of {FGATE_TYPES}, got {self.fgate_type!r}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}")
        if (self.decay_time_min is None) != (self.decay_time_max is None):
            raise ValueError("give both decay_time_min and decay_time_max, or neither")
        if self.decay_time_min is not None:
            if self.fgate_type == "none":
                raise ValueError("decay_time_min/max initialise a forget gate; this model has none (fgate_type='none')")
            if not 0 < self.decay_time_min <= self.decay_time_max:
                raise ValueError(f"need 0 < decay_time_min <= decay_time_max, got {self.decay_time_min}, "
                                 f"{self.decay_time_max}")  # fmt: skip

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_size(self) -> int:
        """SwiGLU width: int(d * ratio * 2/3) rounded up to a multiple of 256 (official rule)."""
        if self.intermediate_size is not None:
            return self.intermediate_size
        return 256 * math.ceil(int(self.hidden_size * self.hidden_ratio * 2 / 3) / 256)

    @classmethod
    def from_dict(cls, d: dict) -> FoxConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown FoX config keys: {', '.join(unknown)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)


def decay_time_bias(num_heads: int, t_min: float, t_max: float) -> torch.Tensor:
    """Appendix D init: per-head bias b with sigmoid(b)^T = 1/e, T log-spaced over [t_min, t_max].

    ``b = -log(expm1(1/T))`` since ``-log sigmoid(b) = 1/T``. Returns ``[H]`` float32.
    """
    T = torch.exp(torch.linspace(math.log(t_min), math.log(t_max), num_heads, dtype=torch.float64))
    return (-torch.log(torch.expm1(1.0 / T))).float()


class ForgettingAttention(nn.Module):
    def __init__(self, cfg: FoxConfig):
        super().__init__()
        D, H, hd = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        self.cfg = cfg
        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = ShiftProjection(D, H) if cfg.use_k_shift else nn.Linear(D, D, bias=False)
        self.v_proj = ShiftProjection(D, H) if cfg.use_v_shift else nn.Linear(D, D, bias=False)
        self.o_proj = nn.Linear(D, D, bias=False)
        if cfg.qk_norm:
            self.q_norm = HeadRMSNorm(H, hd, cfg.qk_norm_eps, cfg.qk_norm_shared)
            self.k_norm = HeadRMSNorm(H, hd, cfg.qk_norm_eps, cfg.qk_norm_shared)
        if cfg.fgate_type == "full":
            self.fgate_proj = nn.Linear(D, H, bias=True)
        elif cfg.fgate_type == "bias_only":
            self.fgate_bias = nn.Parameter(torch.zeros(H))
        elif cfg.fgate_type == "fixed":
            self.register_buffer("fgate_bias", torch.zeros(H))
        if cfg.use_output_gate:
            self.ogate_proj = nn.Linear(D, D, bias=False)
        if cfg.use_output_norm:
            self.out_norm = HeadRMSNorm(H, hd, cfg.norm_eps, shared=False)
        self.step_pack: PackedLinears | None = None

    def pack_step(self) -> None:
        """Let :meth:`step` compute every linear map of its input as one GEMM (:mod:`evalsuite.models.packed`)."""
        if self.step_pack is None:
            maps = {"q": self.q_proj}
            for name, proj in (("k", self.k_proj), ("v", self.v_proj)):
                if isinstance(proj, ShiftProjection):
                    maps[name], maps[f"{name}_shift"] = proj.linear, proj.shift
                else:
                    maps[name] = proj
            if self.cfg.fgate_type == "full":
                maps["fgate"] = self.fgate_proj
            if self.cfg.use_output_gate:
                maps["ogate"] = self.ogate_proj
            self.step_pack = PackedLinears(maps)
        self.step_pack.ensure()

    def _maps(self, x, packed: bool):
        """``lin(name, module)``: the linear map ``module`` of x, each computed on its own or, in a packed step,
        read from one GEMM over all of them."""
        if not packed:
            return lambda name, module: module(x)
        y = self.step_pack(x)
        return lambda name, module: y[name]

    def _project(self, name, proj, lin, x, prev, pad):
        if isinstance(proj, ShiftProjection):
            return proj.mix(lin(name, proj.linear), lin(f"{name}_shift", proj.shift), prev, pad)
        B, T, _ = x.shape
        return lin(name, proj).view(B, T, self.cfg.num_heads, -1), None

    def forget_gate(self) -> tuple[nn.Linear, float] | None:
        """The data-dependent forget gate as ``(projection, tau)``, ``log f = logsigmoid(projection(x)) / tau``, for
        statistics taken during training (:func:`evalsuite.tasks.mqar.cell.forget_gate_stats`); None without one."""
        return (self.fgate_proj, 1.0) if self.cfg.fgate_type == "full" else None

    def log_forget(self, x: torch.Tensor, lin=None) -> torch.Tensor | None:
        """log f_t per head, ``[B, T, H]`` float32, or None without a forget gate (``lin``: see :meth:`_maps`)."""
        if self.cfg.fgate_type == "none":
            return None
        if self.cfg.fgate_type == "full":
            # `is None`, not `lin or ...`: torch 2.11's dynamo reads a function's truth value as a data-dependent
            # branch and cuts the compiled MQAR step at every layer
            # (results/mqar/step_time/h100-library-op-2026-11-27/README.md at commit 164742b)
            lin = self._maps(x, False) if lin is None else lin
            return F.logsigmoid(lin("fgate", self.fgate_proj).float())
        B, T, _ = x.shape
        return F.logsigmoid(self.fgate_bias.float()).expand(B, T, -1)

    def _heads(self, x, positions, pad, k_prev, v_prev, lin):
        """q, k, v ``[B, T, H, hd]`` (after QK-norm and RoPE) and the last projected k/v rows of the KV-shifts
        (``[B, H, hd]``, None without a shift); k_prev/v_prev: the cached rows before x, or None."""
        cfg = self.cfg
        B, T, _ = x.shape
        q = lin("q", self.q_proj).view(B, T, cfg.num_heads, -1)
        k, k_last = self._project("k", self.k_proj, lin, x, k_prev, pad)
        v, v_last = self._project("v", self.v_proj, lin, x, v_prev, pad)
        if cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if cfg.use_rope:
            q, k = rope(q, positions, cfg.rope_base), rope(k, positions, cfg.rope_base)
        return q, k, v, k_last, v_last

    def _output(self, o, x, lin):
        """Attention output ``[B, T, H, hd]`` -> ``[B, T, D]``: output norm and gate, then o_proj."""
        if self.cfg.use_output_norm:
            o = self.out_norm(o)
        o = o.reshape(*x.shape[:2], -1)
        if self.cfg.use_output_gate:
            o = o * torch.sigmoid(lin("ogate", self.ogate_proj))
        return decode_linear(self.o_proj, o)

    def forward(self, x, positions, pad=None, cache: LayerCache | None = None, cache_len: int = 0, backend="auto"):
        """x: ``[B, T, D]`` normed input; positions: ``[B, T]``; pad: ``[B, T]`` bool or None."""
        cfg = self.cfg
        B, T, _ = x.shape
        cached = cache is not None and cache_len > 0
        lin = self._maps(x, packed=False)
        q, k, v, k_last, v_last = self._heads(
            x, positions, pad, cache.k_prev if cached else None, cache.v_prev if cached else None, lin
        )

        log_f = self.log_forget(x, lin)
        if pad is not None:
            # Left padding is folded into the decay bias, so every backend handles it unchanged: padded
            # keys get +PAD_BIAS, which makes c_i - c_j hugely negative (weight exactly 0) for real queries.
            log_f = torch.zeros(B, T, cfg.num_heads, device=x.device) if log_f is None else log_f
            log_f = log_f.masked_fill(pad[..., None], 0.0)
        cum = None
        if log_f is not None:
            cum = cumsum_over_time(log_f)
            if cache is not None and cache_len:
                cum = cum + cache.cum[:, cache_len - 1 : cache_len]
            if pad is not None:
                cum = cum + PAD_BIAS * pad[..., None]

        if cache is not None:  # write this step into the cache, attend over everything cached so far
            end = cache_len + T
            cache.k[:, cache_len:end] = k
            cache.v[:, cache_len:end] = v
            if cum is not None:
                cache.cum[:, cache_len:end] = cum
            cache.k_prev, cache.v_prev = k_last, v_last
            k_all, v_all = cache.k[:, :end], cache.v[:, :end]
            cum_all = None if cum is None else cache.cum[:, :end]
        else:
            k_all, v_all, cum_all = k, v, cum
        o = attention(q, k_all, v_all, cum, cum_all, backend=backend)
        return self._output(o, x, lin)

    def step(self, x, positions, cache: LayerCache, length: torch.Tensor, start, backend="auto"):
        """One new token per sequence, appended at ``length`` (``[1]`` long on the device: positions cached
        before it) to a cache filled by :meth:`forward`. x: ``[B, 1, D]`` normed input; positions: ``[B, 1]``.
        Fixed shapes, in-place cache writes and a cache length read on the device: CUDA-graph safe with the
        Triton backend (:func:`~evalsuite.kernels.forgetting.append_and_attend`: its decode kernel appends the new
        row too). The same function as :meth:`forward` with the cache (the tests compare them). After
        :meth:`pack_step`, the linear maps of x are one GEMM."""
        lin = self._maps(x, packed=self.step_pack is not None)
        q, k, v, k_last, v_last = self._heads(x, positions, None, cache.k_prev, cache.v_prev, lin)
        # cache.cum: gated, or ungated with left padding (the cache carries the padding bias; log f is None then)
        log_f = None if cache.cum is None else self.log_forget(x, lin)
        shift = tuple((last, row) for row, last in ((cache.k_prev, k_last), (cache.v_prev, v_last)) if last is not None)
        o = append_and_attend(q, k, v, log_f, cache.k, cache.v, cache.cum, length, key_start=start, copy_rows=shift,
                              backend=backend)  # fmt: skip
        return self._output(o, x, lin)


class Block(nn.Module):
    def __init__(self, cfg: FoxConfig):
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.attn = ForgettingAttention(cfg)
        if cfg.use_mlp:
            self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
            self.mlp = SwiGLU(cfg.hidden_size, cfg.mlp_size)

    def forward(self, h, positions, pad, cache, cache_len, backend):
        h = h + self.attn(self.attn_norm(h), positions, pad, cache, cache_len, backend)
        return self._mlp(h)

    def step(self, h, positions, cache, length, start, backend):
        """:meth:`ForgettingAttention.step` in the block (graph-safe decoding)."""
        return self._mlp(h + self.attn.step(self.attn_norm(h), positions, cache, length, start, backend), step=True)

    def pack_step(self) -> None:
        """Stack the weights of the linear maps :meth:`step` applies to one input (one GEMM each)."""
        self.attn.pack_step()
        if hasattr(self, "mlp"):
            self.mlp.pack_step()

    def _mlp(self, h, step: bool = False):
        """The MLP sub-layer (none in attention-only blocks); ``step``: its decode-step form (stacked gate/up)."""
        if not hasattr(self, "mlp"):
            return h
        return h + (self.mlp.step if step else self.mlp)(self.mlp_norm(h))


class ForgettingTransformer(EmbeddingHeadLM):
    """Decoder-only LM. ``forward`` returns final hidden states; ``logits`` applies the LM head (untied, as the
    paper's; tied to the embedding with ``tie_word_embeddings``).

    Keeping the head separate lets callers compute the loss in chunks, so a 64K x 50K logit matrix is
    never built.
    """

    # A 32K prompt of the 760M shapes holds ~7 GB of prefill activations in one pass, more than its bf16 KV cache
    # (4.8 GB): 8K-token passes let a batch of 8 such prompts fit an 80 GB GPU.
    prefill_chunk = 8192

    backends = BACKENDS  # "auto" (Triton on CUDA, blocked reference on CPU), "triton", "reference", "dense"
    reference_backend = "dense"  # the textbook full-matrix softmax (kernels/forgetting/reference.py)

    def __init__(self, cfg: FoxConfig):
        super().__init__()
        self.cfg = self.config = cfg
        self._init_embedding_and_head(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)

    def set_attention_backend(self, backend: str, device: torch.device | str | None = None) -> None:
        """As the base class's; ``"sdpa"`` (plain softmax attention) only for a model without a forget gate."""
        if backend == "sdpa" and self.cfg.fgate_type != "none":
            raise UserError(f"attention backend 'sdpa' has no forget gate; this model's is {self.cfg.fgate_type!r}")
        super().set_attention_backend(backend, device)

    def available_backends(self, device: torch.device) -> tuple[str, ...]:
        """As the base class's, without ``"sdpa"`` for a model with a forget gate."""
        gated = self.cfg.fgate_type != "none"
        return tuple(b for b in super().available_backends(device) if not (gated and b == "sdpa"))

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """HF-LLaMA init used by the paper: N(0, 0.02^2) for linear/embedding weights, zero biases, unit
        norms; Appendix D decay-time biases for the gate when ``decay_time_min/max`` are set (any gate type).
        Seeded, no global RNG touched."""
        gen = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith("bias"):
                p.zero_()
            else:
                normal_init_(p, self.cfg.initializer_range, gen)
        if self.cfg.decay_time_min is not None:
            bias = decay_time_bias(self.cfg.num_heads, self.cfg.decay_time_min, self.cfg.decay_time_max)
            for block in self.blocks:
                attn = block.attn
                (attn.fgate_proj.bias if self.cfg.fgate_type == "full" else attn.fgate_bias).copy_(bias)

    def new_state(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> KVCache:
        return KVCache(self.cfg, batch, capacity, self.embed.weight.device, self.state_dtype(), start)

    def static_decoder(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> FoxStaticDecoder:
        return FoxStaticDecoder(self, batch, capacity, start)

    def pack_step(self) -> None:
        """Stack each block's step weights (:mod:`evalsuite.models.packed`); the static decoder calls this."""
        for block in self.blocks:
            block.pack_step()

    def forward(self, input_ids: torch.Tensor, state: KVCache | None = None, start: torch.Tensor | None = None):
        """input_ids: ``[B, T]`` -> hidden ``[B, T, D]`` after the final norm.

        With a state (KV cache), the tokens continue the cached sequence and are appended to it. ``start``
        (``[B]``) marks left padding for an uncached call; a cache carries its own.
        """
        cache = state
        B, T = input_ids.shape
        cache_len = 0 if cache is None else cache.length
        if cache is not None:
            if cache_len + T > cache.capacity:
                raise ValueError(f"cache capacity {cache.capacity} exceeded ({cache_len} + {T})")
            start = cache.start
            positions = cache.positions(B, T, input_ids.device)
        else:
            positions = torch.arange(T, device=input_ids.device)[None].expand(B, T)
            if start is not None:
                positions = (positions - start[:, None]).clamp(min=0)
        pad = None
        if start is not None:
            absolute = torch.arange(cache_len, cache_len + T, device=input_ids.device)
            pad = absolute[None, :] < start[:, None]
        h = self.embed(input_ids)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            h = block(h, positions, pad, layer_cache, cache_len, self.attention_backend)
        if cache is not None:
            cache.length += T
        return self.norm(h)

    def decode_state_size(self, length: int, dtype: torch.dtype) -> dict:
        """What a :class:`KVCache` holds per sequence after ``length`` tokens (attention has no fixed state:
        ``kind="kv-cache"``): per layer k and v ``[length, D]`` in ``dtype``, the float32 cumulative log-forget
        ``[length, H]`` of gated layers, and the one projected row each KV-shift keeps."""
        cfg = self.cfg
        item = torch.empty((), dtype=dtype).element_size()
        kv = 2 * length * cfg.hidden_size
        shift = cfg.hidden_size * (int(cfg.use_k_shift) + int(cfg.use_v_shift))
        cum = length * cfg.num_heads if cfg.fgate_type != "none" else 0
        return {
            "kind": "kv-cache",
            "elements": cfg.num_layers * (kv + shift + cum),
            "bytes": cfg.num_layers * ((kv + shift) * item + cum * 4),
            "dtype": str(dtype).removeprefix("torch."),
        }
