"""Lightning Attention in plain PyTorch: the reference twins of the Triton kernels (Qin et al., arXiv:2405.17381).

Causal linear attention with a fixed per-head exponential decay ``lambda = exp(-slope)`` and no softmax, no
normaliser, no 1/sqrt(d) (paper eqs. 15-17; Norm is applied by the model afterwards):

    kv_t = lambda kv_{t-1} + k_t v_t^T,    o_t = q_t^T kv_t,   i.e.  o_t = sum_{s<=t} lambda^(t-s) (q_t . k_s) v_s

Layout: q, k ``[B, T, H, dk]``; v ``[B, T, H, dv]``; slope ``[H]`` float32 (>= 0); output ``[B, T, H, dv]`` in v's
dtype; state ``kv [B, H, dk, dv]`` float32 (float64 for float64 inputs) (the sum above at the last consumed position).

* :func:`lightning_recurrent` -- the token loop (eq. 17): ground truth and the decode step.
* :func:`lightning_chunked` -- Algorithm 5 in PyTorch: intra-block left product with the decay mask
  ``M[r, c] = lambda^(r-c)``, inter-block right product ``Lambda Q_t KV`` with ``Lambda = diag(lambda^1..lambda^B)``,
  and ``KV <- lambda^B KV + (lambda^(B-c) K)^T V``. What models use on CPU.
* :func:`lightning_parallel` -- the masked quadratic form, float64, for tests at small T.
"""

from __future__ import annotations

import torch

BLOCK = 64


def _check(q, k, v, slope, initial_state):
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(
            f"expected q, k [B, T, H, dk] and v [B, T, H, dv]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, _, H, dk = q.shape
    if slope.shape != (H,):
        raise ValueError(f"slope must be [H] = [{H}], got {tuple(slope.shape)}")
    if initial_state is not None and initial_state.shape != (B, H, dk, v.shape[-1]):
        raise ValueError(f"initial state must be [B, H, dk, dv] = {[B, H, dk, v.shape[-1]]}")


def _compute_dtype(q) -> torch.dtype:
    """float32, or float64 for float64 inputs (tests compare in double precision)."""
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def _zero_state(q, v):
    B, _, H, dk = q.shape
    return torch.zeros(B, H, dk, v.shape[-1], device=q.device, dtype=_compute_dtype(q))


def lightning_recurrent(q, k, v, slope, initial_state=None, output_final_state: bool = False):
    """Token-by-token decayed linear attention in float32. Returns ``(o, kv or None)``."""
    _check(q, k, v, slope, initial_state)
    dtype = _compute_dtype(q)
    kv = _zero_state(q, v) if initial_state is None else initial_state.to(dtype)
    decay = torch.exp(-slope.to(dtype))[None, :, None, None]
    qf, kf, vf = (x.to(dtype) for x in (q, k, v))
    out = []
    for t in range(q.shape[1]):
        kv = decay * kv + kf[:, t, :, :, None] * vf[:, t, :, None, :]
        out.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], kv))
    o = torch.stack(out, 1) if out else vf.new_zeros(v.shape)
    return o.to(v.dtype), (kv if output_final_state else None)


def lightning_chunked(q, k, v, slope, initial_state=None, output_final_state: bool = False, block: int = BLOCK):
    """Algorithm 5 (forward with decay) a block at a time, float32, differentiable by autograd."""
    _check(q, k, v, slope, initial_state)
    dtype = _compute_dtype(q)
    kv = _zero_state(q, v) if initial_state is None else initial_state.to(dtype)
    qf, kf, vf = (x.to(dtype).transpose(1, 2) for x in (q, k, v))  # [B, H, T, .]
    s = slope.to(device=q.device, dtype=dtype)[:, None]  # [H, 1]
    out = []
    for c0 in range(0, q.shape[1], block):
        qc, kc, vc = qf[:, :, c0 : c0 + block], kf[:, :, c0 : c0 + block], vf[:, :, c0 : c0 + block]
        n = qc.shape[2]
        r = torch.arange(n, device=q.device, dtype=dtype)
        gap = r[:, None] - r[None, :]
        mask = torch.exp(-s[:, :, None] * gap.clamp(min=0)) * (gap >= 0)  # [H, n, n]: lambda^(r-c), r >= c
        q_decay = torch.exp(-s * (r + 1))[..., None]  # [H, n, 1]: lambda^r for 1-based row r
        k_decay = torch.exp(-s * (n - 1 - r))[..., None]  # [H, n, 1]: lambda^(n-c) for 1-based column c
        out.append(((qc @ kc.transpose(-1, -2)) * mask) @ vc + (qc * q_decay) @ kv)
        kv = torch.exp(-s * n)[..., None] * kv + (kc * k_decay).transpose(-1, -2) @ vc
    o = torch.cat(out, 2).transpose(1, 2) if out else vf.new_zeros(v.shape)
    return o.to(v.dtype), (kv if output_final_state else None)


def lightning_parallel(q, k, v, slope):
    """``O = [(Q K^T) * D] V`` with ``D[t, s] = exp(-slope (t - s))`` for ``t >= s``: float64, O(T^2), for tests."""
    qd, kd, vd = (x.double().transpose(1, 2) for x in (q, k, v))
    T = q.shape[1]
    t = torch.arange(T, device=q.device, dtype=torch.float64)
    gap = t[:, None] - t[None, :]
    D = torch.exp(-slope.double().to(q.device)[:, None, None] * gap.clamp(min=0)) * (gap >= 0)
    return (((qd @ kd.transpose(-1, -2)) * D) @ vd).transpose(1, 2)
