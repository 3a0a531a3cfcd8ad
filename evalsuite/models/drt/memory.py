"""DRT's decoding state: a chunk memory (Hu et al., arXiv:2410.01651, §3.2 "Memory Offloading").

Per group of rows that share a chunk grid (:class:`ChunkMemory`):

* per decoder layer, the keys and values of the last ``window`` positions (the sliding window; trimmed copies, so
  it never holds more);
* the lower layers' outputs for the positions of the chunk in progress (encoded when its landmark arrives);
* the chunk store (:class:`ChunkStore`): every completed chunk's keys and values ``[B, N, S, H, hd]``, on the
  compute device or, with ``offload``, in CPU memory (pinned when CUDA is available);
* the landmark embeddings ``[B, N, D]``, always on the compute device (each retrieval scores all of them);
* per retrieval group the current retrieval (made at the last landmark, used by the chunk in progress): indices,
  fusion weights and the retrieved chunks' keys and values, gathered to the compute device once per chunk and group.

:class:`ChunkMemoryState` (``kind="chunk-memory"``) holds one :class:`ChunkMemory` per distinct left-padding
``start``: a padded row's chunk grid starts at its first real token, so rows with different padding cannot share
one grid; each group runs as its own sub-batch (one pass per distinct ``start``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from evalsuite.models.base import DecodeState


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class ChunkStore:
    """Completed chunks' keys and values, appended in order; preallocated for ``capacity`` chunks (grows by doubling)
    and counted by its filled part. ``offload``: kept in CPU memory (pinned if CUDA is available)."""

    def __init__(self, capacity: int, offload: bool):
        self.capacity, self.offload = max(int(capacity), 1), offload
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.num = 0

    def _grow(self, need: int, like: torch.Tensor) -> None:
        size = max(need, self.capacity, 2 * (0 if self.k is None else self.k.shape[1]))
        device = torch.device("cpu") if self.offload else like.device
        pin = self.offload and torch.cuda.is_available()
        shape = (like.shape[0], size, *like.shape[2:])
        k, v = (torch.empty(shape, dtype=like.dtype, device=device, pin_memory=pin) for _ in range(2))
        if self.num:
            k[:, : self.num].copy_(self.k[:, : self.num])
            v[:, : self.num].copy_(self.v[:, : self.num])
        self.k, self.v = k, v

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add chunks ``k, v [B, n, S, H, hd]`` (detached: gradients do not cross calls through the memory)."""
        n = k.shape[1]
        if self.k is None or self.num + n > self.k.shape[1]:
            self._grow(self.num + n, k)
        # A blocking copy: the store is read on the host right after (an offloaded gather indexes it on the CPU).
        self.k[:, self.num : self.num + n].copy_(k.detach())
        self.v[:, self.num : self.num + n].copy_(v.detach())
        self.num += n

    def gather(self, idx: torch.Tensor, device) -> tuple[torch.Tensor, torch.Tensor]:
        """The chunks at ``idx [B, ...]`` (each < ``num``), as ``[B, ..., S, H, hd]`` on ``device``."""
        src = idx.to(self.k.device)
        rows = torch.arange(idx.shape[0], device=src.device).view(-1, *[1] * (idx.dim() - 1))
        return self.k[rows, src].to(device, non_blocking=True), self.v[rows, src].to(device, non_blocking=True)

    def nbytes(self) -> int:
        return 0 if self.k is None else 2 * self.k[:, : self.num].numel() * self.k.element_size()


@dataclass
class Retrieval:
    """The result of retrieval at one or more landmarks: ``indices`` and float32 ``weights`` ``[B, ..., K]`` (an empty
    slot has index 0 and weight 0), the retrieved chunks' ``k, v [B, ..., K, S, H, hd]`` (None when ``K == 0``)."""

    indices: torch.Tensor
    weights: torch.Tensor
    k: torch.Tensor | None
    v: torch.Tensor | None

    @property
    def slots(self) -> int:
        return self.indices.shape[-1]

    def last(self) -> Retrieval:
        """The retrieval at the last landmark of a ``[B, n, ...]`` batch of them, copied out of it, detached."""
        pick = [None if t is None else t[:, -1].detach().clone() for t in (self.indices, self.weights, self.k, self.v)]
        return Retrieval(*pick)

    def nbytes(self) -> int:
        return _nbytes(self.indices, self.weights, self.k, self.v)


class ChunkMemory:
    """The state of one group of rows with a common chunk grid (see the module docstring). ``tokens``: text tokens
    consumed; ``positions``: positions run through the model (text tokens plus landmarks)."""

    def __init__(self, batch: int, num_layers: int, num_groups: int, capacity_chunks: int, offload: bool):
        self.batch, self.offload = batch, offload
        self.tokens = self.positions = 0
        self.window: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * num_layers
        self.partial: torch.Tensor | None = None
        self.landmarks: torch.Tensor | None = None
        self.store = ChunkStore(capacity_chunks, offload)
        self.retrieval: list[Retrieval | None] = [None] * num_groups

    @property
    def num_chunks(self) -> int:
        return self.store.num

    def commit(self, window_kv, partial, landmarks, k_new, v_new, retrievals, positions: int, window: int) -> None:
        """Take one call's results: every layer's keys and values (trimmed to the last ``window`` positions), the
        unfinished chunk's lower outputs, the new chunks (landmarks ``[B, n, D]``, ``k_new, v_new``) and, per group,
        the retrievals made at the call's landmarks (None where it had none)."""
        self.window = [(k[:, -window:].detach().clone(), v[:, -window:].detach().clone()) for k, v in window_kv]
        self.partial = partial.detach().clone() if partial.shape[1] else None
        if landmarks is not None:
            lm = landmarks.detach()
            self.landmarks = lm.clone() if self.landmarks is None else torch.cat([self.landmarks, lm], 1)
            self.store.append(k_new, v_new)
        for g, r in enumerate(retrievals):
            if r is not None:
                self.retrieval[g] = r.last()
        self.positions += positions

    def device_nbytes(self) -> int:
        """Bytes on the compute device: window caches, the unfinished chunk, landmarks, current retrievals, and the
        chunk store unless it is offloaded."""
        total = _nbytes(*(t for kv in self.window if kv is not None for t in kv), self.partial, self.landmarks)
        total += sum(r.nbytes() for r in self.retrieval if r is not None)
        return total + (0 if self.offload else self.store.nbytes())

    def host_nbytes(self) -> int:
        """Bytes of the offloaded chunk store in CPU memory (0 without offloading)."""
        return self.store.nbytes() if self.offload else 0


@dataclass
class RowGroup:
    """Rows of a batch that share one chunk grid: ``rows`` (``[b]`` long, or None for all rows), their left padding
    ``start`` and their :class:`ChunkMemory`."""

    rows: torch.Tensor | None
    start: int
    memory: ChunkMemory


class ChunkMemoryState(DecodeState):
    """DRT's decode state (``kind="chunk-memory"``): one :class:`ChunkMemory` per distinct left padding. ``length``
    counts the tokens consumed, padding included."""

    kind = "chunk-memory"

    def __init__(self, groups: list[RowGroup], batch: int, start: torch.Tensor | None, offload: bool):
        self.groups, self.batch, self.start, self.offload = groups, batch, start, offload
        self.length = 0

    def nbytes(self) -> int:
        """Everything the state holds, on the device and in host memory."""
        return self.device_nbytes() + self.host_nbytes()

    def device_nbytes(self) -> int:
        return sum(g.memory.device_nbytes() for g in self.groups)

    def host_nbytes(self) -> int:
        return sum(g.memory.host_nbytes() for g in self.groups)
