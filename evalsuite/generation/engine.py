"""The decode engine behind :meth:`NativeAdapter.generate <evalsuite.adapters.native.NativeAdapter.generate>`
(any family): one prefill pass over the left-padded prompts, then one token per step with as few host round trips
as the stop rules allow, and on CUDA the step replayed as a CUDA graph.

Decode paths (``path``):

* ``eager``: :class:`EagerStepDecoder`, ``model.forward`` with a decode state, a token at a time -- any family,
  and the reference every other path must equal token for token.
* ``static``: the family's ``CausalLM.static_decoder(batch, capacity, start)``
  (:class:`~evalsuite.models.base.StaticDecoder`: preallocated state, fixed shapes, the length on the device),
  stepped eagerly.
* ``graph``: the static decoder's step, the LM head and the choice of the next tokens recorded once per call as a
  CUDA graph (:class:`CudaGraphStep`) and replayed per token; on CUDA, with a decoder whose ``graph_safe``.
* ``compiled``: ``graph`` over the decoder's step put through ``torch.compile`` first
  (:meth:`~evalsuite.models.base.StaticDecoder.compile_step`: the step's many small kernels fused), where the
  family offers it (FoX).
* ``auto``: on CUDA, ``graph`` where the family's static decoder is graph-safe, ``static`` where it is not; else
  ``eager``. The CPU keeps the eager path and never touches ``torch.cuda``.

Host syncs: tokens are chosen on the device and written into a ``[B, max_new_tokens]`` buffer; EOS and stop token
ids set a device-side ``done`` mask. The host looks every ``sync_every`` tokens only: at ``done.all()``
without stop strings, at the new tokens with them (stop strings need text). How each row ends is decided on the
host by :class:`~evalsuite.generation.finish.Finisher`, which applies the per-token loop's rules token by token, so
the tokens made past a row's end (fewer than ``sync_every``) are dropped and the outputs equal the per-token loop's
exactly. The choice itself is :class:`~evalsuite.generation.sampling.TokenChooser`'s, each row under its own
settings: the logit rules (penalties, logit_bias, min_tokens) and the argmax or the seeded counter-based draw, all
on the device, so greedy and sampled batches alike sync every ``sync_every`` tokens only, and the graph path
captures the choice with the step. :class:`~evalsuite.generation.steps.DecodeRun` holds the same decoder and chooser
between calls, for a caller that schedules step by step.

Also the batch size from free memory: :func:`prompts_per_call`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence

import torch

from evalsuite.errors import UserError
from evalsuite.generation.finish import Finisher
from evalsuite.generation.sampling import TokenChooser, per_row
from evalsuite.generation.types import Generation, GenerationConfig

PATHS = ("auto", "eager", "static", "graph", "compiled")
SYNC_EVERY = 16  # tokens between host checks of EOS / stop strings on the greedy path
GRAPH_WARMUP = 2  # eager steps on a side stream before the capture

# Batch size from memory. ACTIVATION_FACTOR: live prefill activations per prompt token, in float32 vectors of the
# model width. A prefill that fills a KV cache peaks far above a scoring pass (~7.7): FoX (Pro) 760M, bf16, on an
# H100 peaked at 0.76 / 2.95 GiB beyond its weights and bf16 cache for one 4K / 16K prompt, i.e. 32.4 /
# 31.5; at 12 the NIAH grid's and LongBench's long cells run out of memory. 36 leaves room.
ACTIVATION_FACTOR = 36
HEADROOM = 0.85
MAX_PROMPTS = 256
FALLBACK_PROMPTS = 4  # on a CPU, or for a model we cannot size (hf, API): NIAH's default batch


class EagerStepDecoder:
    """The generic decoder of every family: ``model.forward(ids, state)`` over ``model.new_state`` (eager, not
    graph-safe). It has the shape of ``CausalLM.static_decoder``'s result, so the engine has one code path.

    ``prefill(ids [B, T] long) -> hidden [B, D]`` of the last position; ``step(ids [B, 1] long) -> hidden [B, D]``.
    """

    graph_safe = False

    def __init__(self, model, batch: int, capacity: int, start: torch.Tensor | None = None):
        self.model = model
        self.state = model.new_state(batch, capacity, start)

    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.prefill(ids, self.state)

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids, state=self.state)[:, -1]


def static_support(model) -> str | None:
    """What the family's static decoder allows on the model's device and backend: ``"graph"`` (graph-safe),
    ``"static"`` (eager steps only) or None (no static decoder); probed with a one-sequence, two-position state."""
    decoder = model.static_decoder(1, 2)
    return None if decoder is None else ("graph" if decoder.graph_safe else "static")


def compiled_support(model) -> bool:
    """Whether the ``compiled`` path runs here: a graph-safe static decoder that offers ``compile_step`` (probed as
    :func:`static_support` does; ``torch.compile`` compiles lazily, so the probe is cheap)."""
    decoder = model.static_decoder(1, 2)
    return decoder is not None and decoder.graph_safe and decoder.compile_step()


def left_pad(prompts: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ids ``[B, T]`` long, start ``[B]`` long or None without padding): prompts right-aligned, zeros before them;
    the model masks the padding through the state's ``start``."""
    B, longest = len(prompts), max(len(p) for p in prompts)
    ids = torch.zeros(B, longest, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, longest - len(p) :] = torch.tensor(p, dtype=torch.long)
    start = torch.tensor([longest - len(p) for p in prompts])
    return ids, (start if int(start.max()) > 0 else None)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """The greedy choice: logits ``[B, V]`` -> token ids ``[B]``."""
    return logits.argmax(-1)


class CudaGraphStep:
    """``tok [B] -> next tok [B]``: the decoder's ``step``, the LM head and ``choose`` (logits ``[B, V]`` -> token
    ids ``[B]``, device ops alone: by default the argmax; a :class:`~evalsuite.generation.sampling.TokenChooser`)
    as one CUDA graph; ``choose=None``: ``tok [B] -> logits [B, V]``, for a choice made outside the graph.

    The first ``warmup`` calls run eagerly on a side stream (lazy initialisation and Triton autotuning must not
    happen inside a capture: the recipe of the torch.cuda.graphs notes); they are real decode steps and their
    tokens are used. The next call records the same function -- a capture records kernels without running them,
    so the state is not advanced by it -- and replays it; later calls copy the token in and replay (and tell the
    decoder, :meth:`~evalsuite.models.base.StaticDecoder.replayed`). A step the decoder marks as due eagerly
    (:meth:`~evalsuite.models.base.StaticDecoder.eager_step_due`, DRT's chunk boundaries) runs outside the graph,
    updating the same buffers the graph reads. The returned tensor is the graph's static output: read it before the
    next call.
    """

    def __init__(self, model, decoder, warmup: int = GRAPH_WARMUP, choose: Callable | None = argmax):
        self.model, self.decoder, self.warmup, self.choose = model, decoder, warmup, choose
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inp = self.out = None  # static buffers: every replay reads and writes these addresses

    def _step(self) -> None:
        logits = self.model.logits(self.decoder.step(self.inp[:, None]))
        out = logits if self.choose is None else self.choose(logits)
        if self.out is None:  # the first (eager) call sizes the output: token ids, or the logits to choose from
            self.out = torch.empty_like(out)
        self.out.copy_(out)

    def __call__(self, tok: torch.Tensor) -> torch.Tensor:
        if self.inp is None:
            self.inp = torch.empty_like(tok)
        self.inp.copy_(tok)
        if self.decoder.eager_step_due():  # a step of another shape (DRT's chunk boundary): outside the graph
            self._step()
            return self.out
        if self.graph is None and self.warmup > 0:
            self.warmup -= 1
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            # the capture's autocast state already: a compiled step guards on it and would recompile in the capture
            with _uncached_autocast("cuda"), torch.cuda.stream(side):
                self._step()
            torch.cuda.current_stream().wait_stream(side)
            return self.out
        if self.graph is None:
            self.graph = torch.cuda.CUDAGraph()
            with _uncached_autocast("cuda"), torch.cuda.graph(self.graph):
                self._step()  # the step's Python ran once here: its host-side bookkeeping is done
        else:
            self.decoder.replayed()
        self.graph.replay()
        return self.out


def _uncached_autocast(device_type: str):
    """Autocast without its weight-cast cache, for a capture: a cast cached outside the graph lives in memory the
    cache frees when autocast exits, and the graph would keep reading it (the torch.cuda.graphs notes)."""
    if not torch.is_autocast_enabled(device_type):
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type), cache_enabled=False)


def _decoder(model, path: str, device: torch.device, batch: int, capacity: int, start):
    """(decoder, the path taken): see the module docstring; an impossible explicit path is a UserError."""
    if path not in PATHS:
        raise UserError(f"unknown decode path {path!r}; choose from {', '.join(PATHS)}")
    if path in ("graph", "compiled") and device.type != "cuda":
        raise UserError(f"decode path {path!r} needs a CUDA device")
    if path == "eager" or (path == "auto" and device.type != "cuda"):
        return EagerStepDecoder(model, batch, capacity, start), "eager"
    fast = model.static_decoder(batch, capacity, start)
    if fast is None and path == "auto":
        return EagerStepDecoder(model, batch, capacity, start), "eager"
    if fast is None:
        raise UserError(f"decode path {path!r}: {type(model).__name__} offers no static decoder; use eager or auto")
    if path in ("graph", "compiled") and not fast.graph_safe:
        raise UserError(f"decode path {path!r}: {type(model).__name__}'s static step is not graph-safe with backend "
                        f"{model.attention_backend!r} on {device}")  # fmt: skip
    if path == "compiled" and not fast.compile_step():
        raise UserError(f"decode path 'compiled': {type(model).__name__} offers no compiled step; use graph")
    return fast, ("graph" if fast.graph_safe else "static") if path == "auto" else path


class StepTimer:
    """Times one :func:`generate` call by phase (seconds of wall clock, the device synchronised at each boundary):
    ``setup`` (the decoder and its cache), ``prefill``, ``first_steps`` (through step ``skip``: the graph's warm-up
    and capture), ``steps`` (the rest), ``finish`` (the host's per-token rules and detokenisation). Benchmarks read
    :attr:`phases` and :attr:`ms_per_step` (the ``steps`` phase per step; ``None`` when too few steps ran) after the
    call, to find what differs between two calls."""

    def __init__(self, skip: int = GRAPH_WARMUP + 2):
        self.skip, self.steps, self.ms_per_step = skip, 0, None
        self.phases: dict[str, float] = {}
        self._device, self._last = None, 0.0

    def start(self, device: torch.device) -> None:
        self._device = device
        self._last = self._now()

    def phase(self, name: str) -> None:
        """End the current phase as ``name``."""
        now = self._now()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._last
        self._last = now

    def after_step(self, made: int) -> None:
        if made == self.skip:
            self.phase("first_steps")

    def finish(self, made: int) -> None:
        self.phase("steps" if made > self.skip else "first_steps")
        if made > self.skip:
            self.steps = made - self.skip
            self.ms_per_step = self.phases["steps"] * 1e3 / self.steps

    def _now(self) -> float:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        return time.perf_counter()


class NoTimer(StepTimer):
    """What :func:`generate` times with when nobody asked: nothing (the base of step hooks that time nothing)."""

    def start(self, device) -> None:
        pass

    def phase(self, name) -> None:
        pass

    def after_step(self, made) -> None:
        pass

    def finish(self, made) -> None:
        pass


def generate(
    model,
    ids: torch.Tensor,
    start: torch.Tensor | None,
    config: GenerationConfig | Sequence[GenerationConfig],
    tokenizer,
    *,
    path: str = "auto",
    sync_every: int = SYNC_EVERY,
    timer: StepTimer | None = None,
) -> list[Generation]:
    """Continue the left-padded prompts ``ids [B, T]`` (``start [B]``: first real token per row, or None).

    ``model``: a ``CausalLM`` on its device, under the caller's autocast and inference mode. ``config``: one for
    every row, or one per row (the rows share ``max_new_tokens``, ``stop`` and ``stop_at_eos``; each row's other
    settings, its seed included, are its own: a row of its own config decodes as it would alone). Returns one
    :class:`Generation` per row, equal to the per-token loop's (see the module docstring). ``timer``: a
    :class:`StepTimer` that times the call's phases (benchmarks).
    """
    if sync_every < 1:
        raise ValueError(f"sync_every must be at least 1, got {sync_every}")
    device = model.input_embedding.weight.device
    B, T = ids.shape
    configs = per_row(config, B)
    if len({(c.max_new_tokens, tuple(c.stop), c.stop_at_eos) for c in configs}) > 1:
        raise ValueError("the rows of one generate call share max_new_tokens, stop and stop_at_eos")
    n, stop = configs[0].max_new_tokens, configs[0].stop
    eos = tokenizer.eos_id if configs[0].stop_at_eos else None
    start = None if start is None else start.to(device)
    timer = timer or NoTimer()
    timer.start(device)
    decoder, taken = _decoder(model, path, device, B, T + n, start)
    timer.phase("setup")
    select = TokenChooser(config, ids, start, model.vocab_size, eos, device)
    if taken in ("graph", "compiled"):
        step = CudaGraphStep(model, decoder, choose=select)
    else:

        def step(tok):
            return select(model.logits(decoder.step(tok[:, None])))

    finisher = Finisher(tokenizer, configs, eos)
    out = torch.empty(B, n, dtype=torch.long, device=device)
    tok = select(model.logits(decoder.prefill(ids.to(device))))
    out[:, 0] = tok
    timer.phase("prefill")
    ending = _ending_ids(configs, eos, device)  # with stop strings the host sees all tokens
    done = (tok[:, None] == ending).any(-1) if ending is not None and not stop else None
    made, checked = 1, 0
    while made < n:
        if made % sync_every == 0:  # a host sync: has every row ended?
            if stop:
                finisher.feed(out[:, checked:made].tolist())
                checked = made
                if finisher.all_done():
                    break
            elif done is not None and bool(done.all()):
                break
        tok = step(tok)
        out[:, made] = tok
        if done is not None:
            done |= (tok[:, None] == ending).any(-1)
        made += 1
        timer.after_step(made)
    timer.finish(made)
    finisher.feed(out[:, checked:made].tolist())
    generations = finisher.generations()
    timer.phase("finish")
    return generations


def _ending_ids(configs: list[GenerationConfig], eos: int | None, device) -> torch.Tensor | None:
    """The ids that end each row, ``[B, S]`` long (EOS and the row's stop_token_ids, padded with -1), or None."""
    rows = [[*([eos] if eos is not None else []), *c.stop_token_ids] for c in configs]
    width = max(len(r) for r in rows)
    if width == 0:
        return None
    return torch.tensor([r + [-1] * (width - len(r)) for r in rows], device=device)


# -- batch size from free memory --------------------------------------------------------------------------------


def bytes_per_prompt(model, length: int, new_tokens: int, dtype: torch.dtype) -> int:
    """Device bytes one more prompt of ``length`` tokens adds to a generate call of ``new_tokens`` on our ``model``:
    :func:`prompt_bytes` with its decode state at ``length + new_tokens`` (the capacity a call preallocates)."""
    state = int(model.decode_state_size(length + new_tokens, dtype)["bytes"])
    live = min(length, model.prefill_chunk or length)  # prompt tokens whose activations exist at once
    return prompt_bytes(state, live, model.input_embedding.embedding_dim, model.vocab_size)


def prompt_bytes(state: int, length: int, width: int, vocab: int) -> int:
    """A prompt's ``state`` bytes, its prefill activations (:data:`ACTIVATION_FACTOR` float32 vectors of the model
    ``width`` per token of the ``length`` filled in one pass) and its logits row (float32 ``[vocab]``, three times:
    logits, probabilities, sorted probabilities when sampling)."""
    return state + ACTIVATION_FACTOR * length * width * 4 + 3 * vocab * 4


def batch_for_memory(per_prompt: int, free: int, *, headroom: float = HEADROOM, cap: int = MAX_PROMPTS) -> int:
    """How many prompts of ``per_prompt`` bytes fit in ``headroom`` of ``free`` bytes, between 1 and ``cap``."""
    if per_prompt <= 0:
        raise ValueError("per_prompt must be positive")
    return max(1, min(cap, int(headroom * free) // per_prompt))


def free_device_bytes(device: torch.device) -> int:
    """Free CUDA memory: the driver's free bytes plus the blocks PyTorch's caching allocator holds unused."""
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def prompts_per_call(adapter, length: int, new_tokens: int) -> int:
    """Prompts of ``length`` tokens per generate call of ``new_tokens`` that fit the device's free memory, for our
    own models on CUDA (:func:`bytes_per_prompt`, :func:`batch_for_memory`); :data:`FALLBACK_PROMPTS` on a CPU and
    for models whose decode state we cannot size."""
    from evalsuite.models.base import CausalLM

    model = getattr(adapter, "model", None)
    if adapter.device.type != "cuda" or not isinstance(model, CausalLM):
        return FALLBACK_PROMPTS
    per_prompt = bytes_per_prompt(model, length, new_tokens, adapter.dtype)
    return batch_for_memory(per_prompt, free_device_bytes(adapter.device))
