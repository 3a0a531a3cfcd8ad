"""Grouped Cross Attention in plain PyTorch: the reference twin of the Triton kernel (Hu et al., arXiv:2410.01651,
§3.2 eqs. 2-3 and Appendix B).

Every query chunk ``c`` attends to each of its ``K`` retrieved chunks *separately* (one softmax per retrieved chunk,
optionally off by one), and the ``K`` outputs are mixed with the retrieval weights ``w``:

    O_c = sum_k  w[c, k] * Softmax_1(scale * Q_c K_{c,k}^T) V_{c,k}
    Softmax_1(x)_i = exp(x_i) / (1 + sum_j exp(x_j))       (softmax_one=True; plain softmax otherwise)

Because ``w`` multiplies each chunk's output, the language-model loss reaches the retriever through ``dO/dw`` (GCA vs
RETRO's chunked cross-attention, which concatenates the chunks under one softmax).

Layout: q ``[B, C, Sq, H, D]`` (the queries of ``C`` chunks); k, v ``[B, C, K, Skv, H, D]`` (for each query chunk its
``K`` retrieved chunks, gathered); w ``[B, C, K]`` (float32; an empty retrieval slot has weight 0). Output
``[B, C, Sq, H, D]`` in q's dtype. Scores and softmax run in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import torch

MAX_TRITON_SQ = 128  # query rows per chunk the Triton backward holds in one tile (the package's "auto" rule)


def check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, w: torch.Tensor) -> None:
    """ValueError unless q ``[B, C, Sq, H, D]``, k = v ``[B, C, K, Skv, H, D]``, w ``[B, C, K]``."""
    if q.dim() != 5 or k.dim() != 6 or v.shape != k.shape:
        raise ValueError(
            f"expected q [B, C, Sq, H, D] and k, v [B, C, K, Skv, H, D]; got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    B, C, _, H, D = q.shape
    if k.shape[:2] != (B, C) or k.shape[4:] != (H, D):
        raise ValueError(f"k/v {tuple(k.shape)} do not match q {tuple(q.shape)}")
    if w.shape != (B, C, k.shape[2]):
        raise ValueError(f"w must be [B, C, K] = {[B, C, k.shape[2]]}, got {tuple(w.shape)}")


def gca_reference(q, k, v, w, *, softmax_one: bool = True, scale: float | None = None) -> torch.Tensor:
    """``O [B, C, Sq, H, D]`` as in the module docstring; differentiable in q, k, v and w."""
    check_shapes(q, k, v, w)
    compute = torch.float64 if q.dtype == torch.float64 else torch.float32
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    qf, kf, vf = q.to(compute), k.to(compute), v.to(compute)
    s = torch.einsum("bcqhd,bckshd->bckhqs", qf, kf) * scale  # [B, C, K, H, Sq, Skv]
    if softmax_one:  # a zero logit with a zero value: the chunk may contribute nothing
        m = s.amax(-1, keepdim=True).clamp_min(0.0)
        p = torch.exp(s - m)
        p = p / (torch.exp(-m) + p.sum(-1, keepdim=True))
    else:
        p = torch.softmax(s, -1)
    per_chunk = torch.einsum("bckhqs,bckshd->bckqhd", p, vf)  # [B, C, K, Sq, H, D]
    out = torch.einsum("bckqhd,bck->bcqhd", per_chunk, w.to(compute))
    return out.to(q.dtype)
