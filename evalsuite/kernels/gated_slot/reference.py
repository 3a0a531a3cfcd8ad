"""Gated Slot Attention in plain PyTorch: the reference twins of the Triton kernels (GSA, arXiv:2409.07146).

Per head, m slots of keys ``K~ [m, dk]`` and values ``V~ [m, dv]`` are updated with a per-slot forget gate
``alpha_t in (0,1)^m`` and write strength ``s_t = 1 - alpha_t`` (paper eq. 6):

    K~_t = diag(alpha_t) K~_{t-1} + s_t (x) k_t,    V~_t = diag(alpha_t) V~_{t-1} + s_t (x) v_t
    o_t  = V~_t^T softmax(scale * K~_t q_t)           (softmax over the m slots)

We keep the states as the two GLA passes of the paper's Algorithm 1 hold them: ``hk = K~^T [dk, m]`` and
``hv = V~ [m, dv]``, float32 (float64 for float64 inputs). The gate arrives as ``log_alpha`` (float32, <= 0),
so ``s = -expm1(log_alpha)``.

Layout: q, k ``[B, T, H, dk]``; v ``[B, T, H, dv]``; log_alpha ``[B, T, H, m]``; output ``[B, T, H, dv]`` in v's
dtype; state ``(hk [B, H, dk, m], hv [B, H, m, dv])`` float32.

Three functions:
* :func:`gsa_recurrent` -- the naive token-by-token loop (eq. 6): the ground truth, and the decode step.
* :func:`gsa_chunked` -- the same math a chunk at a time (Algorithm 1's two passes; in-chunk decays factored into
  matmuls where that is exact, else written out pairwise). What models use on CPU.
* :func:`gsa_parallel` -- the unrolled quadratic form of eq. 6 (arXiv:2409.07146 §3.2), a third
  independent oracle for tests at small T.
"""

from __future__ import annotations

import torch

CHUNK = 16  # small chunks keep the in-chunk decay range (and the pairwise fallback) small
# gsa_chunked clamps log alpha here, as the Triton kernels do on load (common.G_FLOOR): alpha = e^-20 = 2e-9 is below
# float32's resolution of a state update, and a saturated gate of -1000 would otherwise leave the rest of its chunk's
# decays, differences of cumsums near -16000, with relative errors of 1e-3.
LOG_ALPHA_FLOOR = -20.0


def _check(q, k, v, log_alpha, initial_state):
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or log_alpha.dim() != 4:
        raise ValueError(
            f"expected q, k [B, T, H, dk], v [B, T, H, dv], log_alpha [B, T, H, m]; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}, {tuple(log_alpha.shape)}"
        )
    if v.shape[:3] != q.shape[:3] or log_alpha.shape[:3] != q.shape[:3]:
        raise ValueError(f"v {tuple(v.shape)} / log_alpha {tuple(log_alpha.shape)} do not fit q {tuple(q.shape)}")
    if initial_state is not None:
        B, _, H, dk = q.shape
        m, dv = log_alpha.shape[-1], v.shape[-1]
        hk, hv = initial_state
        if hk.shape != (B, H, dk, m) or hv.shape != (B, H, m, dv):
            raise ValueError(
                f"initial state must be ([B, H, dk, m], [B, H, m, dv]) = ({(B, H, dk, m)}, {(B, H, m, dv)})"
            )


def _compute_dtype(q) -> torch.dtype:
    """float32, or float64 for float64 inputs (tests compare in double precision)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _zero_state(q, v, log_alpha, dtype=torch.float32):
    B, _, H, dk = q.shape
    m, dv = log_alpha.shape[-1], v.shape[-1]
    hk = torch.zeros(B, H, dk, m, device=q.device, dtype=dtype)
    hv = torch.zeros(B, H, m, dv, device=q.device, dtype=dtype)
    return hk, hv


def gsa_recurrent(q, k, v, log_alpha, scale: float = 1.0, initial_state=None, output_final_state: bool = False):
    """Token-by-token GSA in float32 (paper eq. 6). Returns ``(o, state or None)``; see the module docstring."""
    _check(q, k, v, log_alpha, initial_state)
    dtype = _compute_dtype(q)
    hk, hv = _zero_state(q, v, log_alpha, dtype) if initial_state is None else (x.to(dtype) for x in initial_state)
    qf, kf, vf, g = (x.to(dtype) for x in (q, k, v, log_alpha))
    alpha, write = g.exp(), -torch.expm1(g)
    out = []
    for t in range(q.shape[1]):
        hk = hk * alpha[:, t, :, None, :] + kf[:, t, :, :, None] * write[:, t, :, None, :]  # [B, H, dk, m]
        scores = scale * torch.einsum("bhk,bhkm->bhm", qf[:, t], hk)
        hv = hv * alpha[:, t, :, :, None] + write[:, t, :, :, None] * vf[:, t, :, None, :]  # [B, H, m, dv]
        out.append(torch.einsum("bhm,bhmv->bhv", scores.softmax(-1), hv))
    o = torch.stack(out, 1) if out else vf.new_zeros(v.shape)
    return o.to(v.dtype), ((hk, hv) if output_final_state else None)


def gsa_chunked(
    q, k, v, log_alpha, scale: float = 1.0, initial_state=None, output_final_state: bool = False, chunk: int = CHUNK
):
    """GSA a chunk at a time, differentiable by autograd; same results as :func:`gsa_recurrent` (log alpha clamped
    at ``LOG_ALPHA_FLOOR``, as the Triton kernels clamp it: a difference of at most alpha = 2e-9 per saturated step).

    Per chunk with in-chunk cumulative log-gates ``b [C, m]`` counted from the chunk's first token (Algorithm 1,
    written out per chunk): pass 1 ``o1[r] = exp(b_r) * (q_r hk0) + sum_{s<=r} (q_r . k_s) s_s exp(b_r - b_s)``,
    softmax over m, pass 2 ``o[r] = (p_r * exp(b_r)) hv0 + sum_{s<=r} <p_r, s_s exp(b_r - b_s)> v_s``.
    The in-chunk sums are matmuls after factoring ``exp(b_r - b_s) = exp(b_r) exp(-b_s)``; that is exact while
    ``exp(-b)`` stays finite, so a chunk whose gates decay by more than ``e^-60`` falls back to the pairwise
    ``[C, C, m]`` form (every exponent <= 0). Float32 (float64 for float64 inputs).
    """
    _check(q, k, v, log_alpha, initial_state)
    dtype = _compute_dtype(q)
    hk, hv = _zero_state(q, v, log_alpha, dtype) if initial_state is None else (x.to(dtype) for x in initial_state)
    qf, kf, vf, g = (x.to(dtype).transpose(1, 2) for x in (q, k, v, log_alpha))  # [B, H, T, .]
    g = g.clamp(min=LOG_ALPHA_FLOOR)  # as the Triton kernels: bounds the cumsum b, whose rounding every decay takes
    write = -torch.expm1(g)
    out = []
    for c0 in range(0, q.shape[1], chunk):
        qc, kc, vc, sc = (x[:, :, c0 : c0 + chunk] for x in (qf, kf, vf, write))
        b = g[:, :, c0 : c0 + chunk].cumsum(2)  # [B, H, C, m], <= 0, decreasing in time
        C = b.shape[2]
        causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
        qk = (qc @ kc.transpose(-1, -2)).masked_fill(~causal, 0.0)  # [B, H, C(r), C(s)]
        if -b[:, :, -1].min() < 60:  # exp(-b) <= e^60: factor the decay into the two operands
            grow, shrink = (-b).exp(), b.exp()
            o1 = shrink * (qc @ hk + qk @ (sc * grow))
            p = (scale * o1).softmax(-1)
            a2 = ((p * shrink) @ (sc * grow).transpose(-1, -2)).masked_fill(~causal, 0.0)
        else:
            diff = (b[:, :, :, None, :] - b[:, :, None, :, :]).masked_fill(~causal[:, :, None], float("-inf"))
            decay = diff.exp() * sc[:, :, None, :, :]  # [B, H, C(r), C(s), m]
            o1 = b.exp() * (qc @ hk) + (qk[..., None] * decay).sum(3)
            p = (scale * o1).softmax(-1)
            a2 = (p[:, :, :, None, :] * decay).sum(-1)
        out.append((p * b.exp()) @ hv + a2 @ vc)
        # carry both states to the chunk's end: decay b_C - b_s for every in-chunk write
        tail = (b[:, :, -1:] - b).exp() * sc  # [B, H, C, m]
        hk = hk * b[:, :, -1, None, :].exp() + kc.transpose(-1, -2) @ tail
        hv = hv * b[:, :, -1, :, None].exp() + tail.transpose(-1, -2) @ vc
    o = torch.cat(out, 2).transpose(1, 2) if out else vf.new_zeros(v.shape)
    return o.to(v.dtype), ((hk, hv) if output_final_state else None)


def gsa_parallel(q, k, v, log_alpha, scale: float = 1.0):
    """The unrolled quadratic form of eq. 6, float64, for tests: ``w[t, i, j] = s[i, j] exp(G[t, j] - G[i, j])``,
    ``scores[t, j] = scale * sum_i w[t,i,j] (q_t . k_i)``, ``o_t = sum_i (sum_j p[t, j] w[t, i, j]) v_i``."""
    qd, kd, vd, g = (x.double().transpose(1, 2) for x in (q, k, v, log_alpha))  # [B, H, T, .]
    G = g.cumsum(2)
    T = q.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    w = (G[:, :, :, None, :] - G[:, :, None, :, :]).masked_fill(~causal[:, :, None], float("-inf")).exp()
    w = w * (-torch.expm1(g))[:, :, None, :, :]  # [B, H, t, i, m]
    scores = scale * torch.einsum("bhti,bhtim->bhtm", qd @ kd.transpose(-1, -2), w)
    mix = torch.einsum("bhtm,bhtim->bhti", scores.softmax(-1), w)
    return (mix @ vd).transpose(1, 2)
