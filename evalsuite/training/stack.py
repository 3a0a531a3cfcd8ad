"""C models of one architecture and shape trained as one: a stacked model, its AdamW and its optimizer step.

A sweep's cells that differ only in learning rate or seed (:mod:`evalsuite.tasks.mqar`) are the same computation on
different numbers. Alone, each small model's step is hundreds of small kernels; stacked, every parameter gains a
leading cell dimension ``[C, ...]`` and one step runs the C models at once: ``torch.vmap`` over the cells of
``torch.func.functional_call`` on one of the models, so the model code stays as it is, its Linears become batched
GEMMs and the attention kernels fold the cells into their batch (their vmap rules, :mod:`evalsuite.kernels.cells`).
Each cell keeps its own numbers: its loss, gradient norm and clipping (its own global norm), its AdamW moments and
learning rate (:class:`StackedAdamW`, a ``[C]`` rate), and a cell that has finished stops changing (learning rate 0).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from evalsuite.errors import UserError
from evalsuite.training.train_step import EagerStep, GraphedStep, autocast


class _Loss(nn.Module):
    """``loss_fn(model, inputs, labels)`` as a module, so that ``functional_call`` can swap the model's parameters
    for the whole loss (forward and LM head)."""

    def __init__(self, model: nn.Module, loss_fn: Callable):
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, inputs, labels):
        return self.loss_fn(self.model, inputs, labels)


class StackedModel(nn.Module):
    """``models`` (C of one architecture and shape, on one device) as one module: ``forward(inputs [C, B, T],
    labels [C, B, T]) -> [C]``, each cell's ``loss_fn(model, inputs, labels)`` on its own rows.

    The parameters are the models' stacked (``stacked[i]``: ``[C, *shape]`` of the ``i``-th of ``names``; a tied LM
    head is one parameter, as in each model), all views of one float32 ``flat`` ``[C, N]`` tensor, so that the
    optimizer and the clipping treat every parameter of a cell in a few kernels (:class:`StackedAdamW`); buffers
    (gate biases, slopes) must be equal across the models and are shared. The first model lends its structure to
    every call; each model receives its cell's weights on :meth:`cell` (to evaluate it, or at the end). The models
    are not submodules, so their own parameters stay out of :meth:`parameters`; the stack stays on their device.
    """

    def __init__(self, models: Sequence[nn.Module], loss_fn: Callable):
        super().__init__()
        if not models:
            raise ValueError("a stack needs at least one model")
        base = models[0]
        for name, buffer in base.named_buffers():
            if any(not torch.equal(buffer, m.get_buffer(name)) for m in models[1:]):
                raise UserError(f"the models differ in buffer {name}: they cannot train as one stack")
        params, _ = torch.func.stack_module_state(list(models))
        if any(p.dtype != torch.float32 for p in params.values()):
            raise UserError("a stack trains float32 parameters")
        self.names, self.cells = list(params), len(models)
        self.flat = torch.cat([params[n].detach().reshape(self.cells, -1) for n in self.names], 1)  # [C, N]
        sizes = [params[n][0].numel() for n in self.names]
        self.offsets = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        self.stacked = nn.ParameterList([
            nn.Parameter(self.flat[:, a:b].view(params[n].shape))
            for n, a, b in zip(self.names, self.offsets, self.offsets[1:], strict=False)
        ])  # fmt: skip
        object.__setattr__(self, "models", list(models))  # not submodules (see the class docstring)
        object.__setattr__(self, "_loss", _Loss(base, loss_fn))

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        buffers = {f"model.{n}": b for n, b in self._loss.model.named_buffers()}

        def one(params, x, y):
            named = {f"model.{n}": p for n, p in zip(self.names, params, strict=True)}
            return torch.func.functional_call(self._loss, (named, buffers), (x, y))

        return torch.vmap(one)(list(self.stacked), inputs, labels)

    def flat_grad(self) -> torch.Tensor:
        """The parameters' gradients as one ``[C, N]`` tensor, laid out as :attr:`flat` (zeros where none)."""
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.stacked]
        return torch.cat([g.reshape(self.cells, -1) for g in grads], 1)

    def decayed(self, min_dims: int) -> torch.Tensor:
        """``[N]`` bool: the columns of :attr:`flat` that belong to parameters of at least ``min_dims`` dimensions per
        cell."""
        out = torch.zeros(self.flat.shape[1], dtype=torch.bool, device=self.flat.device)
        for p, a, b in zip(self.stacked, self.offsets, self.offsets[1:], strict=False):
            out[a:b] = p.ndim - 1 >= min_dims
        return out

    def cell(self, c: int) -> nn.Module:
        """Model ``c`` with its cell's current weights (copied in: later steps leave it alone)."""
        model = self.models[c]
        with torch.no_grad():
            for name, stacked in zip(self.names, self.stacked, strict=True):
                model.get_parameter(name).copy_(stacked[c])
        return model


class StackedAdamW:
    """AdamW (Loshchilov & Hutter, arXiv:1711.05101) per cell of a :class:`StackedModel`, on its ``flat`` ``[C, N]``
    parameters: the learning rate is a ``[C]`` tensor (``param_groups[0]["lr"]``, filled in place by a CUDA graph's
    step, training/train_step.py), the moments are per element, hence per cell. The arithmetic is torch's AdamW's
    (decoupled decay ``p *= 1 - lr wd``, bias-corrected moments), in about twenty kernels whatever the model, on
    device tensors only, so a CUDA graph can capture it. ``decay_dims``: weight decay on parameters of at least that
    many dimensions per cell (2: matrices and embeddings; 0: all)."""

    def __init__(self, stack: StackedModel, lrs: Sequence[float], *, weight_decay: float, betas: tuple[float, float],
                 eps: float, decay_dims: int = 2):  # fmt: skip
        flat = stack.flat
        self.stack, self.betas, self.eps = stack, tuple(betas), eps
        self.param_groups = [{"lr": torch.tensor(lrs, dtype=torch.float32, device=flat.device)}]
        self.weight_decay = stack.decayed(decay_dims).float() * weight_decay  # [N]
        zeros = torch.zeros_like(flat)
        step = torch.zeros((), dtype=torch.float32, device=flat.device)
        self.state = {"flat": {"step": step, "exp_avg": zeros, "exp_avg_sq": zeros.clone()}}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.stack.parameters():
            p.grad = None

    @torch.no_grad()
    def step(self, grad: torch.Tensor) -> None:
        """One update from the flat gradient ``grad`` ``[C, N]``."""
        beta1, beta2 = self.betas
        state, p = self.state["flat"], self.stack.flat
        lr = self.param_groups[0]["lr"].view(-1, 1)  # [C, 1]
        state["step"].add_(1)
        p.mul_(1 - lr * self.weight_decay)
        state["exp_avg"].lerp_(grad, 1 - beta1)
        state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        bias1, bias2 = 1 - torch.pow(beta1, state["step"]), 1 - torch.pow(beta2, state["step"])
        denom = (state["exp_avg_sq"].sqrt() / bias2.sqrt()).add_(self.eps)
        p.sub_(state["exp_avg"] / denom * (lr / bias1))

    def state_dict(self) -> dict:
        return {"lr": self.param_groups[0]["lr"], **self.state["flat"]}

    def load_state_dict(self, state: dict) -> None:
        self.param_groups[0]["lr"].copy_(state["lr"])
        for key, value in self.state["flat"].items():
            value.copy_(state[key])


class StackStep(EagerStep):
    """:class:`EagerStep` for a :class:`StackedModel` (``loss_fn(stack, inputs, labels) -> [C]``, ``lr`` a ``[C]``
    device tensor): ``loss_sum`` and ``grad_norm`` are ``[C]``; each cell is clipped at its own global norm (as
    ``clip_grads_with_norm_`` clips one model). A finished cell gets learning rate 0 from the caller: its weights
    then stay exactly as they are (decay ``1 - 0·wd``, update ``0·m/√v``)."""

    def __init__(self, model: StackedModel, optimizer: StackedAdamW, loss_fn: Callable, grad_clip: float | None,
                 amp_dtype: torch.dtype | None):  # fmt: skip
        super().__init__(model, optimizer, loss_fn, grad_clip, amp_dtype)
        self.loss_sum = torch.zeros(model.cells, device=self.device)
        self.grad_norm = torch.zeros(model.cells, device=self.device)

    def update(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        with autocast(self.amp_dtype, self.device, self.autocast_cache):
            losses = self.loss_fn(self.model, inputs, labels)  # [C]
        losses.sum().backward()  # the cells are independent: each gets its own loss's gradient
        grad = self.model.flat_grad()
        norm = torch.linalg.vector_norm(grad, dim=1)
        if self.grad_clip is not None:  # clip_grads_with_norm_'s coefficient, per cell
            grad.mul_((self.grad_clip / (norm + 1e-6)).clamp(max=1.0).view(-1, 1))
        self.grad_norm.copy_(norm)
        self.optimizer.step(grad)
        self.loss_sum.add_(losses.detach())


class GraphedStackStep(GraphedStep, StackStep):
    """:class:`StackStep` captured as one CUDA graph (:class:`GraphedStep`'s capture and replay)."""
