"""Data-parallel runs under ``torchrun``: who this process is, the process group, sharding and gathering.

``torchrun --nproc-per-node N -m evalsuite <task> ...`` starts N copies of the command; each learns its place from
the variables torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``). This
module is the only place that talks to :mod:`torch.distributed`; the runner (:func:`evalsuite.tasks.runner.run_task`)
and the tasks use a :class:`World`, the same way in a plain run and under torchrun:

* :func:`setup` joins the process group once (``cpu:gloo,cuda:nccl`` when CUDA exists, else ``gloo``) and returns
  the :class:`World`; a plain single-process run is :data:`SINGLE`, a world of one rank whose collectives return at
  once, and never touches :mod:`torch.distributed`.
* :meth:`World.shard` gives this rank its share of an ordered list of work units, round-robin. Each run shards the
  units still pending *in that run*, so a rerun with another number of ranks simply deals out what is left.
* :meth:`World.broadcast`, :meth:`World.gather` and :meth:`World.all_gather` move small Python objects between
  ranks; :meth:`World.wait` is the barrier at the end of a rank's share; :meth:`World.agree` and
  :meth:`World.from_main` run a step on every rank or on rank 0 and stop all ranks with one error line if it fails.

Why object collectives go over gloo even on GPUs: what the ranks exchange is small CPU-side data (record keys, a
claim's outcome, a loss batch's float64 NLL rows), and a rank that finishes early may wait for the others far longer
than NCCL's watchdog tolerates. The CUDA backend (NCCL) is registered for GPU tensor collectives; the suite makes none.
"""

from __future__ import annotations

import atexit
import datetime
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from evalsuite.errors import UserError

T = TypeVar("T")
# torchrun sets all four (and LOCAL_RANK); env:// initialisation needs them.
LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# How long a collective may wait for the slowest rank. A rank that finishes its share early waits at the end for the
# others, which can take as long as a few work units (MQAR cells train for hours), so the default is generous; a
# rank that dies does not leave the others waiting, because torchrun then stops the whole group.
TIMEOUT_VAR = "EVALSUITE_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 7 * 24 * 3600


class PeerFailed(Exception):
    """Another rank failed and reports it; this rank stops without repeating the message (``user_error``: the
    failure was bad input, exit status 2, rather than a crash)."""

    def __init__(self, message: str, user_error: bool):
        super().__init__(message)
        self.user_error = user_error


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` ranks (``local_rank``: its index on this host, and its GPU). A world of
    one rank (:data:`SINGLE`) is a plain run: its collectives hand back what they are given."""

    rank: int
    size: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        """Rank 0 claims the run directory, prints progress and writes ``results.json``."""
        return self.rank == 0

    def shard(self, units: Sequence[T]) -> list[T]:
        """This rank's units of ``units`` (an ordered list): every ``size``-th, starting at ``rank``.

        Round-robin over the run order keeps neighbouring units (e.g. NIAH cells of one length, similar in cost)
        on different ranks, so the ranks finish together.
        """
        return list(units[self.rank :: self.size])

    def broadcast(self, obj: T) -> T:
        """Rank 0's ``obj``, on every rank (the others pass anything, e.g. None)."""
        if self.size == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, obj: T) -> list[T] | None:
        """Every rank's ``obj`` in rank order, on rank 0; None on the others."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out = [None] * self.size if self.is_main else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather(self, obj: T) -> list[T]:
        """Every rank's ``obj`` in rank order, on every rank."""
        if self.size == 1:
            return [obj]
        import torch.distributed as dist

        out: list = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def wait(self, interval: float = 0.5) -> None:
        """Return once every rank has called ``wait`` (a barrier that may wait as long as the slowest rank's share
        of the work). Polled rather than blocked on, so this process's other threads (rank 0's progress) run."""
        if self.size == 1:
            return
        import torch.distributed as dist

        work = dist.barrier(async_op=True)
        pause = 0.01  # short at first: when the ranks finish together (one rank: at once) nobody sleeps long
        while not work.is_completed():
            time.sleep(pause)
            pause = min(interval, 2 * pause)
        work.wait()

    def agree(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on every rank and stop all of them if it failed on any: the failing rank with the lowest
        number raises its error, the others :class:`PeerFailed`. For deterministic checks that every rank makes
        (a config's validation), so a bad option gives one error line, not one per rank."""
        value, failure, error = None, None, None
        try:
            value = fn()
        except Exception as e:  # every rank must reach the all_gather below, whatever failed
            user = isinstance(e, UserError)
            failure, error = (str(e) if user else f"{type(e).__name__}: {e}", user), e
        failures = self.all_gather(failure)
        first = next((i for i, f in enumerate(failures) if f is not None), None)
        if first is None:
            return value
        if first == self.rank:
            raise error
        raise PeerFailed(f"rank {first} failed: {failures[first][0]}", failures[first][1])

    def from_main(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 alone and return its value on every rank; if it fails there, rank 0 raises the error
        and the others :class:`PeerFailed` (for the claim of the run directory, the aggregate)."""
        if self.is_main:
            try:
                value = fn()
            except BaseException as e:
                self.broadcast(("error", f"{type(e).__name__}: {e}", isinstance(e, UserError)))
                raise
            return self.broadcast(("ok", value, None))[1]
        status, value, user_error = self.broadcast(None)
        if status != "ok":
            raise PeerFailed(f"rank 0 failed: {value}", bool(user_error))
        return value


SINGLE = World(0, 1, 0)  # a plain run: one rank, collectives that return at once
_state: dict = {"world": None, "owned": False}  # the process group this process joined: a process-wide fact


def launched() -> bool:
    """True when started by torchrun (or anything that sets its variables)."""
    return all(v in os.environ for v in LAUNCH_VARS)


def env_world() -> World | None:
    """The world torchrun describes in the environment, without joining the process group; None if not launched."""
    if not launched():
        return None
    try:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise UserError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (set by torchrun)") from None
    if not 0 <= rank < size:
        raise UserError(f"RANK {rank} is outside WORLD_SIZE {size}")
    return World(rank, size, local)


def setup() -> World:
    """This process's :class:`World`: joins the process group once if torchrun started it; :data:`SINGLE` for a
    plain run, whose collectives never reach :mod:`torch.distributed`.

    A process group the caller initialised already is used as it is (and left to the caller to destroy).
    """
    if _state["world"] is not None:
        return _state["world"]
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():  # a query only: a plain run joins, sends or waits for nothing
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
        _state["world"] = World(dist.get_rank(), dist.get_world_size(), local)
        return _state["world"]
    world = env_world()
    if world is None:
        return SINGLE
    if not dist.is_available():
        raise UserError("this PyTorch build has no torch.distributed; run without torchrun")
    cuda = torch.cuda.is_available()
    if cuda and world.local_rank < torch.cuda.device_count():
        # before NCCL initialises, so its communicator (if one is ever made) binds this rank's GPU
        torch.cuda.set_device(world.local_rank)
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    dist.init_process_group(backend=backend, timeout=datetime.timedelta(seconds=_timeout()))
    _state.update(world=world, owned=True)
    atexit.register(teardown)
    return world


def current() -> World:
    """The world :func:`setup` joined; :data:`SINGLE` when it joined none (a plain run)."""
    return _state["world"] or SINGLE


def teardown() -> None:
    """Leave the process group if :func:`setup` joined it (idempotent; also run at exit)."""
    if _state["owned"]:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    _state.update(world=None, owned=False)


def local_device(device: torch.device) -> torch.device:
    """``cuda`` without an index means this rank's GPU, ``cuda:LOCAL_RANK``, under torchrun; anything else stays."""
    world = env_world()
    if world is None or device.type != "cuda" or device.index is not None:
        return device
    count = torch.cuda.device_count()
    if world.local_rank >= count:
        raise UserError(
            f"LOCAL_RANK {world.local_rank} has no GPU of its own ({count} visible); start at most {count} processes "
            "per node, or name the GPU (--device cuda:N)"
        )
    return torch.device("cuda", world.local_rank)


def _timeout() -> float:
    raw = os.environ.get(TIMEOUT_VAR)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1
    if value <= 0:
        raise UserError(f"{TIMEOUT_VAR} must be a positive number of seconds, got {raw!r}")
    return value
