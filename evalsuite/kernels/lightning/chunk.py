"""Lightning Attention over a full sequence (Algorithm 5 forward, Algorithm 6 backward), with autograd.

Public entry point: :func:`lightning_chunk_triton`. Every pass is one launch of the walk kernel (:mod:`.walk`) or
the segment scan (:mod:`.scan`); chunking and numerics are described in :mod:`.common`. With ``S`` the state
``[dk, dv]`` and ``D`` its adjoint (the gradient arriving from later positions):

* forward: segment totals of ``S`` (walk of k, v), the scan from h0 (the state entering each segment and the final
  state), then ``O`` (walk of q, k, v from the entering states);
* backward: segment totals of ``D`` (reverse walk of q, dO), the reverse scan from the final state's gradient (the
  adjoint entering each segment from its right, and the gradient of h0), then ``dQ`` (forward walk of dO, v, k with
  ``S^T``), ``dK`` (reverse walk of v, dO, q with ``D^T``) and ``dV`` (reverse walk of k, q, dO with ``D``).

Memory: the forward keeps only the float32 segment states ``[B*H, T/(64 G), dk, dv]`` (16 bytes per position and
head at dk = dv = 64 and G = 16, on GPU) besides q, k, v; no per-chunk state is ever written.
"""

from __future__ import annotations

import torch

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import fold_rule
from evalsuite.kernels.lightning import common
from evalsuite.kernels.lightning.scan import segment_scan
from evalsuite.kernels.lightning.walk import walk


def _segment_buffer(B, T, H, dk, dv, chunks, device):
    NSEG = common.geometry(T, chunks)[3]
    return triton_utils.empty((B * H, NSEG, dk, dv), torch.float32, device)


def chunk_fwd(q, k, v, slope, h0, output_final_state: bool, config):
    """The three forward launches, with ``config`` (a :class:`~common.LaunchConfig`). Returns ``(o [B, T, H, dv],
    final state or None, seg, chunks)`` where ``seg`` ``[B*H, NSEG, dk, dv]`` float32 holds the state entering each
    segment and ``chunks = (BT, G)`` is the chunking (both saved for the backward, which walks the same chunks and
    segments)."""
    B, T, H, DK = q.shape
    chunks = common.chunking(T, B * H, config)
    seg = _segment_buffer(B, T, H, DK, v.shape[-1], chunks, q.device)
    walk(None, k, v, seg, slope, chunks, config, reverse=False, totals=True)
    ht = segment_scan(seg, h0, slope, T, H, chunks, config, reverse=False, store_out=output_final_state)
    o = walk(q, k, v, seg, slope, chunks, config, reverse=False, totals=False)
    return o, ht, seg, chunks


def chunk_bwd(do, dht, q, k, v, slope, seg, chunks, need_dh0: bool, config):
    """Gradients of :func:`chunk_fwd` (module doc). ``seg``: the forward's entering segment states; ``dht``: the
    final state's gradient or None. Returns ``(dq, dk, dv, dh0 or None)``."""
    B, T, H, DK = q.shape
    dseg = _segment_buffer(B, T, H, DK, v.shape[-1], chunks, q.device)
    walk(None, q, do, dseg, slope, chunks, config, reverse=True, totals=True)
    dh0 = segment_scan(dseg, None if dht is None else dht.float(), slope, T, H, chunks, config, reverse=True,
                       store_out=need_dh0)  # fmt: skip
    dq = walk(do, v, k, seg.transpose(2, 3), slope, chunks, config, reverse=False, totals=False)
    dk = walk(v, do, q, dseg.transpose(2, 3), slope, chunks, config, reverse=True, totals=False)
    dv = walk(k, q, do, dseg, slope, chunks, config, reverse=True, totals=False)
    return dq, dk, dv, dh0


class LightningChunkFunction(torch.autograd.Function):
    """Autograd wrapper of :func:`chunk_fwd` / :func:`chunk_bwd`; returns ``(o, final state or None, seg)``.

    Saves q, k, v, the slopes, the float32 segment states ``seg`` (an output so that it can be saved; not
    differentiable), the chunking and the launch settings (``override``: a :class:`~common.LaunchConfig`, or None for
    the shipped one); gradients flow to q, k, v and the initial state (also through the returned final state); the
    slopes get none. Under ``torch.vmap`` (the cells of a stacked model) the cells fold into the batch
    (:mod:`evalsuite.kernels.cells`); the chunking then follows the folded batch, so the states' float32 sums may
    round differently from a cell's own call.
    """

    @staticmethod
    def forward(q, k, v, slope, h0, output_final_state, override):
        o, ht, seg, _ = chunk_fwd(q, k, v, slope, h0, output_final_state, _launch(override))
        return o, ht, seg

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, slope, _, _, override = inputs
        seg = output[2]
        ctx.save_for_backward(q, k, v, slope, seg)
        ctx.mark_non_differentiable(seg)
        B, T, H, _ = q.shape
        ctx.chunks, ctx.override = common.chunking(T, B * H, _launch(override)), override  # as chunk_fwd chose
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, do, dht, _dseg):
        q, k, v, slope, seg = ctx.saved_tensors
        need_dh0 = ctx.needs_input_grad[4]
        do = torch.zeros_like(v) if do is None else do.to(v.dtype)  # the walks' dots take one dtype
        dq, dk, dv, dh0 = chunk_bwd(do, dht, q, k, v, slope, seg, ctx.chunks, need_dh0, _launch(ctx.override))
        return dq, dk, dv, None, dh0, None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, slope, h0, output_final_state, override):
        args = (q, k, v, slope, h0, output_final_state, override)
        return fold_rule(LightningChunkFunction.apply, info, in_dims, args, batched=(0, 1, 2, 4))


def _launch(override):
    return override if override is not None else common.launch_config()


def lightning_chunk_triton(q, k, v, slope, initial_state=None, output_final_state: bool = False, config=None):
    """Decayed causal linear attention over a full sequence, differentiable in q, k, v and the initial state.

    Args:
        q, k: ``[B, T, H, dk]``; v: ``[B, T, H, dv]`` -- one dtype of bf16/fp16/fp32, any strides;
            dk, dv in :data:`~evalsuite.kernels.lightning.common.HEAD_DIMS` (powers of two 16..256, dk != dv allowed).
        slope: ``[H]`` (>= 0), ``lambda = exp(-slope)``; no gradient.
        initial_state: ``[B, H, dk, dv]`` (taken as float32) or None (zeros).
        output_final_state: also return the state after the last position.
        config: a :class:`~evalsuite.kernels.lightning.common.LaunchConfig` (tuning, tests); default the shipped one.
    Returns:
        ``(o [B, T, H, dv]`` in v's dtype, ``kv [B, H, dk, dv]`` float32 or None).
    """
    common.check_inputs(q, k, v, slope, initial_state)
    B, T, H, DK = q.shape
    h0 = None if initial_state is None else initial_state.float()
    if T == 0:
        if not output_final_state:
            return v.new_zeros(v.shape), None
        return v.new_zeros(v.shape), (h0 if h0 is not None else q.new_zeros(B, H, DK, v.shape[-1], dtype=torch.float32))
    o, ht, _ = LightningChunkFunction.apply(q, k, v, common.slope_f32(slope, q.device), h0, output_final_state, config)
    return o, ht
