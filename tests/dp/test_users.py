"""User-level DP-SGD (zoo.dp.users): users drawn into [users, k] slots, one slot row per user,
and each user's mean gradient clipped as one unit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.data.users import group_rows
from zoo.dp.clipping import ClipRequest, clipped_grad_sum
from zoo.dp.sampling import PoissonSampler
from zoo.dp.users import UserSampler, group_users, user_loss
from zoo.losses import per_example_loss

RECORDS_OF = np.array([1, 9, 2, 2, 14, 3, 1, 5, 7, 1] * 4)  # 40 users, skewed
OWNER = np.random.default_rng(0).permutation(np.repeat(np.arange(len(RECORDS_OF)), RECORDS_OF))
K = 3


def sampler(seed: int = 5) -> UserSampler:
    units = PoissonSampler.for_expected_batch(len(RECORDS_OF), 10, seed, 1e-9, neighbours=True)
    return UserSampler(units, K, *group_rows(OWNER))


def check_one_row_per_user(indices: np.ndarray, mask: np.ndarray, owner: np.ndarray, k: int) -> None:
    """Each filled slot row holds the distinct records of one user, min(k, its records) of
    them, and no user fills two rows."""
    rows, filled = indices.reshape(-1, k), mask.reshape(-1, k) > 0
    row_of = {}  # user -> the slot row it fills
    for r, (row, keep) in enumerate(zip(rows, filled, strict=True)):
        users = set(owner[row[keep]].tolist())
        assert len(users) <= 1, f"one slot row holds the records of users {sorted(users)}"
        for user in users:
            assert user not in row_of, f"user {user} fills two slot rows of one step"
            row_of[user] = r
    for user, r in row_of.items():
        records = rows[r][filled[r]]
        assert len(set(records.tolist())) == len(records), f"user {user}'s records repeat"
        assert len(records) == min(k, int((owner == user).sum())), f"user {user}'s slots"


def test_a_users_records_fill_one_slot_row_of_a_step():
    s = sampler()
    drawn = 0
    for step in range(50):
        indices, mask, realised = s.batch_indices(step)
        assert indices.shape == mask.shape == (s.padded_users * K,)
        check_one_row_per_user(indices, mask, OWNER, K)
        assert realised == int((mask.reshape(-1, K).sum(axis=1) > 0).sum())
        drawn += realised
    assert 0.7 * 50 * 10 < drawn < 1.3 * 50 * 10  # users, not records, are drawn at q = E / N_users


def test_the_slot_check_catches_a_user_split_over_two_slot_rows():
    """Planted: a batch whose largest drawn user has one record moved to a padding row."""
    s = sampler()
    for step in range(50):
        indices, mask, _ = s.batch_indices(step)
        rows, filled = indices.reshape(-1, K).copy(), mask.reshape(-1, K).copy()
        full = [r for r in range(len(rows)) if filled[r].sum() >= 2]
        empty = [r for r in range(len(rows)) if filled[r].sum() == 0]
        if full and empty:
            break
    src, dst = full[0], empty[0]
    rows[dst, 0], filled[dst, 0], filled[src, 1] = rows[src, 1], 1.0, 0.0
    with pytest.raises(AssertionError, match="two slot rows"):
        check_one_row_per_user(rows.reshape(-1), filled.reshape(-1), OWNER, K)


def test_records_of_a_large_user_are_drawn_with_the_seed_and_vary_by_step():
    """A user above k gives k of its records, chosen at random under the sampler's seed: the
    same seed and step give the same slots, other steps other records."""
    s, again = sampler(), sampler()
    np.testing.assert_array_equal(s.batch_indices(3)[0], again.batch_indices(3)[0])
    largest = int(np.argmax(RECORDS_OF))
    chosen = set()
    for step in range(200):
        indices, mask, _ = s.batch_indices(step)
        picked = indices[(mask > 0) & (OWNER[indices] == largest)]
        chosen.add(tuple(sorted(picked.tolist())))
    assert len(chosen) > 3


# -- per-user clipping against a float64 reference -----------------------------------------------
def linear_losses(params, frozen, x, y):
    """Per-record loss of a softmax regression: ``x`` [k, F], ``y`` [k]."""
    return per_example_loss(x @ params["w"] + params["b"], y)


def reference_user_sum(params, x, y, slots, clip: float) -> dict:
    """float64 NumPy: per user, the mean gradient over its filled slots, clipped to ``clip``,
    summed over the users."""
    w, b = (np.asarray(params[n], np.float64) for n in ("w", "b"))
    total = {"w": np.zeros_like(w), "b": np.zeros_like(b)}
    for xu, yu, mu in zip(x.astype(np.float64), y, slots, strict=True):
        keep = mu > 0
        if not keep.any():
            continue
        xs, ys = xu[keep], yu[keep]
        logits = xs @ w + b
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(len(ys)), ys] -= 1.0  # d loss / d logits of each record
        gw, gb = xs.T @ p / len(ys), p.sum(axis=0) / len(ys)
        norm = np.sqrt((gw**2).sum() + (gb**2).sum())
        scale = min(1.0, clip / norm) if norm > 0 else 1.0
        total["w"] += scale * gw
        total["b"] += scale * gb
    return total


@pytest.mark.numerics
@pytest.mark.parametrize("clip", [0.05, 1e6])
def test_a_users_mean_gradient_is_clipped_as_one_unit(clip):
    """The sum of the users' clipped mean gradients, as the engine's vmap path computes it
    (group_users, user_loss, clipped_grad_sum), equals float64 NumPy's. A sum over a user's
    records instead of their mean, or clipping each record, fails it."""
    rng = np.random.default_rng(1)
    users, features, classes = 6, 5, 3
    params = {
        "w": jnp.asarray(rng.normal(size=(features, classes)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(classes,)), jnp.float32),
    }
    x = rng.normal(size=(users * K, features)).astype(np.float32)
    y = rng.integers(0, classes, users * K).astype(np.int32)
    mask = np.ones(users * K, np.float32)
    mask[[2, 4, 5, 15, 16, 17]] = 0.0  # users of 2, 1, 3, ... records; user 5 is padding
    batch = group_users({"x": x, "y": y, "mask": mask}, K)
    request = ClipRequest(clip, example_mask=batch["mask"])
    summed, norms, _ = clipped_grad_sum(
        user_loss(linear_losses), params, batch["x"], batch["y"], request=request, frozen={}
    )
    slots = mask.reshape(users, K)
    expected = reference_user_sum(params, x.reshape(users, K, -1), y.reshape(users, K), slots, clip)
    assert_close(jax.tree.map(np.asarray, summed), expected, n=K * features, what=f"clip={clip}")
    assert float(norms[-1]) == 0.0  # the padding user adds nothing
