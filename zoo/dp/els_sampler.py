"""ELS: example-level sampling with a per-user cap, accounted at the user level (Charles et al.,
"Fine-Tuning Large Language Models with User-Level Differential Privacy", SaTML 2025).

``dp.unit = "user"`` with ``dp.sampler = "els"``. Once, before the first step, each user keeps
at most ``k = dp.records_per_user`` of its records: a subset drawn under the run's secret seed
(a user with at most ``k`` keeps all of them). Every step is then record-level DP-SGD over the
kept records: each joins the batch independently with probability
``q = E / (N_users * k)`` (``E = dp.expected_batch_size``, which under ELS counts records) and
its gradient is clipped alone. ``q`` follows from the settings and the number of users (public,
as under ULS), never from how many records the users hold: when every user keeps ``k`` records
a batch holds ``E`` records on average, and fewer when users hold fewer.

Adding or removing one user adds or removes at most ``k`` records of the pool, each drawn with
probability ``q``: in one step the user is in the batch ``Binomial(k, q)`` times, and the
clipped sum moves by at most that many clip norms. The accounting
(:mod:`zoo.dp.accounting`, ``records_per_unit = k``) is that mixture of Gaussians,
dp_accounting's ``MixtureOfGaussiansDpEvent`` as jax_privacy's
``DpsgdTrainingUserLevelAccountant`` builds it, under the PLD accountant.

The padded batch is sized for ``N_users + 1`` users of ``k`` records each, drawn at ``q``
(:meth:`zoo.dp.sampling.PoissonSampler.for_expected_batch` with ``extra_rows = k``): from the
settings and the number of users only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from zoo.checks import require_positive_int
from zoo.dp.sampling import PoissonSampler, SamplerKind, UserDraws, register_sampler
from zoo.errors import ZooError

__all__ = ["CappedRecordSampler", "cap_records"]

# The cap's draw: a seed list apart from every step's draw ([seed, step], padded with zeros by
# NumPy's SeedSequence) and from ULS's record draws ([seed, step, 1]).
_CAP_STREAM = (0, 2)


def cap_records(offsets: np.ndarray, rows: np.ndarray, records_per_user: int, seed: int) -> np.ndarray:
    """The records the users keep, sorted: all of a user's records when it has at most
    ``records_per_user``, else that many of them, uniformly at random under ``seed``. ``rows``,
    ``offsets``: the records grouped by user (:func:`zoo.data.users.group_rows`)."""
    k = require_positive_int("records_per_user", records_per_user)
    offsets, rows = np.asarray(offsets, np.int64), np.asarray(rows, np.int64)
    owner = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))  # the user of rows[i]
    keys = np.random.default_rng([int(seed), *_CAP_STREAM]).random(len(rows))
    order = np.lexsort((keys, owner))  # each user's records, in a random order
    rank = np.arange(len(rows)) - offsets[owner[order]]  # the position within its user
    return np.sort(rows[order[rank < k]])


@dataclass(frozen=True, eq=False)
class CappedRecordSampler:
    """ELS's sampler: the ``kept`` records (:func:`cap_records`), each drawn at ``q`` every step.

    ``units`` is the pool at its largest, ``N_users * records_per_user`` records drawn at ``q``
    and padded for one more user's: what ``q``, the padding and the truncation's bound on delta
    (:func:`zoo.dp.accounting.guaranteed_privacy`) are computed over. ``pool`` draws the kept
    records at the same ``q``, into the same padded shape."""

    units: PoissonSampler
    records_per_user: int
    kept: np.ndarray = field(repr=False)  # int64 [<= N_users * k]: record indices, sorted
    algorithm: ClassVar[str] = "ELS"

    def __post_init__(self):
        require_positive_int("records_per_user", self.records_per_user)
        if self.units.num_examples % self.records_per_user:
            raise ValueError(
                f"the pool holds {self.units.num_examples} records, not {self.records_per_user} per user"
            )

    @classmethod
    def make(
        cls,
        users,
        records_per_user: int,
        expected_batch_size,
        seed: int,
        truncation_prob: float,
        *,
        pad_to_multiple=1,
        population=None,
        extra_rows=0,
    ) -> CappedRecordSampler:
        """ELS over ``users`` (``(offsets, rows)``) at ``q = expected_batch_size / (N_users * k)``
        (``population``: the users counted, all of them: ELS takes no canary users yet)."""
        offsets, rows = users
        if extra_rows or population not in (None, len(offsets) - 1):
            raise ZooError(
                "zoo audit's canary users are drawn as units (ULS); dp.sampler = 'els' has no audit yet"
            )
        k = require_positive_int("records_per_user", records_per_user)
        units = PoissonSampler.for_expected_batch(
            (len(offsets) - 1) * k,
            expected_batch_size,
            seed,
            truncation_prob,
            pad_to_multiple=pad_to_multiple,
            extra_rows=k,  # the neighbour with one more user
        )
        return cls(units, k, cap_records(offsets, rows, k, seed))

    @property
    def users(self) -> int:
        return self.units.num_examples // self.records_per_user

    @property
    def num_examples(self) -> int:
        """The records ``q`` is computed over: ``N_users * k``, the pool at its largest."""
        return self.units.num_examples

    @property
    def sampling_prob(self) -> float:
        return self.units.sampling_prob

    @property
    def expected_batch_size(self) -> float:
        """Expected records per step when every user keeps ``k`` (the declared E)."""
        return self.units.expected_batch_size

    @property
    def padded_batch_size(self) -> int:
        return self.units.padded_batch_size

    @property
    def pool(self) -> PoissonSampler:
        """The kept records drawn at ``q``, with the same seed and padded size as ``units``."""
        return PoissonSampler(len(self.kept), self.sampling_prob, self.padded_batch_size, self.units.seed)

    def batch_indices(self, step: int) -> tuple[np.ndarray, np.ndarray, int]:
        """``(indices int32 [P], mask float32 [P], realised records)``: each kept record drawn
        with probability ``q``, as :meth:`PoissonSampler.batch_indices` (padding: index 0)."""
        picked, mask, realised = self.pool.batch_indices(step)
        return np.where(mask > 0, self.kept[picked], 0).astype(np.int32), mask, realised


register_sampler(
    SamplerKind(
        "els",
        "dp.unit = 'user' only (ELS): each user keeps at most dp.records_per_user records, chosen once "
        "with the secret seed; each kept record joins each step's batch with probability "
        "q = E / (N_users * k) and is clipped alone; accounted per user (mixture of Gaussians, pld)",
        None,
        users=UserDraws(CappedRecordSampler.make, per_record=True),
        accountants=("pld",),
    )
)
