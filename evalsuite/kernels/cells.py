"""The kernels under ``torch.vmap`` over the cells of a stacked model (:mod:`evalsuite.training.stack`).

A stack of C models of one shape trains as one model: ``torch.vmap`` over the cells turns each Linear into a batched
GEMM, but an opaque kernel (a Triton launch inside an ``autograd.Function`` or a ``torch.library`` operator) needs a
rule for the extra dimension. Every kernel here treats its batch rows independently, so its rule folds the cells into
the batch (``[C, B, ...] -> [C*B, ...]``), calls the kernel once and unfolds its outputs: each cell gets exactly what
its own call would give. :func:`fold_rule` is that rule; the Functions' ``vmap`` staticmethods and the operators'
``register_vmap`` call it. The backward needs none: autograd records the folded call below the vmap level, so the
backward runs on plain tensors.

:func:`per_cell` is the other way, for PyTorch code that vmap cannot batch (a branch on a tensor's value, as the GSA
reference's chunk form): under vmap the function runs once per cell, exactly as alone; outside it runs as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def cells_first(x: torch.Tensor, bdim: int | None, cells: int) -> torch.Tensor:
    """``x`` with its cell dimension ``bdim`` moved to the front (None: not batched, the same for every cell)."""
    return x.expand(cells, *x.shape) if bdim is None else x.movedim(bdim, 0)


def fold(x: torch.Tensor | None, bdim: int | None, cells: int) -> torch.Tensor | None:
    """``x`` with its cell dimension ``bdim`` (see :func:`cells_first`) merged into its leading batch dimension:
    ``[C, B, ...] -> [C*B, ...]``."""
    return None if x is None else cells_first(x, bdim, cells).flatten(0, 1)


def unfold(y, cells: int):
    """The inverse of :func:`fold` on an output: ``[C*B, ...] -> [C, B, ...]`` (a view); anything but a tensor as it
    is. An output whose leading dimension is the batch times something (``[B*H, ...]``) unfolds the same way: the
    cells are its outermost index."""
    return y.unflatten(0, (cells, -1)) if torch.is_tensor(y) else y


def fold_rule(fn: Callable, info, in_dims: Sequence[int | None], args: Sequence, batched: Sequence[int]):
    """A vmap rule: ``fn(*args)`` with the arguments at positions ``batched`` (tensors with a leading batch dimension,
    or None) folded, the others passed as they are; returns ``(outputs, out_dims)`` with every output tensor
    unfolded (``out_dims`` 0, None for a None output). An argument outside ``batched`` that differs per cell (a
    batched per-head table, say) has no folded form: a ValueError names its position."""
    cells = info.batch_size
    for i, dim in enumerate(in_dims):
        if dim is not None and i not in batched:
            raise ValueError(f"argument {i} differs per cell, but the kernel takes one value for the whole batch")
    folded = [fold(a, in_dims[i], cells) if i in batched else a for i, a in enumerate(args)]
    out = fn(*folded)
    if isinstance(out, tuple):
        return tuple(unfold(o, cells) for o in out), tuple(0 if torch.is_tensor(o) else None for o in out)
    return unfold(out, cells), 0


class _PerCell(torch.autograd.Function):
    """``fn(*tensors)`` with its autograd graph kept inside (``box`` holds it for the backward), so that the ``vmap``
    rule can run it once per cell. Outputs: a tensor or a tuple of tensors and Nones."""

    @staticmethod
    def forward(fn, box, *tensors):
        with torch.enable_grad():
            leaves = [None if t is None else t.detach().requires_grad_(t.requires_grad) for t in tensors]
            out = fn(*leaves)
        box.append((leaves, out))
        return tuple(None if o is None else o.detach() for o in out) if isinstance(out, tuple) else out.detach()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.box = inputs[1]
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, *grads):
        leaves, out = ctx.box[0]
        outs = out if isinstance(out, tuple) else (out,)
        pairs = [
            (o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o is not None and o.requires_grad
        ]
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
        return None, None, *(next(found) if t is not None and t.requires_grad else None for t in leaves)

    @staticmethod
    def vmap(info, in_dims, fn, box, *tensors):
        cells = info.batch_size
        full = [None if t is None else cells_first(t, d, cells) for t, d in zip(tensors, in_dims[2:], strict=True)]
        outs = [_PerCell.apply(fn, [], *(None if t is None else t[c] for t in full)) for c in range(cells)]
        if not isinstance(outs[0], tuple):
            return torch.stack(outs), 0
        stacked = tuple(None if o[0] is None else torch.stack(o) for o in zip(*outs, strict=True))
        return stacked, tuple(None if o is None else 0 for o in stacked)


def per_cell(fn: Callable, *tensors: torch.Tensor | None):
    """``fn(*tensors)``, differentiable; under ``torch.vmap`` one call per cell (module docstring). ``fn`` returns a
    tensor or a tuple of tensors and Nones."""
    return _PerCell.apply(fn, [], *tensors)
