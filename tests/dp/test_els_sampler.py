"""ELS (zoo.dp.els_sampler): each user keeps at most k of its records, a subset fixed once from the
secret seed, and the kept records are Poisson-sampled one by one at q = E / (N_users * k)."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.data.users import group_rows
from zoo.dp.els_sampler import CappedRecordSampler, cap_records

RECORDS_OF = np.array([1, 9, 2, 2, 14, 3, 1, 5, 7, 1] * 4)  # 40 users, skewed
OWNER = np.random.default_rng(0).permutation(np.repeat(np.arange(len(RECORDS_OF)), RECORDS_OF))
K, E, STEPS = 3, 12, 300


def els(seed: int = 5, owner: np.ndarray = OWNER) -> CappedRecordSampler:
    return CappedRecordSampler.make(group_rows(owner), K, E, seed, 1e-9)


def drawn_records(sampler, steps: int = STEPS) -> np.ndarray:
    """Every record any of ``steps`` steps drew (their union), checking each batch's form."""
    seen = []
    for step in range(steps):
        indices, mask, realised = sampler.batch_indices(step)
        assert indices.shape == mask.shape == (sampler.padded_batch_size,)
        real = indices[mask > 0]
        assert len(real) == realised == len(np.unique(real))  # distinct records
        seen.append(real)
    return np.unique(np.concatenate(seen))


def check_cap(records: np.ndarray, owner: np.ndarray, k: int) -> None:
    """No user has more than ``k`` distinct records among ``records``."""
    users, counts = np.unique(owner[records], return_counts=True)
    over = users[counts > k]
    assert not len(over), f"users {over.tolist()} have more than {k} records in the pool"


def test_over_the_run_no_user_gives_more_than_k_records_and_the_pool_is_fixed():
    """The union of every step's records keeps the cap, and is the kept pool: a cap drawn
    anew each step (or none) would let the large users give more than k over the run."""
    s = els()
    union = drawn_records(s)
    check_cap(union, OWNER, K)
    assert set(union.tolist()) <= set(s.kept.tolist())
    assert len(union) > 0.9 * len(s.kept)  # the steps reach (almost) the whole pool
    kept_of = np.bincount(OWNER[s.kept], minlength=len(RECORDS_OF))
    np.testing.assert_array_equal(kept_of, np.minimum(RECORDS_OF, K))  # small users keep all


def test_the_cap_check_catches_a_cap_drawn_again_at_every_step():
    """Planted: the pool re-capped with another seed at each step (the subset not fixed)."""
    offsets, rows = group_rows(OWNER)
    s = els()
    union = [
        CappedRecordSampler(s.units, K, cap_records(offsets, rows, K, seed)).batch_indices(step)
        for step, seed in enumerate(range(100, 100 + STEPS))
    ]
    records = np.unique(np.concatenate([indices[mask > 0] for indices, mask, _ in union]))
    with pytest.raises(AssertionError, match="more than 3 records"):
        check_cap(records, OWNER, K)


def test_the_kept_subset_comes_from_the_seed():
    """The same seed keeps the same records (a resumed run); another seed, others."""
    np.testing.assert_array_equal(els(5).kept, els(5).kept)
    np.testing.assert_array_equal(els(5).batch_indices(7)[0], els(5).batch_indices(7)[0])
    assert not np.array_equal(els(5).kept, els(6).kept)


def test_records_are_drawn_at_q_over_users_times_k():
    """q = E / (N_users * k), from the settings and the number of users, so a batch holds
    q * (kept records) records on average. A q over the kept records (E / kept) fails."""
    s = els()
    n_users, kept = len(RECORDS_OF), int(np.minimum(RECORDS_OF, K).sum())
    assert s.sampling_prob == E / (n_users * K) and s.users == n_users and kept < n_users * K
    sizes = np.array([s.batch_indices(step)[2] for step in range(STEPS)])
    q = s.sampling_prob
    assert abs(sizes.mean() - q * kept) < 5 * np.sqrt(q * (1 - q) * kept / STEPS)


def test_the_padding_follows_the_users_and_k_only():
    """The padded batch is the same whatever the users hold (here none above 2 records, the
    largest 14 before): it is sized for N_users + 1 users of k records."""
    fewer = np.repeat(np.arange(len(RECORDS_OF)), np.minimum(RECORDS_OF, 2))
    assert els(owner=fewer).padded_batch_size == els().padded_batch_size
    assert els().units.num_examples == len(RECORDS_OF) * K
