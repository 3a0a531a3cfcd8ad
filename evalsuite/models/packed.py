"""One GEMM for several linear maps of the same input, without copying their weights.

At batch 1 a decode step multiplies one row by every weight matrix, and cuBLAS runs each of these small GEMVs far
below the memory bandwidth: in the 760M FoX (Pro) the seven maps of a layer's normed input (q, k, v, the two
KV-shift mixers, the forget and output gates) took 38% of a compiled step at about 5 us each
(``results/bench/h100/profile-step/`` at commit 164742b). Stacked, they are one GEMV that reads the same bytes at a
higher rate.

:class:`PackedLinears` stacks the weights (and biases) into one buffer and points each module's parameters at its
rows of it (``param.data``), so nothing is duplicated and the modules, their state dicts, the forward pass and
any optimizer holding the parameters work as before. Whatever gives a parameter storage of its own again
(``.to()``, ``load_state_dict`` into a new model, assigning ``.data``) breaks the stacking; :meth:`ensure` notices
and stacks again.

The stacked maps and, through :func:`decode_linear`, a decode step's other maps go through
:func:`evalsuite.kernels.gemv.few_row_linear`: the few-row Triton kernel on CUDA where it measured faster than cuBLAS,
``F.linear`` elsewhere.
"""

from __future__ import annotations

import torch
from torch import nn

from evalsuite.kernels.gemv import few_row_linear


class PackedLinears:
    """The linear maps ``linears`` (by name, all of one input width, dtype and device) as one GEMM.

    ``packed(x)`` returns ``{name: linears[name](x)}`` computed as ``x @ W.T + b`` over the stacked weight ``W``
    ``[sum of out_features, in_features]`` (maps without a bias get zeros in ``b``).
    """

    def __init__(self, linears: dict[str, nn.Linear]):
        self.linears = dict(linears)
        self.sizes = [lin.out_features for lin in self.linears.values()]
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None
        self.ensure()

    def _rows(self):
        """(module, first row, row count) of every map in the stacked weight."""
        start = 0
        for lin, n in zip(self.linears.values(), self.sizes, strict=True):
            yield lin, start, n
            start += n

    def intact(self) -> bool:
        """Whether every parameter is still its rows of the stacked buffers (same storage, place, dtype)."""
        if self.weight is None:
            return False
        for lin, start, n in self._rows():
            if not _is_rows(lin.weight, self.weight, start, n):
                return False
            if lin.bias is not None and not _is_rows(lin.bias, self.bias, start, n):
                return False
        return True

    def ensure(self) -> None:
        """Stack the weights (again) unless they are stacked already."""
        if self.intact():
            return
        # Real tensors even when called under inference mode, so the model can still be trained afterwards.
        with torch.no_grad(), torch.inference_mode(False):
            weight = torch.cat([lin.weight.detach() for lin in self.linears.values()])
            biases = [lin.bias for lin in self.linears.values()]
            bias = None
            if any(b is not None for b in biases):
                parts = zip(biases, self.sizes, strict=True)
                bias = torch.cat([weight.new_zeros(n) if b is None else b.detach() for b, n in parts])
            for lin, start, n in self._rows():
                lin.weight.data = weight[start : start + n]
                if lin.bias is not None:
                    lin.bias.data = bias[start : start + n]
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """x: ``[..., in_features]`` -> ``{name: [..., out_features of that map]}``."""
        y = few_row_linear(x, self.weight, self.bias)
        return dict(zip(self.linears, y.split(self.sizes, -1), strict=True))


def _is_rows(param: torch.Tensor, buffer: torch.Tensor | None, start: int, n: int) -> bool:
    """Whether ``param`` is exactly rows ``start : start + n`` of ``buffer``."""
    if buffer is None or param.dtype != buffer.dtype or param.device != buffer.device:
        return False
    rows = buffer[start : start + n]
    return param.data_ptr() == rows.data_ptr() and param.shape == rows.shape and param.stride() == rows.stride()


def is_decode_step(x: torch.Tensor) -> bool:
    """Whether a forward of ``x [B, T, D]`` is a decode step: one token, no gradient."""
    return x.shape[-2] == 1 and not torch.is_grad_enabled()


def step_uses_pack(pack: PackedLinears | None, x: torch.Tensor) -> bool:
    """Whether a forward of ``x [B, T, D]`` takes ``pack``: a decode step (:func:`is_decode_step`). A forward that
    trains must not: the stacked buffer is not a Parameter, so its GEMM would give the maps no gradient."""
    return pack is not None and is_decode_step(x)


def decode_linear(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """``linear(x)`` for x ``[B, T, in_features]``; a one-token forward with no gradient (a decode step) goes through
    :func:`~evalsuite.kernels.gemv.few_row_linear`. Other forwards call the module: training, prefill and the
    stacked cells' vmap."""
    if is_decode_step(x):
        return few_row_linear(x, linear.weight, linear.bias)
    return linear(x)
