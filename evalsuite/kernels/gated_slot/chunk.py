"""Chunked Gated Slot Attention in Triton: forward and backward (an autograd function), GSA Algorithm 1.

Entry point: :func:`gsa_chunk_triton` ``(q, k, v, log_alpha, scale, initial_state, output_final_state) -> (o, state)``
with the shapes and semantics of :func:`evalsuite.kernels.gated_slot.reference.gsa_recurrent`. Differentiable in
q, k, v, log_alpha and the initial state, and through the returned final state.

Design (kernels in :mod:`.state_kernels` and :mod:`.chunk_kernels`, helpers and block configs in :mod:`.common`):

* Chunks of ``CHUNK`` rows (64 on GPU, 32 under the interpreter), sub-chunks of ``SUB`` = 16, micro-blocks of 4.
  The log-gate cumsums within a chunk are taken in registers (float32) by every kernel that needs them; nothing
  is precomputed. The per-chunk kernels multiply ``[C, C] x [C, .]`` tiles with tl.dot (bf16/fp16 operands on the
  tensor cores, fp32 accumulation), one product per block of each level (chunk_kernels).
* The state scans (state_kernels), one launch each while many heads and batches fill the GPU: grid
  ``(dk/BD + dv/BD, 1, B*H)``, each program a sequential walk over all chunks. A long sequence over few heads would
  leave the GPU nearly idle and take time in proportion to T, so there (``common.segment_chunks``) a scan is three
  launches: walks of every segment of ``SEGC`` chunks from zero (local states and the segment's end value), the
  scan across segments (``_segment_scan_kernel``: the value entering each one) and a fix-up of every chunk's state
  in parallel (``_segment_fixup_kernel``); each walk's length and the number of walks then stay the same at any T
  for a fixed B*T.
* Forward, 4 launches (6 with segments): (1) ``_state_fwd_kernel``: both passes' chunk-start states (the two
  passes' states depend only on k, v, alpha); (2) ``_read_kernel``, grid ``(NT, m/BM, B*H)``: the pass-1 logits
  ``z = scale * hk^T q`` (float32, kept for backward); (3) ``_pair_kernel``, grid ``(NT, B*H)``: each chunk's pair
  matrix of p = softmax(z) (float32 ``[C, C]`` a chunk, kept for backward); (4) ``_write_kernel``, grid
  ``(NT, dv/BD, B*H)``: ``o = hv^T softmax(z)``, with the softmax over the m slots taken in the kernel. The state
  buffers are then freed (checkpoint level 2: backward saves q, k, v, log_alpha, z, the pair matrix and the initial
  state).
* Backward, 8 launches (12 with segments): the states again (1); ``dp = hv do`` by the read kernel (2); both state
  adjoints in one reverse scan (3, ``_state_bwd_kernel``: pass 2 from p and dO, pass 1 from
  ``e = scale * dsoftmax(z; dp)``, which it forms on the fly); the pair matrix of e (4); dq (write kernel with
  u = e), dk and dv (``_write_rev_kernel`` with the pair matrices of e and p, 5-7); and the log-gate gradient (8,
  ``_dgate_kernel``): ``dL/ds`` of both passes plus the reversed-cumsum identity of Algorithm 1
  (arXiv:2409.07146 App. B), whose part from later chunks is read off the chunk-end states and adjoints instead
  of a scan over T.
* No PyTorch math runs between launches except the allocations and the transposes of the small states.
* Numerical safety: every factor any kernel takes stays within float32's range (the state scans' exponents are
  ``<= 0``, across segments too; the per-chunk kernels factor decays at block boundaries, see chunk_kernels), so
  saturated gates are exact; log alpha is clamped at ``LOG_ALPHA_FLOOR`` (below), which also bounds the
  in-micro-block factors.

Head dims dk, dv in {16, ..., 512} and slots m in {16, 32, 64, 128} (powers of two; others raise ValueError).
"""

from __future__ import annotations

import torch
import triton

from evalsuite.kernels import triton_utils
from evalsuite.kernels.cells import fold_rule
from evalsuite.kernels.gated_slot.chunk_kernels import (
    _dgate_kernel,
    _pair_kernel,
    _read_kernel,
    _write_kernel,
    _write_rev_kernel,
)
from evalsuite.kernels.gated_slot.common import check_dtypes, check_sizes, config, dot_flags, read_tiles, segment_chunks
from evalsuite.kernels.gated_slot.reference import _check
from evalsuite.kernels.gated_slot.state_kernels import (
    _segment_fixup_kernel,
    _segment_scan_kernel,
    _state_bwd_kernel,
    _state_fwd_kernel,
)

F32 = torch.float32
# log alpha is clamped at LOG_ALPHA_FLOOR = -20 by every kernel as it loads it (common.G_FLOOR; reference.py clamps
# the same way): alpha = 2e-9 keeps less than 1/50 of a float32 ulp of the old state, so the result is the exact one
# to float32 precision, and the in-chunk cumsum b stays within 64 * 20 (its rounding, ulp(b), is the error of every
# decay factor exp(b_r - b_s) taken as a difference; unclamped, one saturated gate of -1e4 would leave the rest of its
# chunk with decay errors of order 1), and a micro-block's larger decay factor stays below e^(3 * 20) (common.MICRO).
# The gradient of a clamped entry is 0, as through torch.clamp (the dgate kernel).


def _dims(k, v, g, cfg):
    B, T, H, DK = k.shape
    return B, T, H, DK, v.shape[-1], g.shape[-1], triton.cdiv(T, cfg["CHUNK"])


def _scan(kernel, inputs, scalars, init, outs, final, T, H, BH, M, cfg, reverse, **flags):
    """Both passes' state scan ``kernel`` (``_state_fwd_kernel`` or ``_state_bwd_kernel``, whose arguments are
    ``*inputs, X0K, X0V, OUTK, OUTV, SEGK, SEGV, LSEG, LCUM, T, H, NT, NSEG, SEGC, NDK, *scalars``) into ``outs`` (HS
    or DHS of both passes) from ``init`` (h0 or the final state's adjoint, ``[B, H, M, D]`` each, or None: zero).
    ``final``: where the value after the whole walk goes with segments (views ``[B*H, M, D]`` of both passes: HS at
    index NT, or the initial state's adjoint), or None. One walk per program, or (:func:`.common.segment_chunks`)
    local walks of every segment, the scan across segments (``reverse``: last segment first) and the fix-up of every
    chunk (state_kernels)."""
    DK, DV = outs[0].shape[-1], outs[1].shape[-1]
    BD = min(cfg["STATE_BD"], DK, DV)
    NDK, tiles, NT = DK // BD, DK // BD + DV // BD, triton.cdiv(T, cfg["CHUNK"])
    SEGC = segment_chunks(NT, tiles * BH, cfg)
    NSEG = triton.cdiv(NT, SEGC)
    launch = dict(M=M, DK=DK, DV=DV, BD=BD, C=cfg["CHUNK"], num_warps=cfg["STATE_WARPS"],
                  num_stages=cfg["STATE_STAGES"], **flags)  # fmt: skip
    if NSEG == 1:
        kernel[(tiles, 1, BH)](*inputs, *(init if init is not None else outs), *outs, *outs, outs[0], outs[0], T, H,
                               NT, 1, SEGC, NDK, *scalars, HAS_X0=init is not None, LOCAL=False, **launch)  # fmt: skip
        return
    device = outs[0].device
    seg = (triton_utils.empty((BH, NSEG, M, DK), F32, device), triton_utils.empty((BH, NSEG, M, DV), F32, device))
    lseg = triton_utils.empty((BH, NSEG, M), F32, device)  # the segments' summed log gates
    lcum = triton_utils.empty((BH, NT, M), F32, device)  # each chunk's, since its segment's edge
    kernel[(tiles, NSEG, BH)](*inputs, *seg, *outs, *seg, lseg, lcum, T, H, NT, NSEG, SEGC, NDK, *scalars,
                              HAS_X0=False, LOCAL=True, **launch)  # fmt: skip
    fk, fv = final if final is not None else seg
    _segment_scan_kernel[(tiles, BH)](
        *seg, lseg, *(init if init is not None else seg), fk, fv, fk.stride(0), fv.stride(0), NSEG, NDK, M=M, DK=DK,
        DV=DV, BD=BD, REVERSE=reverse, HAS_INIT=init is not None, STORE_FINAL=final is not None,
        num_warps=cfg["STATE_WARPS"],
    )  # fmt: skip
    _segment_fixup_kernel[(tiles, NT, BH)](*outs, *seg, lcum, NT, NSEG, SEGC, NDK, outs[0].shape[1], M=M, DK=DK,
                                           DV=DV, BD=BD, REVERSE=reverse, HAS_INIT=init is not None,
                                           num_warps=cfg["STATE_WARPS"])  # fmt: skip


def _states(k, v, g, h0k, h0v, cfg):
    """Chunk-start states of both passes, ``[B*H, NT + 1, M, D]`` (index NT: the final state)."""
    B, T, H, DK, DV, M, NT = _dims(k, v, g, cfg)
    hsk = triton_utils.empty((B * H, NT + 1, M, DK), F32, k.device)
    hsv = triton_utils.empty((B * H, NT + 1, M, DV), F32, k.device)
    init = (h0k, h0v) if h0k is not None else None
    _scan(_state_fwd_kernel, (k, v, g), (), init, (hsk, hsv), (hsk[:, NT], hsv[:, NT]), T, H, B * H, M, cfg, False,
          **dot_flags(k.dtype))  # fmt: skip
    return hsk, hsv


def _read(x, y, g, hs, scale, cfg):
    """``scale * [exp(b) (H0 x) + intra-chunk]`` over the slots, float32 ``[B, T, H, M]`` (see chunk_kernels)."""
    B, T, H, D, _, M, NT = _dims(x, y, g, cfg)
    out = triton_utils.empty((B, T, H, M), F32, x.device)
    BD, BM = read_tiles(cfg, D, M)
    _read_kernel[(NT, M // BM, B * H)](
        x, y, g, hs, out, T, H, NT, scale, M=M, D=D, BD=BD, BM=BM, C=cfg["CHUNK"],
        BC=cfg["SUB"], **dot_flags(x.dtype, gated=True), num_warps=cfg["READ_WARPS"], num_stages=cfg["STAGES"],
    )  # fmt: skip
    return out


def _pairs(z, dp, g, scale, mode, dtype, cfg):
    """Each chunk's pair matrix of u = p (mode 1) or e (mode 2), float32 ``[B*H, NT, C, C]`` (``_pair_kernel``);
    ``dtype``: q's, which sets the precision of the gate-scaled products."""
    B, T, H, _, _, M, NT = _dims(z, z, g, cfg)
    a = triton_utils.empty((B * H, NT, cfg["CHUNK"], cfg["CHUNK"]), F32, z.device)
    gate_flags = {k: v for k, v in dot_flags(dtype, gated=True).items() if k.startswith("G")}
    _pair_kernel[(NT, B * H)](
        z, dp if dp is not None else z, g, a, T, H, NT, scale, MODE=mode, M=M, BM=min(cfg["PAIR_BM"], M),
        C=cfg["CHUNK"], BC=cfg["SUB"], **gate_flags, num_warps=cfg["PAIR_WARPS"], num_stages=cfg["STAGES"],
    )  # fmt: skip
    return a


def _write(x, z, dp, g, hs, a, scale, mode, dtype, cfg):
    """o or dq (``_write_kernel``): output over d in ``dtype``, ``[B, T, H, D]``."""
    B, T, H, D, _, M, NT = _dims(x, x, g, cfg)
    out = triton_utils.empty((B, T, H, D), dtype, x.device)
    BD = min(cfg["WRITE_BD"], D)
    _write_kernel[(NT, D // BD, B * H)](
        x, z, dp if dp is not None else z, g, hs, a, out, T, H, NT, scale, MODE=mode, M=M, D=D, BD=BD,
        BM=min(cfg["WRITE_BM"], M), C=cfg["CHUNK"], **dot_flags(x.dtype), num_warps=cfg["WRITE_WARPS"],
        num_stages=cfg["STAGES"],
    )  # fmt: skip
    return out


def _write_rev(x, g, dhs, a, dtype, cfg):
    """dk or dv (``_write_rev_kernel``): output over d in ``dtype``, ``[B, T, H, D]``."""
    B, T, H, D, _, M, NT = _dims(x, x, g, cfg)
    out = triton_utils.empty((B, T, H, D), dtype, x.device)
    BD = min(cfg["WRITE_BD"], D)
    _write_rev_kernel[(NT, D // BD, B * H)](
        x, g, dhs, a, out, T, H, NT, M=M, D=D, BD=BD, BM=min(cfg["WRITE_BM"], M), C=cfg["CHUNK"],
        **dot_flags(x.dtype), num_warps=cfg["WRITE_WARPS"], num_stages=cfg["STAGES"],
    )  # fmt: skip
    return out


def _state_adjoints(q, do, z, dp, g, dhtk, dhtv, want_dh0, scale, cfg):
    """Both passes' state adjoints at every chunk end, ``[B*H, NT, M, D]`` float32, and those of the initial state
    (``[B, H, M, D]``, or None unless ``want_dh0``); dhtk/dhtv: the final-state adjoints (slot-major) or None."""
    B, T, H, DK, DV, M, NT = _dims(q, do, g, cfg)
    dhsk = triton_utils.empty((B * H, NT, M, DK), F32, q.device)
    dhsv = triton_utils.empty((B * H, NT, M, DV), F32, q.device)
    dh0k = triton_utils.empty((B, H, M, DK), F32, q.device) if want_dh0 else dhsk
    dh0v = triton_utils.empty((B, H, M, DV), F32, q.device) if want_dh0 else dhsv
    init = (dhtk, dhtv) if dhtk is not None else None
    _scan(_state_bwd_kernel, (q, do, z, dp, g, dh0k, dh0v), (scale,), init, (dhsk, dhsv),
          (dh0k.view(B * H, M, DK), dh0v.view(B * H, M, DV)) if want_dh0 else None, T, H, B * H, M, cfg, True,
          STORE_DH0=want_dh0, **dot_flags(q.dtype))  # fmt: skip
    return dhsk, dhsv, (dh0k, dh0v) if want_dh0 else None


def _dgate(q, k, v, do, z, dp, g, hsk, hsv, dhsk, dhsv, scale, cfg):
    """The log-gate gradient, float32 ``[B, T, H, M]`` (``_dgate_kernel``)."""
    B, T, H, DK, DV, M, NT = _dims(k, v, g, cfg)
    dg = triton_utils.empty((B, T, H, M), F32, q.device)
    BM = min(cfg["DGATE_BM"], M)
    _dgate_kernel[(NT, M // BM, B * H)](
        q, k, v, do, z, dp, g, hsk, hsv, dhsk, dhsv, dg, T, H, NT, scale, M=M, DK=DK, DV=DV,
        BD=min(cfg["DGATE_BD"], DK, DV), BM=BM, C=cfg["CHUNK"], BC=cfg["SUB"], **dot_flags(q.dtype, gated=True),
        num_warps=cfg["DGATE_WARPS"], num_stages=cfg["STAGES"],
    )  # fmt: skip
    return dg


def _slot_major(hk):
    """``[B, H, dk, m]`` -> float32 ``[B, H, m, dk]`` contiguous (the kernels' slot-major layout)."""
    return hk.transpose(-1, -2).to(F32).contiguous()


class _GSAChunk(torch.autograd.Function):
    """Returns ``(o, final_k, final_v, z, a_p)``: the last two are the forward's intermediates the backward reuses
    (outputs so that they can be saved; not differentiable). Under ``torch.vmap`` the cells of a stacked model fold
    into the batch (:mod:`evalsuite.kernels.cells`)."""

    @staticmethod
    def forward(q, k, v, g, scale, h0k, h0v, output_final_state, override):
        cfg = config(override)
        B, T, H, DK, DV, M, NT = _dims(k, v, g, cfg)
        hsk, hsv = _states(k, v, g, h0k, h0v, cfg)
        z = _read(q, k, g, hsk, scale, cfg)
        a_p = _pairs(z, None, g, scale, 1, q.dtype, cfg)
        o = _write(v, z, None, g, hsv, a_p, scale, 1, v.dtype, cfg)
        final_k = final_v = None
        if output_final_state:
            final_k = hsk[:, NT].view(B, H, M, DK).transpose(-1, -2).contiguous()
            final_v = hsv[:, NT].view(B, H, M, DV).clone()
        return o, final_k, final_v, z, a_p

    @staticmethod
    def setup_context(ctx, inputs, output):
        q, k, v, g, scale, h0k, h0v, _, override = inputs
        z, a_p = output[3:]
        ctx.save_for_backward(q, k, v, g, z, a_p, h0k, h0v)
        ctx.mark_non_differentiable(z, a_p)
        ctx.scale, ctx.override = scale, override
        ctx.set_materialize_grads(False)

    @staticmethod
    def backward(ctx, do, d_final_k, d_final_v, _dz, _da_p):
        q, k, v, g, z, a_p, h0k, h0v = ctx.saved_tensors
        scale, cfg = ctx.scale, config(ctx.override)
        B, T, H, DK, DV, M, NT = _dims(k, v, g, cfg)
        do = torch.zeros_like(v) if do is None else do.to(v.dtype).contiguous()
        has_dht = d_final_k is not None or d_final_v is not None
        if has_dht:
            dhtk = torch.zeros(B, H, M, DK, dtype=F32, device=q.device) if d_final_k is None else _slot_major(d_final_k)
            dhtv = torch.zeros(B, H, M, DV, dtype=F32, device=q.device) if d_final_v is None else d_final_v.to(F32)
            dhtv = dhtv.contiguous()
        hsk, hsv = _states(k, v, g, h0k, h0v, cfg)
        dp = _read(do, v, g, hsv, 1.0, cfg)

        want_dh0 = h0k is not None and (ctx.needs_input_grad[5] or ctx.needs_input_grad[6])
        dhsk, dhsv, dh0 = _state_adjoints(
            q, do, z, dp, g, dhtk if has_dht else None, dhtv if has_dht else None, want_dh0, scale, cfg
        )
        a_e = _pairs(z, dp, g, scale, 2, q.dtype, cfg)
        dq = _write(k, z, dp, g, hsk, a_e, scale, 2, q.dtype, cfg)
        dk = _write_rev(q, g, dhsk, a_e, k.dtype, cfg)
        dv = _write_rev(do, g, dhsv, a_p, v.dtype, cfg)
        dg = _dgate(q, k, v, do, z, dp, g, hsk, hsv, dhsk, dhsv, scale, cfg)
        dh0k, dh0v = dh0 if want_dh0 else (None, None)
        return dq, dk, dv, dg, None, dh0k, dh0v, None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, g, scale, h0k, h0v, output_final_state, override):
        args = (q, k, v, g, scale, h0k, h0v, output_final_state, override)
        return fold_rule(_GSAChunk.apply, info, in_dims, args, batched=(0, 1, 2, 3, 5, 6))


def gsa_chunk_triton(q, k, v, log_alpha, scale: float = 1.0, initial_state=None, output_final_state: bool = False,
                     config=None):  # fmt: skip
    """Chunked GSA with Triton forward and backward; same contract as ``reference.gsa_recurrent``.

    q, k ``[B, T, H, dk]``, v ``[B, T, H, dv]`` (one dtype of bf16/fp16/fp32), log_alpha ``[B, T, H, m]`` (float32,
    <= 0), initial_state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` or None. Returns ``(o [B, T, H, dv] in v's dtype,
    (hk, hv) float32 or None)``. Gradients flow to q, k, v, log_alpha (float32), the initial state and from the
    returned final state. ``config``: the block configuration of forward and backward, a mapping with every key of
    :data:`~evalsuite.kernels.gated_slot.common.GPU_CONFIG` (tuning, tests); default the shipped one.
    """
    _check(q, k, v, log_alpha, initial_state)
    check_dtypes(q, k, v)
    B, T, H, dk = q.shape
    dv, m = v.shape[-1], log_alpha.shape[-1]
    check_sizes(dk, dv, m)
    if T == 0:
        o = v.new_zeros(v.shape)
        if not output_final_state:
            return o, None
        if initial_state is None:
            return o, (q.new_zeros(B, H, dk, m, dtype=F32), q.new_zeros(B, H, m, dv, dtype=F32))
        return o, tuple(s.to(F32) for s in initial_state)
    h0k = h0v = None
    if initial_state is not None:
        h0k, h0v = _slot_major(initial_state[0]), initial_state[1].to(F32).contiguous()
    q, k, v = (x.contiguous() for x in (q, k, v))
    g = log_alpha.to(F32).contiguous()  # clamped at LOG_ALPHA_FLOOR by the kernels as they load it
    o, hk, hv, _, _ = _GSAChunk.apply(q, k, v, g, float(scale), h0k, h0v, output_final_state, config)
    return o, ((hk, hv) if output_final_state else None)
