"""Our adapters as an lm-eval model: ``EvalsuiteLM``, registered with lm-eval as ``evalsuite``.

lm-eval (EleutherAI's lm-evaluation-harness) finds a model class by name in its own registry; a class registers
when its module is imported (``@register_model``), and lm-eval discovers no outside models by itself (no entry
points for models; ``--include_path`` adds tasks only). So this module must be imported first: ``evalsuite
lm-eval`` does that, as does ``python -m evalsuite.lm_eval_main`` (lm-eval's own command line with this model
registered); from Python, import this module and pass ``model="evalsuite"`` or an ``EvalsuiteLM`` instance to
``lm_eval.simple_evaluate``.

The three request types map onto the adapter tiers (:mod:`evalsuite.adapters.base`):

* ``loglikelihood`` (context, continuation) -> (log-probability sum, is_greedy). Token tier: contexts and
  continuations are encoded as the adapter's own ``loglikelihood`` does (context with the tokenizer's BOS
  convention, continuation without BOS), scored in right-padded batches through ``chunked_logits``; is_greedy from
  the argmax. A context longer than ``max_length`` loses its oldest tokens. Text tier: the adapter's
  ``loglikelihood``, where it declares one. As lm-eval's template models do, trailing spaces of a context move to
  the start of its continuation (a word-boundary space belongs to the next word's token).
* ``loglikelihood_rolling`` (document) -> its log-probability, token tier only: the document's tokens after one
  prefix token (BOS, else EOS), in windows of ``max_length`` tokens; every token is scored exactly once, each
  window predicts the next ``max_length`` tokens and the last one keeps a full context (lm-eval's rolling rule).
* ``generate_until`` (context, gen_kwargs) -> text: ``until`` -> stop strings, ``max_gen_toks`` -> new tokens
  (default 256), sampling when ``do_sample`` is true or, without ``do_sample``, when ``temperature`` > 0; greedy
  otherwise. Token tier: a prompt is left-truncated so that it and the new tokens fit ``max_length``.

lm-eval is the ``lm-eval`` extra (``pip install 'evalsuite[lm-eval]'``); the two entry points above check for it
before importing this module, which imports lm-eval at its top.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from tqdm import tqdm

from evalsuite.adapters.base import GENERATE, LOGLIKELIHOOD, TOKENS, TextAdapter, TokenAdapter
from evalsuite.adapters.registry import AdapterOptions, load_adapter
from evalsuite.errors import UserError
from evalsuite.generation.types import GenerationConfig

log = logging.getLogger(__name__)

MODEL_NAME = "evalsuite"  # lm-eval's --model value
DEFAULT_MAX_GEN_TOKS = 256  # lm-eval's usual default when a task names no max_gen_toks
# The model_args this class reads; any other key=value is a kind-specific option of the model spec
# (``model=hf:DIR,revision=main`` reaches the hf factory as ``hf:DIR,revision=main``).
OWN_ARGS = ("model", "device", "dtype", "checkpoint", "attention", "batch_size", "max_batch_size", "max_length")
GEN_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_p", "top_k", "seed")
# What the requests of each lm-eval output type ask of the adapter (multiple choice scores each choice's likelihood).
OUTPUT_TYPE_NEEDS = {"generate_until": GENERATE, "loglikelihood": LOGLIKELIHOOD, "multiple_choice": LOGLIKELIHOOD,
                     "loglikelihood_rolling": TOKENS}  # fmt: skip


def split_trailing_space(context: str, continuation: str) -> tuple[str, str]:
    """Move a context's trailing whitespace to the front of its continuation (lm-eval's word-boundary rule)."""
    stripped = context.rstrip()
    return stripped, context[len(stripped) :] + continuation


def rolling_windows(n_tokens: int, max_length: int) -> list[tuple[int, int, int]]:
    """Windows for the rolling log-likelihood of ``n_tokens`` tokens after one prefix token.

    Positions index the sequence ``[prefix] + tokens`` (length ``n_tokens + 1``). Each window is ``(start, end,
    n_scored)``: its model input is ``seq[start : end - 1]`` (at most ``max_length`` tokens), and the last
    ``n_scored`` of its predictions are scored, i.e. ``seq[end - n_scored : end]``. The scored spans tile
    ``seq[1:]`` in order: every token is predicted exactly once, with as much context as fits.
    """
    if max_length < 1:
        raise ValueError("max_length must be at least 1")
    windows = []
    first = 1  # the first position this window scores
    while first <= n_tokens:
        end = min(first + max_length, n_tokens + 1)
        windows.append((max(0, end - 1 - max_length), end, end - first))
        first = end
    return windows


def generation_config(gen_kwargs: dict) -> GenerationConfig:
    """lm-eval's gen_kwargs -> our :class:`GenerationConfig` (unknown keys are ignored with a warning)."""
    unknown = sorted(set(gen_kwargs) - set(GEN_KWARGS))
    if unknown:
        log.warning("evalsuite lm-eval model: ignoring gen_kwargs %s", ", ".join(unknown))
    until = gen_kwargs.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    temperature = float(gen_kwargs.get("temperature", 0.0) or 0.0)
    do_sample = gen_kwargs.get("do_sample")
    if do_sample is None:
        do_sample = temperature > 0
    if do_sample and temperature == 0:
        temperature = 1.0  # sampling asked for without a temperature: the distribution as it is
    try:
        return GenerationConfig(
            max_new_tokens=int(gen_kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS)),
            temperature=temperature if do_sample else 0.0,
            top_p=float(gen_kwargs.get("top_p", 1.0) or 1.0),
            top_k=int(gen_kwargs.get("top_k", 0) or 0),
            stop=[s for s in until if s],
            seed=int(gen_kwargs.get("seed", 0) or 0),
        )
    except (TypeError, ValueError) as e:
        raise UserError(f"bad gen_kwargs {gen_kwargs}: {e}") from None


def load_tasks(task_manager, names: Sequence[str], adapter: TextAdapter) -> list:
    """lm-eval's tasks and groups ``names``, built once (``task_manager.load``) and checked against ``adapter``:
    a UserError names every task whose requests it cannot answer before any request is sent (lm-eval would run the
    other tasks' requests first, then stop). Returns the top-level tasks and groups, for ``simple_evaluate``."""
    loaded = task_manager.load(list(names))
    check_tasks(loaded["tasks"], adapter)
    children = {child for kids in loaded["group_map"].values() for child in kids}
    return [g for n, g in loaded["groups"].items() if n not in children] + [
        t for n, t in loaded["tasks"].items() if n not in children
    ]


def check_tasks(tasks: dict, adapter: TextAdapter) -> None:
    """A UserError naming each task of ``tasks`` (``{name: lm-eval Task}``) whose output type needs what
    ``adapter`` does not offer (:data:`OUTPUT_TYPE_NEEDS`; an output type not listed there is left to lm-eval)."""
    refused = []
    for name, task in tasks.items():
        kind = getattr(task, "OUTPUT_TYPE", None)
        need = OUTPUT_TYPE_NEEDS.get(kind)
        if need is not None and need not in adapter.capabilities:
            refused.append(f"{name} ({kind})")
    if refused:
        have = ", ".join(sorted(adapter.capabilities))
        raise UserError(
            f"model {adapter.name} cannot answer lm-eval task(s) {', '.join(refused)} (it offers: {have}; "
            "loglikelihood_rolling needs token-level scores); nothing was run"
        )


def _int_arg(value, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise UserError(f"lm-eval model_args: {name} must be an integer, got {value!r}") from None
    if n < 1:
        raise UserError(f"lm-eval model_args: {name} must be at least 1, got {n}")
    return n


@register_model(MODEL_NAME)
class EvalsuiteLM(LM):
    """Any evalsuite adapter (``model=`` takes our ``--model`` spec) as an lm-eval ``LM``.

    Args: model: the spec (``fox-pro-tiny``, ``hf:DIR``, ``openai:NAME``); device, dtype, checkpoint, attention:
    :class:`AdapterOptions`; batch_size: sequences per forward pass, prompts per generate call (``auto``: 1);
    max_length: the longest token sequence one forward pass sees (default: the model's ``max_length``, at most);
    further ``key=value`` args are passed on in the spec. ``adapter`` takes an adapter already built instead.
    """

    def __init__(
        self,
        model: str | None = None,
        device: str = "auto",
        dtype: str = "float32",
        checkpoint: str | None = None,
        attention: str = "auto",
        batch_size: int | str | None = 1,
        max_batch_size: int | None = None,  # lm-eval passes it; there is no automatic batch-size search here
        max_length: int | str | None = None,
        adapter: TextAdapter | None = None,
        **spec_options,
    ):
        super().__init__()
        if adapter is None:
            if not model:
                raise UserError("lm-eval model_args need model=SPEC (e.g. model=fox-pro-tiny or model=hf:DIR)")
            spec = str(model) + "".join(f",{k}={v}" for k, v in spec_options.items())
            options = AdapterOptions(
                device=str(device or "auto"),
                dtype=str(dtype or "float32"),
                checkpoint=Path(checkpoint) if checkpoint else None,
                attention=str(attention or "auto"),
            )
            adapter = load_adapter(spec, options)
        elif spec_options:
            raise UserError(f"unknown EvalsuiteLM arguments: {', '.join(spec_options)}")
        self.adapter = adapter
        self._device = adapter.device
        bs = str(batch_size) if batch_size is not None else "1"
        self.batch_size = 1 if bs.startswith("auto") else _int_arg(bs, "batch_size")
        limit = adapter.max_length
        wanted = _int_arg(max_length, "max_length")
        if wanted is not None and limit is not None and wanted > limit:
            raise UserError(f"max_length {wanted} exceeds model {adapter.name}'s max_length {limit}")
        self.max_length = wanted or limit

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None) -> EvalsuiteLM:
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None) -> EvalsuiteLM:
        # model_args win over lm-eval's own --device/--batch_size defaults (lm-eval would pass both, a TypeError)
        extra = {k: v for k, v in (additional_config or {}).items() if v is not None and k not in arg_dict}
        return cls(**arg_dict, **extra)

    # --- identity -------------------------------------------------------------------------------------------

    @property
    def tokenizer_name(self) -> str:
        return self.adapter.tokenizer.spec

    def get_model_info(self) -> dict:
        """Merged into lm-eval's results["config"]."""
        return {"evalsuite": {**self.adapter.identity(), "max_length": self.max_length}}

    # --- helpers --------------------------------------------------------------------------------------------

    def _require(self, capability: str, request: str) -> None:
        if capability not in self.adapter.capabilities:
            have = ", ".join(sorted(self.adapter.capabilities))
            raise UserError(f"model {self.adapter.name} cannot answer lm-eval {request} requests (it offers: {have})")

    def _prefix_id(self) -> int:
        tok = self.adapter.tokenizer
        prefix = tok.bos_id if tok.bos_id is not None else tok.eos_id
        if prefix is None:
            raise UserError(f"tokenizer {tok.spec} has neither BOS nor EOS to condition an empty context on")
        return prefix

    def _batches(self, order: list[int], desc: str):
        size = self.batch_size
        for i in tqdm(range(0, len(order), size), desc=desc, disable=len(order) <= size):
            yield order[i : i + size]

    @torch.inference_mode()
    def _score(self, seqs: list[list[int]], n_scored: list[int], desc: str) -> list[tuple[float, bool]]:
        """For each token sequence: the log-probability of its last ``n_scored`` tokens given what precedes them,
        and whether each of them is the argmax. Batches of similar length, right-padded (causal models never
        look ahead, so padding after a sequence changes nothing it is scored on)."""
        adapter = self.adapter
        assert isinstance(adapter, TokenAdapter)
        results = [(0.0, True)] * len(seqs)  # nothing scored: probability one
        order = sorted((i for i in range(len(seqs)) if n_scored[i] > 0), key=lambda i: -len(seqs[i]))
        for batch in self._batches(order, desc):
            width = max(len(seqs[i]) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, : len(seqs[i])] = torch.tensor(seqs[i])
            nll_all, argmax = adapter.token_scores(ids[:, :-1], ids[:, 1:])
            hit_all = argmax == ids[:, 1:]
            for row, i in enumerate(batch):
                end, n = len(seqs[i]) - 1, n_scored[i]  # targets[row, :end] are real
                logprob = -float(nll_all[row, end - n : end].double().sum())
                results[i] = (logprob, bool(hit_all[row, end - n : end].all()))
        return results

    # --- lm-eval's three request types ----------------------------------------------------------------------

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        if not requests:
            return []
        self._require(LOGLIKELIHOOD, "loglikelihood")
        pairs = [split_trailing_space(*req.args[:2]) for req in requests]
        if TOKENS in self.adapter.capabilities:
            out = self._loglikelihood_tokens(pairs)
        else:
            out = [(float(lp), bool(g)) for lp, g in self.adapter.loglikelihood(pairs)]
        for req, res in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def _loglikelihood_tokens(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float, bool]]:
        tok = self.adapter.tokenizer
        seqs, ns = [], []
        for context, continuation in pairs:
            ctx = tok.encode(context) or [self._prefix_id()]  # an empty context: condition on BOS (else EOS)
            cont = tok.encode(continuation, add_bos=False)  # empty: nothing scored, log-probability 0
            if self.max_length is not None:
                if len(cont) > self.max_length:
                    raise UserError(f"a continuation of {len(cont)} tokens exceeds max_length {self.max_length}")
                ctx = ctx[max(0, len(ctx) + len(cont) - 1 - self.max_length) :]  # oldest context tokens go
            seqs.append(ctx + cont)
            ns.append(len(cont))
        return self._score(seqs, ns, "loglikelihood")

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        if not requests:
            return []
        if TOKENS not in self.adapter.capabilities:
            raise UserError(
                f"model {self.adapter.name} gives no token-level scores, so lm-eval loglikelihood_rolling "
                "(perplexity) tasks cannot run on it"
            )
        tok = self.adapter.tokenizer
        prefix = self._prefix_id()
        seqs, ns, owner = [], [], []
        for d, req in enumerate(requests):
            tokens = [prefix] + tok.encode(req.args[0], add_bos=False)
            window = self.max_length or len(tokens)
            for start, end, n in rolling_windows(len(tokens) - 1, window):
                seqs.append(tokens[start:end])
                ns.append(n)
                owner.append(d)
        totals = [0.0] * len(requests)
        for d, (logprob, _) in zip(owner, self._score(seqs, ns, "loglikelihood_rolling"), strict=True):
            totals[d] += logprob
        for req, res in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, res)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        if not requests:
            return []
        self._require(GENERATE, "generate_until")
        groups: dict[str, list[int]] = {}  # one GenerationConfig per group
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1] or {}, sort_keys=True, default=str), []).append(i)
        out: list[str | None] = [None] * len(requests)
        for members in groups.values():
            config = generation_config(dict(requests[members[0]].args[1] or {}))
            contexts = {i: requests[i].args[0] for i in members}
            if TOKENS in self.adapter.capabilities:
                self._generate_tokens(contexts, config, out)
            else:  # a text adapter takes the whole group at once and sets its own concurrency
                texts = [g.text for g in self.adapter.generate_until(list(contexts.values()), config)]
                for i, text in zip(contexts, texts, strict=True):
                    out[i] = text
        for req, text in zip(requests, out, strict=True):
            self.cache_hook.add_partial("generate_until", req.args, text)
        return out  # type: ignore[return-value]

    def _generate_tokens(self, contexts: dict[int, str], config: GenerationConfig, out: list) -> None:
        adapter = self.adapter
        assert isinstance(adapter, TokenAdapter)
        prompts = {i: adapter.tokenizer.encode(c) or [self._prefix_id()] for i, c in contexts.items()}
        if self.max_length is not None:
            budget = self.max_length - config.max_new_tokens
            if budget < 1:
                raise UserError(f"max_gen_toks {config.max_new_tokens} leaves no room in max_length {self.max_length}")
            prompts = {i: p[-budget:] for i, p in prompts.items()}
        order = sorted(prompts, key=lambda i: -len(prompts[i]))
        for batch in self._batches(order, "generate_until"):
            for i, g in zip(batch, adapter.generate([prompts[i] for i in batch], config), strict=True):
                out[i] = g.text
