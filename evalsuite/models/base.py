"""What every model family implements, so tasks and adapters never look inside a model.

* :class:`CausalLM`: a decoder-only LM split into ``forward`` (ids -> final hidden states, with an optional
  decode state) and ``logits`` (the LM head), so callers compute logits in chunks and a ``T x V`` matrix never
  exists at long context; plus decode-state creation, weight init, attention-backend choice and parameter counts.
* :class:`DecodeState`: what a model keeps between decoding steps. It says what kind of state it is (a KV cache
  that grows with the context, a fixed recurrent state, or a chunk memory) and how many bytes it holds.
* :class:`StaticDecoder`: decoding with fixed shapes (a preallocated state, its length on the device), so one
  captured CUDA graph replays every step; a family offers one through ``CausalLM.static_decoder``.

Tensor layout: ids ``[B, T]`` long; hidden ``[B, T, D]``; logits ``[B, T, V]``. Left padding: ``start`` ``[B]``
long marks the first real token of each row; tokens before it are padding and must not change the others.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from evalsuite.errors import UserError
from evalsuite.kernels import triton_utils
from evalsuite.kernels.gemv import few_row_linear
from evalsuite.kernels.triton_utils import interpreting, triton_installed

STATE_KINDS = ("kv-cache", "recurrent", "chunk-memory")
# Elements of one logits chunk (B x positions x vocab): 2**25 fp32 = 128 MiB.
LOGIT_BUDGET = 2**25
# A head's rows padded to a multiple of this for many-row logits (EmbeddingHeadLM.cast_head): aligned GEMM outputs.
HEAD_ROWS_MULTIPLE = 128


# torch.nn.init's random fillers, which nn.Linear / nn.Embedding / nn.Conv1d call from reset_parameters when built.
_RANDOM_INITS = ("uniform_", "normal_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "orthogonal_")  # fmt: skip
_INIT_LOCK = threading.Lock()


@contextlib.contextmanager
def skip_random_init():
    """Build modules without torch's default random init: every parameter is then filled by the family's
    ``init_weights`` or by a checkpoint, so drawing it twice is waste (12 s of the 760M FoX's start-up on one CPU
    thread, half of it this first draw). Constant fills (norm weights, zero biases) and buffers are kept.
    ``tests/test_models.py`` checks that every family's ``init_weights`` still gives the same weights. The patch of
    ``torch.nn.init`` is process-wide, so builds in threads (MQAR cells) take turns."""
    with _INIT_LOCK:
        saved = {name: getattr(nn.init, name) for name in _RANDOM_INITS}
        for name in _RANDOM_INITS:
            setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
        try:
            yield
        finally:
            for name, fn in saved.items():
                setattr(nn.init, name, fn)


def normal_init_(p: torch.Tensor, std: float, gen: torch.Generator) -> None:
    """``p = N(0, std^2)`` drawn from the CPU generator ``gen``: in place for float32 CPU tensors (half the time of
    ``randn * std`` and no temporaries; bitwise the same numbers), else drawn on the CPU and copied."""
    if p.device.type == "cpu" and p.dtype == torch.float32:
        p.normal_(0.0, std, generator=gen)
    else:
        p.copy_(torch.randn(p.shape, generator=gen) * std)


class DecodeState(ABC):
    """Per-batch decoding state. ``length`` counts the positions consumed so far (padding included)."""

    kind: ClassVar[str]  # one of STATE_KINDS
    length: int

    @abstractmethod
    def nbytes(self) -> int:
        """Bytes of state the batch needs at its current length (a preallocated cache counts its filled part)."""


class RecurrentState(DecodeState):
    """A fixed-size state per layer that does not grow with the context (``kind="recurrent"``): each entry of
    ``layers`` is a tensor or a tuple of tensors (e.g. GSA's slot memories ``(hk, hv)``, TNL's ``kv``), replaced or
    updated in place by the layer. ``start`` (``[B]`` long or None) marks left padding."""

    kind = "recurrent"

    def __init__(self, layers: list, start: torch.Tensor | None = None):
        self.layers = layers
        self.length = 0
        self.start = start
        # The consumed-position count on the device ([1] long), set by RecurrentStaticDecoder: positions are then
        # computed from it, so a captured CUDA graph replays correctly at every position. The decoder then keeps
        # ``length`` itself, outside what torch.compile traces (a Python int changing inside the forward would
        # recompile the step at every position).
        self.position: torch.Tensor | None = None
        # True once a static decoder owns the tensors (a captured graph reads them at fixed addresses): set_layer
        # then copies into them.
        self.in_place = False

    def set_layer(self, i: int, new) -> None:
        """Layer ``i``'s new state (a tensor or a tuple, as :attr:`layers` holds): copied into the layer's tensors
        where :attr:`in_place`, else put in their place. Copied layer by layer, a step holds one layer's new state
        beside the whole state, not a second whole state (TNL-7B: 62 MiB a sequence)."""
        if not self.in_place:
            self.layers[i] = new
            return
        for buffer, value in zip(_tensors([self.layers[i]]), _tensors([new]), strict=True):
            if value is not buffer:
                buffer.copy_(value)

    def absolute_positions(self, T: int, device) -> torch.Tensor:
        """Absolute positions ``[T]`` (padding included) of the next ``T`` tokens."""
        offset = self.position if self.position is not None else self.length
        return torch.arange(T, device=device) + offset

    def advance(self, T: int) -> None:
        """Count ``T`` consumed positions: on the device when :attr:`position` is set (its decoder counts ``length``),
        else on the host."""
        if self.position is None:
            self.length += T
        else:
            self.position += T

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in _tensors(self.layers))


def _tensors(layers: list) -> list[torch.Tensor]:
    return [t for layer in layers for t in (layer if isinstance(layer, tuple) else (layer,))]


class StaticDecoder(ABC):
    """Prefill, then one token per step over a preallocated :attr:`state` whose length lives on the device.

    ``step`` must be CUDA-graph safe when :attr:`graph_safe` is True: fixed shapes, in-place state updates, no
    host sync, no allocation whose size depends on the context length; it advances the state. The decode engine
    (``evalsuite/generation/engine.py``) captures it once and replays it per token. Greedy outputs equal those of
    ``CausalLM.forward`` with a state, token for token (the families' tests compare them). ``state.length`` (a
    host-side count) is only kept up to date by calls of :meth:`step`, not by graph replays.
    """

    state: DecodeState
    graph_safe: bool  # step() runs without a host sync (the engine may capture it in a CUDA graph)

    @abstractmethod
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """ids ``[B, T]`` (left padding as given to ``static_decoder``) -> hidden state ``[B, D]`` of the last
        position; fills the state."""

    @abstractmethod
    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        """ids ``[B, 1]`` -> hidden state ``[B, D]`` of the new position; appends it to the state."""

    def compile_step(self) -> bool:
        """Put the device part of :meth:`step` through ``torch.compile`` (fusing its small kernels; the engine's
        ``compiled`` path then captures that in a CUDA graph). False where the family does not offer it."""
        return False

    def eager_step_due(self) -> bool:
        """Whether the next :meth:`step` must run eagerly, outside a captured graph (it takes another path: DRT's
        chunk boundaries). The engine asks before every step."""
        return False

    def replayed(self) -> None:
        """Host-side bookkeeping for a step the engine replayed from its graph (where :meth:`step` did not run);
        none by default."""
        return None


class DeviceStepDecoder(StaticDecoder):
    """A static decoder whose step is a device part, :meth:`_step_on_device` (what a CUDA graph replays and
    :meth:`compile_step` puts through ``torch.compile``), plus the host-side count ``state.length``, kept out of the
    compiled code (a Python int changing inside it would recompile the step at every position). FoX's decoder and
    :class:`RecurrentStaticDecoder`."""

    compiled = False

    @abstractmethod
    def _step_on_device(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The step without host-side counts: ids ``[B, 1]`` -> hidden state ``[B, D]``; advances the state."""

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = (_compiled_step(type(self)) if self.compiled else type(self)._step_on_device)(self, input_ids)
        self.state.length += 1
        return hidden

    def compile_step(self) -> bool:
        _compiled_step(type(self))
        self.compiled = True
        return True


# One torch.compile per decoder class, of its unbound step, shared by every decoder of the class. Not a compiled bound
# method kept on the decoder: that reference cycle leaves each decoder's KV cache (GBs at long context) to the cyclic
# garbage collector, and a NIAH grid runs out of device memory on an H100. Each recompiles once, dynamic
# in the shapes that changed (FoX's cache size), when a decoder of another size comes.
# Keyed by the class and whether programmatic dependent launch is allowed (triton_utils.pdl_allowed).
_COMPILED_STEPS: dict[tuple[type, bool], Callable] = {}


def _compiled_step(cls: type) -> Callable:
    key = (cls, triton_utils.pdl_allowed())
    if key not in _COMPILED_STEPS:
        # Inductor's kernels with programmatic dependent launch (Hopper and newer; inductor ignores it elsewhere), as
        # ours take it (evalsuite/kernels/triton_utils.py): each starts while the one before it finishes.
        _COMPILED_STEPS[key] = torch.compile(cls._step_on_device, options={"triton.enable_pdl": key[1]})
    return _COMPILED_STEPS[key]


class RecurrentStaticDecoder(DeviceStepDecoder):
    """The static decoder of a family with a :class:`RecurrentState` (GSA, TNL): the state is fixed-size already;
    the step copies each layer's new state into buffers allocated once, as the layer returns it
    (:meth:`RecurrentState.set_layer`), and the family's ``forward`` takes positions from the state's device counter
    (:meth:`RecurrentState.absolute_positions`).
    ``graph_safe``: the family's one-token kernel runs without a host sync (its Triton step on CUDA)."""

    def __init__(self, model: CausalLM, batch: int, start: torch.Tensor | None, graph_safe: bool):
        self.model, self.graph_safe = model, graph_safe
        model.pack_step()  # one GEMM per input for the step's small matrix products (evalsuite/models/packed.py)
        self.state = model.new_state(batch, 0, start)
        self.state.position = torch.zeros(1, dtype=torch.long, device=model.input_embedding.weight.device)

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.prefill(input_ids, self.state)
        self.state.length += input_ids.shape[1]  # the host-side count (the forward advanced the device one)
        own = [tuple(t.clone() for t in x) if isinstance(x, tuple) else x.clone() for x in self.state.layers]
        self.state.layers = own
        self.state.in_place = True
        return hidden

    def _step_on_device(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The forward with the state, which copies each layer's new state into the buffers cloned at prefill."""
        return self.model(input_ids, state=self.state)[:, -1]


class CausalLM(nn.Module, ABC):
    """Base class of every model family. Subclasses set ``backends`` (the attention implementations they offer,
    ``"auto"`` first) and implement the abstract methods; ``config`` is the family's config dataclass."""

    backends: ClassVar[tuple[str, ...]] = ("auto",)
    reference_backend: ClassVar[str] = "auto"  # the plain, obviously-correct implementation the others must match
    # Prompt tokens a decode state is filled with per forward pass (:meth:`prefill`); None: the whole prompt at once.
    # Chunking bounds the prefill's activations (tens of float32 vectors of the width per token) by the chunk, not
    # the prompt, so long prompts leave the memory to more sequences' caches.
    prefill_chunk: ClassVar[int | None] = None
    config: object

    def __init__(self):
        super().__init__()
        self._backend = "auto"

    # -- the forward pass -------------------------------------------------------------------------------------

    @abstractmethod
    def forward(
        self, input_ids: torch.Tensor, state: DecodeState | None = None, start: torch.Tensor | None = None
    ) -> torch.Tensor:
        """ids ``[B, T]`` -> final hidden states ``[B, T, D]``. With a ``state`` the tokens continue the state's
        sequence and are appended to it (its own left padding applies); ``start`` marks left padding otherwise."""

    def prefill(self, input_ids: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Fill ``state`` with the prompts ``[B, T]`` (in passes of :attr:`prefill_chunk` tokens, each continuing the
        state) -> the last position's hidden state ``[B, D]``."""
        T = input_ids.shape[1]
        chunk = self.prefill_chunk or T
        for s in range(0, T, chunk):
            hidden = self(input_ids[:, s : s + chunk], state=state)
        return hidden[:, -1]

    @abstractmethod
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head: ``[..., D] -> [..., V]``."""

    def chunked_logits(self, hidden: torch.Tensor, budget: int = LOGIT_BUDGET) -> Iterator[tuple[int, torch.Tensor]]:
        """Yield ``(start, logits [B, chunk, V])`` over the positions of ``hidden [B, T, D]``, one chunk at a time."""
        B, T, _ = hidden.shape
        chunk = max(1, budget // (B * self.vocab_size))
        for s in range(0, T, chunk):
            yield s, self.sequence_logits(hidden[:, s : s + chunk])

    def sequence_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """:meth:`logits` of many positions (a chunk of :meth:`chunked_logits`); families may take another route."""
        return self.logits(hidden)

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abstractmethod
    def input_embedding(self) -> nn.Embedding: ...

    # -- decoding ---------------------------------------------------------------------------------------------

    @abstractmethod
    def new_state(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> DecodeState:
        """An empty decode state for ``batch`` sequences of up to ``capacity`` positions (``start``: left padding)."""

    def static_decoder(self, batch: int, capacity: int, start: torch.Tensor | None = None) -> StaticDecoder | None:
        """A :class:`StaticDecoder` for ``batch`` sequences of up to ``capacity`` positions (``start``: left padding),
        or None when the family has none (the engine then decodes through ``forward`` with a state)."""
        return None

    @abstractmethod
    def decode_state_size(self, length: int, dtype: torch.dtype) -> dict:
        """What the state holds per sequence after ``length`` tokens, without allocating it:
        ``{"kind", "elements", "bytes", "dtype"}`` (MQAR's state-size axis; :meth:`DecodeState.nbytes` agrees)."""

    def state_dtype(self) -> torch.dtype:
        """The dtype activations (and so cached keys/values) have: the autocast dtype when autocast is on."""
        p = self.input_embedding.weight
        return torch.get_autocast_dtype(p.device.type) if torch.is_autocast_enabled(p.device.type) else p.dtype

    # -- weights, backends, sizes -----------------------------------------------------------------------------

    @abstractmethod
    def init_weights(self, seed: int = 0) -> None:
        """Deterministic initialisation from ``seed`` (no global RNG touched)."""

    def set_attention_backend(self, backend: str, device: torch.device | str | None = None) -> None:
        """Pick one of ``backends``; an unknown name is a UserError listing the family's choices, and ``"triton"``
        needs the triton package and, given the ``device`` the model will run on, a CUDA one (the kernels run on a
        CPU only under the Triton interpreter, ``TRITON_INTERPRET=1``, as the tests run them)."""
        if backend not in self.backends:
            raise UserError(
                f"attention backend {backend!r} is not offered by {type(self).__name__}; "
                f"choose from {', '.join(self.backends)}"
            )
        if backend == "triton" and not triton_installed():
            raise UserError("--attention triton needs the 'triton' package: pip install triton")
        if backend == "triton" and device is not None and torch.device(device).type != "cuda" and not interpreting():
            raise UserError(
                f"--attention triton needs a CUDA GPU, not {device}; --attention auto picks the backend this device "
                "runs"
            )
        self._backend = backend

    @property
    def attention_backend(self) -> str:
        return self._backend

    def available_backends(self, device: torch.device) -> tuple[str, ...]:
        """The backends that run on ``device``: ``"triton"`` (a family's Triton kernels) only on CUDA."""
        on_gpu = device.type == "cuda" and triton_installed()
        return tuple(b for b in self.backends if b != "triton" or on_gpu)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; papers' "params" usually exclude the input embedding (an untied head counts)."""
        n = sum(p.numel() for p in self.parameters())
        return n - self.input_embedding.weight.numel() if non_embedding else n


class EmbeddingHeadLM(CausalLM):
    """A :class:`CausalLM` with an input embedding ``embed`` and an LM head that is its own ``lm_head`` or, with
    ``config.tie_word_embeddings``, the embedding itself (the FoX, GSA and TNL families). Subclasses call
    :meth:`_init_embedding_and_head` in ``__init__`` after setting ``self.cfg`` (with ``vocab_size``,
    ``hidden_size``, ``tie_word_embeddings``)."""

    def _init_embedding_and_head(self, cfg) -> None:
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        if not cfg.tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.register_buffer("head_cast", None, persistent=False)  # see cast_head
        self.register_buffer("head_padded", None, persistent=False)

    @torch.no_grad()
    def cast_head(self, dtype: torch.dtype) -> None:
        """For inference under autocast to ``dtype``: the head's weight in ``dtype``, stored with its rows padded by
        zeros to a multiple of :data:`HEAD_ROWS_MULTIPLE`.

        * A tied head gets its own copy of the embedding (``head_cast``), which :meth:`logits` uses. Under autocast
          ``F.linear`` would cast the float32 embedding on every call, a copy of the whole vocabulary per decoded
          token (88 us of TNL 385M's 1.07 ms compiled step on an H200); the copy gives the same logits. The
          embedding stays float32 for lookups. The copy does not follow later changes to the embedding (not for
          training). An untied head's weight (cast with the other linear layers) becomes the first rows of the
          padded storage.
        * The padded storage (``head_padded``, where the vocabulary is not a multiple already) serves the many-row
          logits of :meth:`sequence_logits`: with 50,257 columns the GEMM's output rows are not 16-byte aligned and
          cuBLAS falls back to an sm75 kernel at ~90 TFLOP/s on an H200 (the LM head took 109 ms of a 64K
          window of the 760M FoX (Pro), 15 ms padded: results/loss-window/).
        """
        tied = self.cfg.tie_word_embeddings
        weight = self.embed.weight if tied else self.lm_head.weight
        vocab, width = weight.shape
        rows = -(-vocab // HEAD_ROWS_MULTIPLE) * HEAD_ROWS_MULTIPLE
        if rows == vocab and not tied:
            return
        padded = weight.new_zeros(rows, width, dtype=dtype)
        padded[:vocab] = weight
        if tied:
            self.head_cast = padded[:vocab]
        else:
            self.lm_head.weight.data = padded[:vocab]
        self.head_padded = padded if rows != vocab else None

    def sequence_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """After :meth:`cast_head`, the GEMM runs over the padded head and the logits ``[..., V]`` are a view of its
        ``[..., padded V]`` product."""
        if self.head_padded is None:
            return self.logits(hidden)
        return F.linear(hidden, self.head_padded)[..., : self.vocab_size]

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def input_embedding(self) -> nn.Embedding:
        return self.embed

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden ``[..., D]`` -> logits ``[..., V]``; a decode step's few rows through the GEMV kernel on CUDA."""
        if self.head_cast is not None:
            return few_row_linear(hidden, self.head_cast)
        weight = self.embed.weight if self.cfg.tie_word_embeddings else self.lm_head.weight
        return few_row_linear(hidden, weight)
