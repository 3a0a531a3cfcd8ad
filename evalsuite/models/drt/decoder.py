"""DRT's static decoder: the chunk memory's fixed-shape part in static buffers, so the one-token step
of a text token inside a chunk is CUDA-graph safe, and the chunk boundaries run eagerly outside the graph.

Per step inside a chunk (62 of every 63 text tokens in the released config) the model needs, all of fixed shape:
every layer's keys and values of the last ``window`` positions (a :class:`~evalsuite.models.drt.layers.WindowRing`
per layer), the lower-layer outputs of the chunk so far (``partial [b, P, D]``: the chunk encoder's input), and
per retrieval group the retrieved chunks' keys and values with their fusion weights (``top_k`` slots; unused
slots weigh 0, so the GCA output of a chunk with nothing retrieved is exactly 0, like the eager path's absent one).

The last text token of a chunk is followed by the landmark: that step runs two positions, the chunk encoder and
the retrieval for the next chunk, with a chunk store that may live in CPU memory. It runs eagerly through the
model's own :meth:`~evalsuite.models.drt.model.DRTForCausalLM._stream` on the :class:`ChunkMemory` (the buffers
are written back to it first and read from it after), so the eager path's code makes every boundary. The decode
engine asks :meth:`DrtStaticDecoder.eager_step_due` before each step and calls :meth:`~DrtStaticDecoder.replayed`
after each replay (``evalsuite/generation/engine.py``).

Rows with different left padding have different chunk grids and memories (:class:`RowGroup`): each gets its own
buffers (:class:`_Grid`), and a step is due eagerly when any of them reaches a boundary.
"""

from __future__ import annotations

import torch

from evalsuite.models.base import StaticDecoder
from evalsuite.models.drt.layers import EMPTY_SLOT, GCAPlan, WindowRing
from evalsuite.models.drt.memory import RowGroup


class _Grid:
    """The static buffers of the rows of one chunk grid (one :class:`RowGroup`), ``b`` rows."""

    def __init__(self, model, group: RowGroup, batch: int, dtype: torch.dtype):
        cfg, device = model.cfg, model.embed.weight.device
        self.model, self.cfg, self.memory, self.rows = model, cfg, group.memory, group.rows
        b = batch if group.rows is None else len(group.rows)
        heads = (cfg.num_heads, cfg.head_dim)
        self.position = torch.zeros(1, dtype=torch.long, device=device)  # the next position, on the device
        self.slot_pos = torch.full((cfg.window,), EMPTY_SLOT, dtype=torch.long, device=device)
        self.rings = []
        for _ in range(cfg.num_layers):
            k = torch.zeros(b, cfg.window, *heads, dtype=dtype, device=device)
            self.rings.append(WindowRing(k, torch.zeros_like(k), self.slot_pos, self.position, cfg.window))
        hidden_dtype = model.embed.weight.dtype  # the residual stream's, also under autocast
        self.partial = torch.zeros(b, cfg.chunk_size, cfg.hidden_size, dtype=hidden_dtype, device=device)
        self.plans = []
        for _ in model.upper_layers:
            k = torch.zeros(b, 1, cfg.top_k, cfg.chunk_kv_rows, *heads, dtype=dtype, device=device)
            w = torch.zeros(b, 1, cfg.top_k, dtype=torch.float32, device=device)
            self.plans.append(GCAPlan(k, torch.zeros_like(k), w, phase=0, length=1, chunk_size=cfg.chunk_size))
        self.positions = 0  # the host's count of positions (text and landmarks)

    def boundary_due(self) -> bool:
        """Whether the next token is its chunk's last text token (a landmark follows)."""
        return self.cfg.retrieves and self.positions % self.cfg.chunk_size == self.cfg.chunk_size - 2

    def step(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [b, 1]`` -> hidden ``[b, D]``: eagerly at a boundary, else :meth:`step_on_device`."""
        if not self.boundary_due():
            hidden = self.step_on_device(ids)
            self.count()
            return hidden
        self.save()
        hidden = self.model._stream(ids, self.memory)[:, -1]
        self.load()
        return hidden

    def count(self) -> None:
        """Count one text position made by :meth:`step_on_device`."""
        self.positions += 1
        self.memory.tokens += 1

    def step_on_device(self, ids: torch.Tensor) -> torch.Tensor:
        """One text token inside a chunk: fixed shapes, in-place buffer updates, positions read on the device."""
        model, backend = self.model, self.model.attention_backend
        h = model.embed(ids)
        rings = iter(self.rings)
        for layer in model.lower_layers:
            h = layer.step(h, next(rings), None, backend)
        if self.cfg.retrieves:  # the chunk encoder's input (the Base LM encodes none)
            self.partial.index_copy_(1, self.position % self.cfg.chunk_size, h.to(self.partial.dtype))
        for group, plan in zip(model.upper_layers, self.plans, strict=True):
            for layer in group:
                h = layer.step(h, next(rings), plan, backend)
        self.slot_pos.index_copy_(0, self.position % self.cfg.window, self.position)
        self.position += 1
        return model.norm(h)[:, -1]

    def _slots(self, n: int) -> torch.Tensor:
        """The ring slots of the last ``n`` positions, oldest first."""
        return torch.arange(self.positions - n, self.positions, device=self.position.device) % self.cfg.window

    def load(self) -> None:
        """Fill the buffers from the memory, in place (a captured graph reads their addresses)."""
        mem = self.memory
        self.positions = mem.positions
        self.slot_pos.fill_(EMPTY_SLOT)
        self.position.fill_(self.positions)
        if mem.window[0] is not None:  # (None: no real token yet, a row of padding only)
            n = mem.window[0][0].shape[1]  # every layer keeps the same last n positions
            slots = self._slots(n)
            for ring, (k, v) in zip(self.rings, mem.window, strict=True):
                ring.k[:, slots], ring.v[:, slots] = k, v
            self.slot_pos[slots] = torch.arange(self.positions - n, self.positions, device=slots.device)
        self.partial.zero_()
        if mem.partial is not None:
            self.partial[:, : mem.partial.shape[1]] = mem.partial
        for plan, retrieval in zip(self.plans, mem.retrieval, strict=True):
            for t in (plan.k, plan.v, plan.w):
                t.zero_()
            if retrieval is not None and retrieval.k is not None:
                K = retrieval.slots
                plan.k[:, 0, :K], plan.v[:, 0, :K], plan.w[:, 0, :K] = retrieval.k, retrieval.v, retrieval.weights

    def save(self) -> None:
        """Write the buffers back into the memory, as the eager path would have left it."""
        mem, cfg = self.memory, self.cfg
        if self.positions:
            slots = self._slots(min(cfg.window, self.positions))
            mem.window = [(ring.k[:, slots].clone(), ring.v[:, slots].clone()) for ring in self.rings]
        phase = self.positions % cfg.chunk_size
        mem.partial = self.partial[:, :phase].clone() if phase else None
        mem.positions = self.positions


class DrtStaticDecoder(StaticDecoder):
    """Static decoding for a :class:`~evalsuite.models.drt.model.DRTForCausalLM` (see the module docstring)."""

    def __init__(self, model, batch: int, capacity: int, start: torch.Tensor | None = None):
        self.model, self.batch = model, batch
        self.state = model.new_state(batch, capacity, start)
        self.graph_safe = model.embed.weight.device.type == "cuda"
        self.grids: list[_Grid] = []  # made by prefill, in the activations' dtype

    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        hidden = self.model.prefill(input_ids, self.state)
        dtype = self.model.state_dtype()
        self.grids = [_Grid(self.model, group, self.batch, dtype) for group in self.state.groups]
        for grid in self.grids:
            grid.load()
        return hidden

    def eager_step_due(self) -> bool:
        """Whether some row's next token ends its chunk (the step then runs eagerly, outside a graph)."""
        return any(grid.boundary_due() for grid in self.grids)

    def step(self, input_ids: torch.Tensor) -> torch.Tensor:
        self.state.length += 1
        if len(self.grids) == 1 and self.grids[0].rows is None:
            return self.grids[0].step(input_ids)
        out = None
        for grid in self.grids:
            hidden = grid.step(input_ids[grid.rows])
            if out is None:
                out = hidden.new_empty(self.batch, hidden.shape[-1])
            out[grid.rows] = hidden
        return out

    def replayed(self) -> None:
        """Count a step the engine replayed from its graph (every grid's :meth:`_Grid.step_on_device`)."""
        self.state.length += 1
        for grid in self.grids:
            grid.count()
