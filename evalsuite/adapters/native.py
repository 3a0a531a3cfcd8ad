"""Adapter for our own model families (:mod:`evalsuite.models`), built from a model card.

It talks to the model only through :class:`~evalsuite.models.base.CausalLM`: forward with a decode state,
chunked logits, ``new_state``, the attention-backend choice. Weights stay fp32; ``dtype`` bf16/fp16 runs the
forward under autocast, as the FoX evaluations do (fp32 residual stream, bf16 matmuls, fp32 log-forget).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import torch

from evalsuite.adapters.base import ModelInfo, TokenAdapter, chunk_nll
from evalsuite.adapters.registry import ADAPTERS, AdapterOptions
from evalsuite.cards import ModelCard, load_card
from evalsuite.errors import UserError
from evalsuite.generation import engine
from evalsuite.generation.engine import left_pad
from evalsuite.generation.steps import DecodeRun
from evalsuite.generation.types import SAMPLER_EXTRAS, Generation, GenerationConfig
from evalsuite.models.base import EmbeddingHeadLM
from evalsuite.models.checkpoint import checkpoint_dir, checkpoint_sha256, load_checkpoint
from evalsuite.runtime import dtype_name, resolve_device, resolve_dtype
from evalsuite.tokenizers import get_tokenizer

CHECKPOINT_TOKENIZER = "checkpoint"


def _hf_cache_snapshot(repo: str) -> Path | None:
    """The local Hugging Face hub snapshot of ``repo`` if one is on disk (no network)."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub"
    )
    root = Path(hub) / ("models--" + repo.replace("/", "--"))
    ref = root / "refs" / "main"
    if ref.is_file():
        snap = root / "snapshots" / ref.read_text().strip()
        if snap.is_dir():
            return snap
    snaps = sorted((root / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    return snaps[-1] if snaps else None


def resolve_checkpoint(card: ModelCard) -> Path | None:
    """Directory holding the card's weights; None for random init. Hub downloads only when online."""
    w = card.weights
    if w["source"] == "random":
        return None
    if "path" in w:
        path = Path(os.path.expanduser(w["path"]))
        if not path.is_absolute() and card.path is not None:
            path = card.path.parent / path
        if path.is_dir():
            return path
        if w["source"] == "own":
            raise UserError(f"model {card.name}: checkpoint directory {path} does not exist")
    repo = w.get("repo")
    if repo:
        local = _hf_cache_snapshot(repo)
        if local is not None:
            return local
        if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True"):
            from huggingface_hub import snapshot_download

            try:
                return Path(snapshot_download(repo, allow_patterns=["*.json", "*.safetensors", "*.bin"]))
            except Exception as e:  # noqa: BLE001 - any hub failure means "not available here"
                why = (str(e).strip().splitlines() or [""])[0]  # the hub's messages run over several lines
                failed = f" and the download of {repo} failed ({type(e).__name__}: {why})"
                raise _not_local(card, repo, failed) from None
    raise _not_local(card, repo)


def _not_local(card: ModelCard, repo: str | None, why: str = "") -> UserError:
    return UserError(
        f"model {card.name}: weights not found locally{why}; pass --checkpoint DIR "
        f"(e.g. a download of {repo or 'the release'}) or set weights.path in the card"
    )


class NativeAdapter(TokenAdapter):
    """One of our models, from its card (random init, our checkpoint, or a registered released layout)."""

    sampler_extras = frozenset(SAMPLER_EXTRAS)  # the decode engine applies them all, on every path
    per_row_configs = True

    def __init__(
        self,
        card: ModelCard,
        *,
        device: str = "auto",
        dtype: str = "float32",
        checkpoint: Path | None = None,
        attention_backend: str = "auto",
        decode_path: str = "auto",
        compile: bool = False,
    ):
        if decode_path not in engine.PATHS:
            raise UserError(f"unknown decode path {decode_path!r}; choose from {', '.join(engine.PATHS)}")
        self.card = card
        self.decode_path = decode_path  # evalsuite.generation.engine.PATHS: auto, eager, static, graph or compiled
        self.sync_every = engine.SYNC_EVERY
        self.step_timer: engine.StepTimer | None = None  # set by benchmarks: times the next generate call by phase
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        ckpt = checkpoint_dir(checkpoint) if checkpoint is not None else resolve_checkpoint(card)
        if card.tokenizer == CHECKPOINT_TOKENIZER:  # a release's own tokenizer.json, beside its weights
            if ckpt is None:
                raise UserError(f"model {card.name}: tokenizer 'checkpoint' needs weights from a checkpoint directory")
            self.tokenizer = get_tokenizer(f"hf:{ckpt}")
        else:
            self.tokenizer = get_tokenizer(card.tokenizer)
        if ckpt is None:
            self.model = card.build_module()
            self.model.init_weights(card.weights.get("seed", 0))
            self.layout, weights_id = "random", f"random-init-seed-{card.weights.get('seed', 0)}"
        else:
            self.model, self.layout = load_checkpoint(ckpt)
            weights_id = checkpoint_sha256(ckpt)
        self.checkpoint = ckpt
        self.info = ModelInfo(
            name=card.name,
            weights_id=weights_id,
            tokenizer=self.tokenizer.spec,
            dtype=dtype_name(self.dtype),
            train_length=card.train_length,
            max_length=card.max_length,
        )
        if self.model.vocab_size < self.tokenizer.vocab_size:
            raise UserError(
                f"model {card.name}: vocab size {self.model.vocab_size} is smaller than tokenizer "
                f"{card.tokenizer}'s {self.tokenizer.vocab_size}"
            )
        self.model.set_attention_backend(attention_backend, self.device)
        self.model.to(self.device).eval()
        if self.dtype != torch.float32:
            # Autocast would cast every linear weight to bf16/fp16 on every call (a copy and a launch per
            # layer per decoded token); casting the linear layers once gives the same numbers. Embeddings,
            # norms and the fp32 residual stream stay as autocast leaves them.
            for module in self.model.modules():
                if isinstance(module, torch.nn.Linear):
                    module.to(self.dtype)
            if isinstance(self.model, EmbeddingHeadLM):
                self.model.cast_head(self.dtype)
        # Full-sequence forwards (token scoring: loss windows, log-likelihoods) through torch.compile: it fuses the
        # norms, gates and casts between the GEMMs and attention kernels (a 64K window of the 760M FoX (Pro) on an
        # H200: 1.24 s eager, 0.99 s compiled; results/loss-window/), at a compile of ~40 s per new shape. Decoding
        # has its own paths.
        self.compile = compile
        self._sequence_model = torch.compile(self.model) if compile else self.model
        # ... and the loss of each logits chunk: one fused reduction over the bf16 logits instead of a float32 copy, a
        # log-softmax and a gather (24.7 to 8.0 ms of that window)
        self._chunk_nll = torch.compile(chunk_nll, dynamic=False) if compile else chunk_nll

    def _autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.model.vocab_size):
            raise UserError(
                f"token ids must lie in [0, {self.model.vocab_size}) for model {self.name}; "
                f"got {int(ids.min())}..{int(ids.max())}"
            )

    def chunked_logits(self, input_ids: torch.Tensor):
        self.check_length(input_ids.shape[1])
        self._check_ids(input_ids)
        with self._autocast():
            hidden = self._sequence_model(input_ids.to(self.device))
            yield from self.model.chunked_logits(hidden)

    def chunk_nll(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self._chunk_nll(logits, targets)

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The checked prompts as left-padded ids ``[B, T]`` and ``start`` (padded keys are masked through it)."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UserError("generate needs non-empty prompts")
        self.check_length(max(len(p) for p in prompts))
        ids, start = left_pad(prompts)
        self._check_ids(ids)
        return ids, start

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], config: GenerationConfig | list[GenerationConfig]) -> list[Generation]:
        """Prefill once, then decode through :mod:`evalsuite.generation.engine` (path ``self.decode_path``: a CUDA graph
        per step where the family offers a static decoder, else the eager step; outputs equal either way).
        ``config``: one for every prompt, or one per prompt (:func:`~evalsuite.generation.engine.generate`)."""
        ids, start = self._left_padded(prompts)
        with self._autocast():
            return engine.generate(self.model, ids, start, config, self.tokenizer, path=self.decode_path,
                                   sync_every=self.sync_every, timer=self.step_timer)  # fmt: skip

    def decode_run(self, prompts: list[list[int]], config: GenerationConfig | list[GenerationConfig]) -> DecodeRun:
        """The prompts (token ids) as a :class:`~evalsuite.generation.steps.DecodeRun` under ``config`` (one for
        every prompt, or one per prompt, as :meth:`generate` takes it), decoded on this adapter's path and under its
        autocast: one step at a time, for a caller that schedules between steps (``evalsuite serve``); its tokens
        are :meth:`generate`'s."""
        ids, start = self._left_padded(prompts)
        return DecodeRun(self.model, ids, start, config, self.tokenizer.eos_id, path=self.decode_path,
                         context=self._autocast)  # fmt: skip

    def provenance(self) -> dict:
        return {
            **super().provenance(),
            "card": self.card.to_dict(),
            "weights_layout": self.layout,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "device": str(self.device),
            "attention_backend": self.model.attention_backend,
            "decode_path": self.decode_path,
            "compile": self.compile,
        }


def native_adapter(name: str, options: AdapterOptions) -> NativeAdapter:
    """The ``native`` kind: ``--model fox-pro``, ``native:fox-pro`` or a card's YAML path."""
    return NativeAdapter(
        load_card(name),
        device=options.device,
        dtype=options.dtype,
        checkpoint=options.checkpoint,
        attention_backend=options.attention,
        compile=options.compile,
    )


ADAPTERS.register("native", native_adapter)
