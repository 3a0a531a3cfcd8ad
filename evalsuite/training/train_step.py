"""The optimizer step of :func:`evalsuite.training.train.train`, eager or captured as one CUDA graph.

A step of a few-million-parameter model (an MQAR cell) is hundreds of small kernel launches: forward, backward,
clipping and AdamW. :class:`GraphedStep` records the whole step once as a CUDA graph and replays it per step, so a
step costs one launch plus copying the batch and the learning rate into the graph's static inputs: 1.4-2.8x faster
on an H100 at the gsa-paper MQAR cell, whose remaining time is the GPU's own memory-bound elementwise work, which
``torch.compile`` fuses (results/mqar/step_time/h100-graphs-compile/ at commit 164742b). Both steppers run the same
:meth:`EagerStep.update`, so they train identically (bit-identical there).

Capture needs a ``loss_fn`` that never waits on the host and keeps its shapes (no boolean-mask indexing:
:func:`.train.gathered_cross_entropy`), batches of one shape, and an optimizer whose learning rate is a
device tensor (``make_optimizer(..., capturable=True)``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import torch
from torch import nn

# Warmup and capture are serialised within a process (cells may train in threads, training/pool.py): a capture must
# not see another thread's allocations on its private memory pool, and torch.compile runs one compile at a time.
_CAPTURE_LOCK = threading.Lock()


def autocast(dtype: torch.dtype | None, device: torch.device, cache_enabled: bool = True):
    """Autocast to ``dtype`` on ``device``; a no-op context for ``None`` (full precision)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache_enabled)


class EagerStep:
    """``step(inputs, labels, lr)``: one optimizer step on a ``[B, T]`` batch at learning rate ``lr``.

    ``loss_sum`` accumulates the training loss over steps on the device (the loop reads and zeroes it at log
    steps, the one host sync); ``grad_norm`` holds the last gradient norm (before clipping, where the recipe clips;
    measured without clipping too, so that a spike before a collapse shows in the history).
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
        grad_clip: float | None,
        amp_dtype: torch.dtype | None,
    ):
        self.model, self.optimizer, self.loss_fn = model, optimizer, loss_fn
        self.grad_clip, self.amp_dtype = grad_clip, amp_dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = self.params[0].device
        self.loss_sum = torch.zeros((), device=self.device)
        self.grad_norm = torch.zeros((), device=self.device)

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.update(inputs, labels)
        self.optimizer.zero_grad(set_to_none=True)

    autocast_cache = True  # autocast's cache of weights cast to amp_dtype, kept for one forward/backward

    def update(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        """Forward, backward, clip, optimizer step; the loss is added to ``loss_sum``."""
        with autocast(self.amp_dtype, self.device, self.autocast_cache):
            loss = self.loss_fn(self.model, inputs, labels)
        loss.backward()
        norm = torch.nn.utils.get_total_norm([p.grad for p in self.params if p.grad is not None])
        if self.grad_clip is not None:  # what clip_grad_norm_ does, given the norm taken either way
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, norm)
        self.grad_norm.copy_(norm)
        self.optimizer.step()
        self.loss_sum.add_(loss.detach())


class GraphedStep(EagerStep):
    """The same step, captured as a CUDA graph on the first call and replayed after.

    Before capture, two untimed forward/backward passes on a side stream compile and autotune the kernels, and one
    optimizer step at learning rate 0 creates AdamW's state (exactly a no-op on the weights: decay ``1 - 0·wd``, update
    ``0·m/√v``), which is then zeroed so training starts from a fresh optimizer. Gradients live in the graph's memory
    and are overwritten, never zeroed, by each replay.
    """

    graph: torch.cuda.CUDAGraph | None = None
    # Casts cached by autocast would go stale across replays. Off in the warmup too, so that a torch.compile'd loss
    # sees one autocast state (it guards on it) and compiles once.
    autocast_cache = False

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor, lr: float) -> None:
        if self.graph is None:
            self._capture(inputs, labels)
        self.inputs.copy_(inputs, non_blocking=True)
        self.labels.copy_(labels, non_blocking=True)
        self._set_lr(lr)
        self.graph.replay()

    def _set_lr(self, lr: float | torch.Tensor) -> None:
        """Fill the graph's learning rates: a float, or a tensor (a stack's ``[C]`` rates, training/stack.py)."""
        for group in self.optimizer.param_groups:
            if not torch.is_tensor(group["lr"]):
                raise ValueError("GraphedStep needs an optimizer with a tensor learning rate (capturable=True)")
            if torch.is_tensor(lr):
                group["lr"].copy_(lr, non_blocking=True)
            else:
                group["lr"].fill_(lr)

    def _capture(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        with _CAPTURE_LOCK:
            self.inputs, self.labels = inputs.clone(), labels.clone()
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    with autocast(self.amp_dtype, self.device, self.autocast_cache):
                        loss = self.loss_fn(self.model, self.inputs, self.labels)
                    loss.sum().backward()  # a stack's loss is one per cell (training/stack.py)
                    self.optimizer.zero_grad(set_to_none=True)
                self._set_lr(0.0)
                self.update(self.inputs, self.labels)
                self.optimizer.zero_grad(set_to_none=True)
                for state in self.optimizer.state.values():
                    for value in state.values():
                        if torch.is_tensor(value):
                            value.zero_()
                self.loss_sum.zero_()
                self.grad_norm.zero_()
            torch.cuda.current_stream(self.device).wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.update(self.inputs, self.labels)
