"""Counter-based random numbers in tensor ops, the same bits on every device: Philox4x32-10 (Salmon, Moraes, Dror and
Shaw, "Parallel Random Numbers: As Easy as 1, 2, 3", SC 2011, doi:10.1145/2063384.2063405), and uniforms in [0, 1) from
it.

A Philox output is a pure function of a 128-bit counter and a 64-bit key: no generator state to carry, so a number
is the same whichever device makes it, in whatever order, and a batch of them is one set of element-wise integer
ops. The sampler (:mod:`evalsuite.generation.sampling`) keys on a row's seed and counts (step, stream).

32-bit words are held in int64 tensors with values in [0, 2^32); the 32 x 32-bit products are taken in 16-bit halves
so that no intermediate passes 2^63 (signed overflow is left undefined by the C++ kernels beneath).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

MASK32 = 0xFFFFFFFF
MULTIPLIERS = (0xD2511F53, 0xCD9E8D57)  # the paper's Philox4x32 multipliers
WEYL = (0x9E3779B9, 0xBB67AE85)  # the key schedule's increments: the golden ratio's and sqrt(3) - 1's bits
ROUNDS = 10


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit words of ``a * b`` for a 32-bit constant ``a`` and words ``b``: with ``b = h 2^16 + l``,
    ``a b = s 2^16 + t`` for ``s = a h`` and ``t = a l``, each below 2^48."""
    s, t = a * (b >> 16), a * (b & 0xFFFF)
    return (s + (t >> 16)) >> 16, (((s & 0xFFFF) << 16) + t) & MASK32


def philox4x32(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """counter ``[..., 4]`` and key ``[..., 2]`` (int64 words in [0, 2^32), broadcast against each other) -> the
    four output words ``[..., 4]`` int64: ten rounds, the key bumped by :data:`WEYL` between them."""
    c0, c1, c2, c3 = counter.unbind(-1)
    k0, k1 = key.unbind(-1)
    for r in range(ROUNDS):
        if r:
            k0, k1 = (k0 + WEYL[0]) & MASK32, (k1 + WEYL[1]) & MASK32
        hi0, lo0 = _mulhilo(MULTIPLIERS[0], c0)
        hi1, lo1 = _mulhilo(MULTIPLIERS[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack(torch.broadcast_tensors(c0, c1, c2, c3), -1)


def seed_keys(seeds: Sequence[int], device=None) -> torch.Tensor:
    """Seeds (any Python ints: taken modulo 2^64, so a negative int64 seed is its two's complement) -> keys ``[S, 2]``
    int64 (low word, high word)."""
    words = [(s % 2**64 & MASK32, s % 2**64 >> 32) for s in seeds]
    return torch.tensor(words, dtype=torch.long, device=device).reshape(len(words), 2)


def uniforms(key: torch.Tensor, stream: torch.Tensor, steps: int) -> torch.Tensor:
    """keys ``[S, 2]`` and streams ``[S]`` (int64, on one device) -> float64 uniforms ``[S, steps]`` in [0, 1): entry
    (s, n) from the counter (n, stream[s], 0, 0) under key[s], its first two words making 53 random bits."""
    n = torch.arange(steps, dtype=torch.long, device=key.device)
    zero = torch.zeros((), dtype=torch.long, device=key.device)
    counter = torch.stack(torch.broadcast_tensors(n, stream[:, None], zero, zero), -1)
    words = philox4x32(counter, key[:, None, :])
    return ((words[..., 0] >> 11) * 2**32 + words[..., 1]).double() * 2.0**-53
