"""Multi-query associative recall (MQAR) data: Zoology's ``multiquery_ar`` generator (arXiv:2312.04927, §3).

Each example of ``seq_len`` tokens starts with the key-value block ``k1 v1 k2 v2 ... k_n v_n`` (repeated
``num_passes`` times), keys drawn without replacement from ``[1, V/2)`` and values from ``[V/2, V)``. Every key is
then queried once in the rest of the sequence: query ``i`` sits at offset ``2 * gap_i`` of the query region, the
gaps drawn without replacement from ``range(space)``, ``space = (seq_len - context) / 2``, with probability
``∝ a * x^(a-1)`` at ``x = gap + 1`` (``a = power_a = 0.01`` puts most queries early), in the order of successive
sampling (the first key gets the first draw). Other query-region tokens are 0, or uniform in ``[0, V)`` with
``random_non_queries``. Labels are -100 except at each query key's position, whose label is that key's value: the
model must emit the value right after reading the key.

Randomness comes only from the ``numpy.random.Generator`` passed in (no global RNG), so a seed gives the same
arrays on any machine. Weighted sampling without replacement uses the exponential race (sort by ``Exp(1) / w``),
which has exactly the law of successive sampling, the law of ``numpy``'s weighted ``choice(replace=False)`` that
Zoology calls.
"""

from __future__ import annotations

import numpy as np

from evalsuite.errors import UserError

IGNORE_INDEX = -100  # the label of unscored positions (evalsuite.training.train.IGNORE_INDEX)
_CHUNK = 1024  # examples generated per vectorised step; fixed, because the data depends on it


def check_setting(seq_len: int, num_kv_pairs: int, vocab_size: int, num_passes: int = 1) -> None:
    """Zoology's constraints on one data setting (UserError when violated)."""
    if seq_len % 2:
        raise UserError(f"MQAR sequence length must be even, got {seq_len}")
    if vocab_size <= seq_len:
        raise UserError(f"MQAR vocab size {vocab_size} must exceed the sequence length {seq_len}")
    if num_kv_pairs < 1 or num_passes < 1:
        raise UserError("MQAR needs at least one kv pair and one pass")
    if num_kv_pairs * 2 * num_passes + num_kv_pairs * 2 > seq_len:
        raise UserError(
            f"MQAR: {num_kv_pairs} kv pairs x {num_passes} pass(es) and their queries need "
            f"{num_kv_pairs * 2 * (num_passes + 1)} tokens, more than the sequence length {seq_len}"
        )
    if num_kv_pairs > vocab_size // 2 - 1:
        raise UserError(f"MQAR: {num_kv_pairs} distinct keys do not fit in [1, {vocab_size // 2})")


def power_law_weights(space: int, power_a: float) -> np.ndarray:
    """Unnormalised gap weights ``a * x^(a-1)`` for gaps ``0 .. space-1`` (``x = gap + 1``), ``[space]``."""
    return power_a * np.arange(1, space + 1, dtype=np.float64) ** (power_a - 1)


def uniform_ordered_sample(rng: np.random.Generator, rows: int, n: int, k: int) -> np.ndarray:
    """``[rows, k]`` indices into ``range(n)``: per row, k distinct, uniformly random, in random order."""
    u = rng.random((rows, n))
    idx = np.argpartition(u, k - 1, axis=1)[:, :k]  # the k smallest uniforms: a uniform k-subset
    order = np.take_along_axis(u, idx, axis=1).argsort(axis=1, kind="stable")  # their ranks: a uniform order
    return np.take_along_axis(idx, order, axis=1)


def weighted_ordered_sample(rng: np.random.Generator, rows: int, weights: np.ndarray, k: int) -> np.ndarray:
    """``[rows, k]`` indices into ``weights`` ``[n]`` drawn without replacement, in draw order, with the law of
    successive sampling (each draw ``∝ weight`` among those left).

    Exponential race: item i finishes at ``E_i / w_i`` with ``E_i ~ Exp(1)``; the first to finish is i with
    probability ``w_i / sum(w)`` and, by memorylessness, the rest race on among the others.
    """
    finish = -np.log1p(-rng.random((rows, weights.shape[0]))) / weights  # E / w, E = -log(1 - U)
    idx = np.argpartition(finish, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(finish, idx, axis=1).argsort(axis=1, kind="stable")
    return np.take_along_axis(idx, order, axis=1)


def multiquery_ar(
    num_examples: int,
    seq_len: int,
    num_kv_pairs: int,
    rng: np.random.Generator,
    *,
    vocab_size: int = 8192,
    power_a: float = 0.01,
    random_non_queries: bool = False,
    num_passes: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """MQAR examples (see the module docstring).

    Returns:
        inputs ``[N, seq_len]`` int64 and labels ``[N, seq_len]`` int64 (-100 except at query positions).
    """
    check_setting(seq_len, num_kv_pairs, vocab_size, num_passes)
    half = vocab_size // 2
    context = 2 * num_kv_pairs * num_passes
    weights = power_law_weights((seq_len - context) // 2, power_a)
    inputs = np.zeros((num_examples, seq_len), dtype=np.int64)
    labels = np.full((num_examples, seq_len), IGNORE_INDEX, dtype=np.int64)
    for lo in range(0, num_examples, _CHUNK):
        n = min(_CHUNK, num_examples - lo)
        keys = 1 + uniform_ordered_sample(rng, n, half - 1, num_kv_pairs)  # [n, kv] in [1, V/2)
        values = half + uniform_ordered_sample(rng, n, vocab_size - half, num_kv_pairs)  # [n, kv] in [V/2, V)
        gaps = weighted_ordered_sample(rng, n, weights, num_kv_pairs)  # [n, kv]; key i is queried at gap i
        block = np.empty((n, 2 * num_kv_pairs), dtype=np.int64)
        block[:, 0::2], block[:, 1::2] = keys, values
        x, y = inputs[lo : lo + n], labels[lo : lo + n]
        x[:, :context] = np.tile(block, num_passes)
        query_pos = context + 2 * gaps
        np.put_along_axis(x, query_pos, keys, axis=1)
        np.put_along_axis(y, query_pos, values, axis=1)
        if random_non_queries:  # Zoology replaces every remaining 0 (only query-region fillers are 0)
            fill = rng.integers(0, vocab_size, size=x.shape)
            np.copyto(x, fill, where=x == 0)
    return inputs, labels


def mqar_data(config: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Train and test sets of one data config (``seq_len``, ``num_kv_pairs``, ``vocab_size``, ``power_a``,
    ``random_non_queries``, ``num_passes``, ``num_train``, ``num_test``, ``seed``): ``{"train": (inputs,
    labels), "test": ...}``, each ``[N, seq_len]`` int64, from independent seeded streams."""
    gen = {k: config[k] for k in ("vocab_size", "power_a", "random_non_queries", "num_passes")}
    out = {}
    for split, n, stream in (("train", config["num_train"], 0), ("test", config["num_test"], 1)):
        rng = np.random.default_rng([config["seed"], config["seq_len"], config["num_kv_pairs"], stream])
        out[split] = multiquery_ar(n, config["seq_len"], config["num_kv_pairs"], rng, **gen)
    return out
