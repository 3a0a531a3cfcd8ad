"""MQAR's generator against Zoology's definition (arXiv:2312.04927; evalsuite/data/mqar.py): layout, key and
value draws, the power-law query gaps, seeds and constraints."""

from __future__ import annotations

import hashlib
import itertools

import numpy as np
import pytest
import torch

from evalsuite.data.mqar import multiquery_ar, power_law_weights, weighted_ordered_sample
from evalsuite.errors import UserError


def gen(n, seq_len, kv, seed=0, **kw):
    return multiquery_ar(n, seq_len, kv, np.random.default_rng(seed), **kw)


# ------------------------------------------------------------------------------------------ generator


def test_layout_keys_values_and_labels():
    V, T, kv = 8192, 256, 16
    x, y = gen(500, T, kv)
    assert x.shape == y.shape == (500, T) and x.dtype == y.dtype == np.int64
    keys, values = x[:, 0 : 2 * kv : 2], x[:, 1 : 2 * kv : 2]
    assert keys.min() >= 1 and keys.max() < V // 2  # keys from [1, V/2)
    assert values.min() >= V // 2 and values.max() < V  # values from [V/2, V)
    for row in range(500):
        assert len(set(keys[row])) == kv and len(set(values[row])) == kv  # without replacement
        labelled = np.flatnonzero(y[row] != -100)
        assert len(labelled) == kv  # one label per query, -100 elsewhere
        assert labelled.min() >= 2 * kv and np.all((labelled - 2 * kv) % 2 == 0)  # even offsets after the block
        pairs = dict(zip(keys[row], values[row], strict=True))
        assert sorted(x[row, labelled]) == sorted(keys[row])  # every key queried exactly once
        assert all(y[row, p] == pairs[x[row, p]] for p in labelled)  # label at a query key = its value
        filler = np.ones(T, bool)
        filler[: 2 * kv] = False
        filler[labelled] = False
        assert np.all(x[row, filler] == 0)  # non-queries are 0 without random_non_queries
    assert np.all(y[:, : 2 * kv] == -100)


def test_key_i_is_queried_at_the_ith_draw():
    """Zoology places key i at gap i (gaps in draw order): the first key's query is the likeliest earliest."""
    x, y = gen(4000, 64, 8)
    first_key_pos = np.argmax(x[:, 16:] == x[:, [0]], axis=1)
    last_key_pos = np.argmax(x[:, 16:] == x[:, [14]], axis=1)
    assert first_key_pos.mean() < last_key_pos.mean()


def test_uniform_keys_and_values():
    V = 64
    x, _ = gen(40000, 16, 2, vocab_size=V)
    for column, lo, hi in ((0, 1, V // 2), (1, V // 2, V)):  # first key, first value
        counts = np.bincount(x[:, column] - lo, minlength=hi - lo)
        expected = len(x) / (hi - lo)
        chi2 = ((counts - expected) ** 2 / expected).sum()
        assert len(counts) == hi - lo and chi2 < 80  # ~31 dof; 80 is far in the tail


@pytest.mark.parametrize("power_a", [0.01, 0.5])
def test_gap_law_is_successive_sampling(power_a):
    """Ordered gap pairs against the exact law: P(g0=i, g1=j) = p_i p_j / (1 - p_i).

    p is the law written out by hand, not the module's weights: p(gap) ∝ a * x^(a-1) at x = gap + 1. For
    a = 0.5 that is 1/sqrt(x) / (1 + 1/sqrt(2) + ... + 1/sqrt(6)); for a = 0.01 it is x^-0.99 / sum.
    """
    T, kv, n = 16, 2, 60000  # space = (16 - 4) / 2 = 6 gap slots
    p = {
        0.01: np.array([0.405366, 0.204093, 0.136615, 0.102756, 0.082389, 0.068782]),
        0.5: np.array([0.274731, 0.194264, 0.158616, 0.137366, 0.122864, 0.112159]),
    }[power_a]
    by_hand = {  # the unnormalised weights as documented, a * x^(a-1) for x = 1 .. 6
        0.01: [0.01 * x**-0.99 for x in range(1, 7)],
        0.5: [0.5, 0.5 / 2**0.5, 0.5 / 3**0.5, 0.25, 0.5 / 5**0.5, 0.5 / 6**0.5],
    }[power_a]
    w = power_law_weights(6, power_a)
    np.testing.assert_allclose(w, by_hand, rtol=1e-12)
    np.testing.assert_allclose(w / w.sum(), p, atol=2e-6)
    x, y = gen(n, T, kv, vocab_size=64, power_a=power_a, seed=1)
    pos = [np.argmax(x[:, 4:] == x[:, [2 * i]], axis=1) for i in range(kv)]  # query offset of key i
    g0, g1 = pos[0] // 2, pos[1] // 2
    counts = np.zeros((6, 6))
    np.add.at(counts, (g0, g1), 1)
    chi2 = 0.0
    for i, j in itertools.permutations(range(6), 2):
        expected = n * p[i] * p[j] / (1 - p[i])
        chi2 += (counts[i, j] - expected) ** 2 / expected
    assert np.trace(counts) == 0 and chi2 < 80  # 29 dof
    first = counts.sum(axis=1) / n  # the first draw alone follows p
    assert np.abs(first - p).max() < 5 * np.sqrt(p * (1 - p) / n).max()


def test_gaps_match_numpy_weighted_choice_at_paper_scale():
    """The exponential race, and the generator's gaps, against numpy's ``choice(replace=False, p=...)`` (what
    Zoology calls) with the law written out here (p ∝ x^(a-1), x = gap + 1, a = 0.01), T=512, 64 kv."""
    space, kv, n = (512 - 128) // 2, 64, 3000
    p = np.arange(1, space + 1, dtype=np.float64) ** (0.01 - 1)
    p = p / p.sum()
    ref_rng = np.random.default_rng(7)
    ref = np.stack([ref_rng.choice(space, size=kv, replace=False, p=p) for _ in range(n)])
    race = weighted_ordered_sample(np.random.default_rng(8), n, p, kv)
    x, _ = gen(n, 512, kv, seed=9)  # the generator end to end (its own weights): gap of key i = its query slot
    keys, slots = x[:, 0 : 2 * kv : 2], x[:, 2 * kv :: 2]  # queries sit at even offsets of the query region
    generated = np.argmax(slots[:, None, :] == keys[:, :, None], axis=2)
    bins = np.linspace(0, space, 9)
    ha = np.histogram(ref, bins)[0] / ref.size
    for ours in (race, generated):
        for rank in (0, 1, 8, 32, 63):  # mean gap of the rank-th draw
            a, b = ref[:, rank].astype(float), ours[:, rank].astype(float)
            se = np.sqrt(a.var() / len(a) + b.var() / len(b))
            assert abs(a.mean() - b.mean()) < 5 * se
        # marginal inclusion of each gap slot, compared in 8 coarse bins
        hb = np.histogram(ours, bins)[0] / ours.size
        assert np.abs(ha - hb).max() < 0.01


def test_power_law_puts_queries_early():
    x, y = gen(2000, 512, 64)
    offsets = np.flatnonzero((y != -100).ravel()) % 512 - 128
    assert np.median(offsets) < 192  # the query region is 384 tokens; a = 0.01 favours small gaps
    assert (offsets < 192).mean() > 0.5


def test_random_non_queries():
    V = 8192
    a, ya = gen(300, 128, 8, seed=3)
    b, yb = gen(300, 128, 8, seed=3, random_non_queries=True)
    assert np.array_equal(ya, yb)  # same keys, values, gaps (the fill is drawn last)
    filler = a == 0
    assert np.array_equal(a[~filler], b[~filler])
    fill = b[filler]
    assert fill.min() >= 0 and fill.max() < V and len(np.unique(fill)) > 1000
    assert abs(fill.mean() - (V - 1) / 2) < 0.02 * V


def test_num_passes_repeats_the_block():
    x, y = gen(50, 64, 4, num_passes=2)
    assert np.array_equal(x[:, :8], x[:, 8:16])
    assert (y[:, :16] == -100).all() and ((y != -100).sum(1) == 4).all()


def test_seeded_and_machine_independent():
    a = gen(8, 32, 4, seed=0, vocab_size=64)
    b = gen(8, 32, 4, seed=0, vocab_size=64)
    c = gen(8, 32, 4, seed=1, vocab_size=64)
    assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))
    assert not np.array_equal(a[0], c[0])
    # pinned bytes: PCG64 streams are platform-independent, so these hold on any machine
    digest = hashlib.sha256(a[0].tobytes() + a[1].tobytes()).hexdigest()[:16]
    assert digest == "2d6915cb8485a50c"
    r = gen(8, 32, 4, seed=0, vocab_size=64, random_non_queries=True)
    assert hashlib.sha256(r[0].tobytes() + r[1].tobytes()).hexdigest()[:16] == "0391887a4681d171"


def test_no_global_rng():
    torch.manual_seed(0)
    np.random.seed(0)
    before = (torch.get_rng_state().clone(), np.random.get_state()[1].copy())
    gen(10, 64, 4)
    assert torch.equal(before[0], torch.get_rng_state()) and np.array_equal(before[1], np.random.get_state()[1])


@pytest.mark.parametrize(
    "seq_len, kv, vocab, message",
    [(63, 4, 8192, "even"), (64, 4, 64, "exceed"), (64, 17, 8192, "more than the sequence length")],
)
def test_zoology_constraints(seq_len, kv, vocab, message):
    with pytest.raises(UserError, match=message):
        gen(1, seq_len, kv, vocab_size=vocab)
