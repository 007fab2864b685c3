"""Tests for zoo.dp.PoissonSampler."""

import time
import warnings

import numpy as np
import pytest
from scipy import stats

from zoo.dp import PoissonSampler, padded_size_for

N, EXPECTED, STEPS = 200, 20, 2000


@pytest.fixture(scope="module")
def draws():
    sampler = PoissonSampler.for_expected_batch(N, EXPECTED, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # truncation must not happen at this padding
        return sampler, [sampler.batch_indices(t) for t in range(STEPS)]


def test_fixed_shapes_and_mask_consistency(draws):
    sampler, batches = draws
    p = sampler.padded_batch_size
    for idx, mask, realised in batches:
        assert idx.shape == (p,) and idx.dtype == np.int32
        assert mask.shape == (p,) and mask.dtype == np.float32
        assert mask.sum() == realised <= p
        real = idx[mask == 1]
        assert len(np.unique(real)) == realised  # distinct
        assert real.min(initial=0) >= 0 and real.max(initial=0) < N
        assert set(np.unique(mask)) <= {0.0, 1.0}
        np.testing.assert_array_equal(mask[:realised], 1.0)  # real slots first
        np.testing.assert_array_equal(idx[realised:], 0)


def test_deterministic_per_seed_and_step(draws):
    sampler, batches = draws
    replay = PoissonSampler.for_expected_batch(N, EXPECTED, seed=7)  # e.g. a resumed run
    for t in (0, 5, 1999):
        a, b = batches[t], replay.batch_indices(t)
        np.testing.assert_array_equal(a[0], b[0])
        np.testing.assert_array_equal(a[1], b[1])
        assert a[2] == b[2]
    other_seed = PoissonSampler.for_expected_batch(N, EXPECTED, seed=8)
    assert any(not np.array_equal(batches[t][0], other_seed.batch_indices(t)[0]) for t in range(5))
    assert not np.array_equal(batches[0][0], batches[1][0])


def test_inclusion_frequency_is_q(draws):
    sampler, batches = draws
    q = sampler.sampling_prob
    assert q == pytest.approx(EXPECTED / N)
    counts = np.zeros(N)
    for idx, mask, _ in batches:
        np.add.at(counts, idx, mask)
    # Under Poisson sampling the per-example counts are independent Binomial(STEPS, q).
    expected = STEPS * q
    chi2 = np.sum((counts - expected) ** 2 / (expected * (1 - q)))
    assert stats.chi2.sf(chi2, df=N) > 1e-4, chi2
    assert stats.chi2.cdf(chi2, df=N) > 1e-4, chi2  # not suspiciously uniform either
    sizes = np.array([r for _, _, r in batches])
    assert abs(sizes.mean() - N * q) < 5 * np.sqrt(N * q * (1 - q) / STEPS)
    assert abs(sizes.var() - N * q * (1 - q)) < 0.15 * N * q * (1 - q)  # Binomial, not fixed
    assert sizes.max() <= sampler.padded_batch_size


def test_padded_size_is_smallest_with_small_tail():
    n, q = 10_000, 256 / 10_000
    s = padded_size_for(n, q, 1e-9)
    assert stats.binom.sf(s, n, q) <= 1e-9 < stats.binom.sf(s - 1, n, q)
    sampler = PoissonSampler.for_expected_batch(n, 256, seed=0)
    assert sampler.padded_batch_size == s
    rounded = PoissonSampler.for_expected_batch(n, 256, seed=0, pad_to_multiple=16)
    assert rounded.padded_batch_size % 16 == 0 and s <= rounded.padded_batch_size < s + 16
    assert PoissonSampler.for_expected_batch(50, 50, seed=0).padded_batch_size == 50  # q = 1


def test_cost_scales_with_batch_not_dataset():
    # N = 2e9: anything O(N) (coin flips, permutations) would take many GB and seconds.
    sampler = PoissonSampler.for_expected_batch(2_000_000_000, 100, seed=1)
    start = time.perf_counter()
    for t in range(20):
        idx, mask, realised = sampler.batch_indices(t)
        assert mask.sum() == realised
    assert time.perf_counter() - start < 2.0


def test_truncation_drops_excess_and_warns():
    sampler = PoissonSampler(num_examples=100, sampling_prob=0.5, padded_batch_size=10, seed=0)
    with pytest.warns(RuntimeWarning, match="dropping"):
        idx, mask, realised = sampler.batch_indices(0)
    assert realised == 10 and mask.sum() == 10 and len(np.unique(idx)) == 10


@pytest.mark.parametrize("q", [0.0, -0.1, 1.5])
def test_bad_sampling_prob(q):
    with pytest.raises(ValueError, match=str(q)):
        PoissonSampler(num_examples=100, sampling_prob=q, padded_batch_size=10, seed=0)


def test_bad_expected_batch_and_step():
    with pytest.raises(ValueError, match="300/100"):
        PoissonSampler.for_expected_batch(100, 300, seed=0)
    sampler = PoissonSampler(num_examples=100, sampling_prob=0.1, padded_batch_size=30, seed=0)
    with pytest.raises(ValueError, match="-1"):
        sampler.batch_indices(-1)
