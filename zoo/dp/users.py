"""User-level DP-SGD (``dp.unit = "user"``): user-level sampling and per-user clipping (ULS,
Charles et al., "Fine-Tuning Large Language Models with User-Level Differential Privacy").

Each step Poisson-samples *users* at ``q = dp.expected_batch_size / N_users`` (the record-level
:class:`zoo.dp.sampling.PoissonSampler`, over users). A drawn user contributes at most
``k = dp.records_per_user`` of its records, chosen at random under the run's secret seed; the
batch is ``[P, k]`` slots (``P`` the padded number of users), flattened to ``P * k`` rows, and
the slots a user does not fill are masked. The user's loss is the mean over its filled slots,
so the gradient clipped as one unit is the user's mean gradient (:func:`user_loss`): adding or
removing a user, with all of its records, changes the clipped sum by at most the clip norm,
and the noise and the accounting are the record-level ones with ``N = N_users``.

Every shape (``P``, ``k``) follows from the declared settings and the number of users, never
from how many records the largest user has: a user with more than ``k`` records is subsampled,
silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

import jax.numpy as jnp
import numpy as np

from zoo.checks import require_positive_int
from zoo.dp.sampling import PoissonSampler, UserDraws, add_user_draws

__all__ = ["UserSampler", "group_users", "user_loss"]

_CHOICE_STREAM = 1  # the records' draw: a stream of the step's rng apart from the users' draw


@dataclass(frozen=True, eq=False)
class UserSampler:
    """Users drawn by ``units`` (a Poisson sampler over ``N_users``), each giving at most
    ``records_per_user`` of its records: ``rows[offsets[u]:offsets[u + 1]]`` are user ``u``'s.

    ``num_examples``, ``sampling_prob`` and the accounting read the units (users);
    ``padded_batch_size`` is the rows of a step's batch, ``padded_users * records_per_user``."""

    units: PoissonSampler
    records_per_user: int
    offsets: np.ndarray = field(repr=False)  # int64 [N_users + 1]
    rows: np.ndarray = field(repr=False)  # int64 [records]: record indices grouped by user
    algorithm: ClassVar[str] = "ULS"

    def __post_init__(self):
        require_positive_int("records_per_user", self.records_per_user)
        if len(self.offsets) != self.units.num_examples + 1:
            raise ValueError(
                f"the user groups hold {len(self.offsets) - 1} users; the sampler draws "
                f"{self.units.num_examples}"
            )

    @property
    def num_examples(self) -> int:
        """Users (the privacy units)."""
        return self.units.num_examples

    @property
    def users(self) -> int:
        return self.units.num_examples

    @property
    def sampling_prob(self) -> float:
        return self.units.sampling_prob

    @property
    def expected_batch_size(self) -> float:
        """Expected users per step."""
        return self.units.expected_batch_size

    @property
    def padded_users(self) -> int:
        return self.units.padded_batch_size

    @property
    def padded_batch_size(self) -> int:
        """Rows of a step's batch: ``padded_users * records_per_user`` slots."""
        return self.units.padded_batch_size * self.records_per_user

    def batch_indices(self, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(indices int32 [P*k], mask float32 [P*k], realised users)``: slot ``s * k + j``
        holds the ``j``-th record drawn for the ``s``-th drawn user (mask 1), or padding
        (index 0, mask 0). A user fills one slot row of ``k``, never two."""
        users, user_mask, realised = self.units.batch_indices(step)
        k = self.records_per_user
        rng = np.random.default_rng([int(self.units.seed), int(step), _CHOICE_STREAM])
        indices = np.zeros((len(users), k), np.int32)
        mask = np.zeros((len(users), k), np.float32)
        for slot in np.flatnonzero(user_mask):
            user = int(users[slot])
            own = self.rows[self.offsets[user] : self.offsets[user + 1]]
            if len(own) > k:  # subsampled, silently: the cap is declared, not the user's count
                own = np.sort(rng.choice(own, size=k, replace=False))
            indices[slot, : len(own)] = own
            mask[slot, : len(own)] = 1.0
        return indices.reshape(-1), mask.reshape(-1), realised


def group_users(batch: dict, records_per_user: int) -> dict:
    """A flat batch of ``P * k`` rows (``x``, ``y``, ``mask``) as ``P`` users: ``x`` ``[P, k,
    ...]``, ``y`` ``{"y": [P, k, ...], "mask": [P, k]}`` (the slot mask travels with the
    labels, to :func:`user_loss`), and ``mask`` ``[P]``, 1 for a drawn user."""
    k = records_per_user

    def by_user(a):
        return a.reshape((a.shape[0] // k, k) + a.shape[1:])

    slots = by_user(batch["mask"])
    return {
        **batch,
        "x": by_user(batch["x"]),
        "y": {"y": by_user(batch["y"]), "mask": slots},
        "mask": (slots.sum(axis=1) > 0).astype(slots.dtype),
    }


def user_loss(batch_losses: Callable) -> Callable:
    """The loss of one user, ``loss(trainable, frozen, x [k, ...], y {"y", "mask"})``: the mean
    of ``batch_losses(trainable, frozen, x, y) -> [k]`` over the user's filled slots (an empty
    slot adds exactly nothing, even a NaN). Its gradient is the user's mean gradient."""

    def loss(trainable, frozen, x, y):
        losses = batch_losses(trainable, frozen, x, y["y"])
        keep = y["mask"] > 0
        total = jnp.where(keep, losses.astype(jnp.float32), 0.0).sum()
        return total / jnp.maximum(keep.sum(), 1).astype(jnp.float32)

    return loss


def _uls_draws(
    users,
    records_per_user: int,
    expected_batch_size,
    seed,
    truncation_prob,
    *,
    pad_to_multiple=1,
    population=None,
    extra_rows=0,
) -> UserSampler:
    """ULS: users Poisson-sampled at ``q = E / N_users``, each giving at most ``k`` records."""
    offsets, rows = users
    units = PoissonSampler.for_expected_batch(
        len(offsets) - 1,
        expected_batch_size,
        seed,
        truncation_prob,
        pad_to_multiple=pad_to_multiple,
        neighbours=True,
        population=population,
        extra_rows=extra_rows,
    )
    return UserSampler(units, records_per_user, offsets, rows)


add_user_draws("poisson", UserDraws(_uls_draws))
