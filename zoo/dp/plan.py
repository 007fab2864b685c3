"""A run's DP plan: one frozen value, made in one place.

:func:`make_plan` turns the recipe's ``[dp]`` section (:class:`zoo.configs.DPConfig`), the
number of records (or the users' records), the planned steps and the layout into a
:class:`DPPlan`. The section picks its mechanism from :data:`zoo.dp.mechanisms.MECHANISMS` (DP-SGD
over records or users, ELS, DP-PCA with DP-SGD), its performance choices become a
:class:`zoo.dp.mechanisms.Performance`, and the mechanism's ``make`` returns the sampler, the
clipped aggregation, the noise and the ``dp_event`` that the accountant composes
(:mod:`zoo.dp.mechanisms.accountant`). A :class:`DPPlan` is the view of the two that the engine,
the loop and the summary read. ``zoo train``, ``zoo audit`` (its canaries wrap the mechanism:
:meth:`zoo.dp.mechanisms.Mechanism.with_canaries`), ``zoo bench`` and ``benchmarks/`` all get
their plan here, so what the audit certifies is what training runs.

A bench or a test that feeds fixed batches of its own (no sampler, no accounting) gets its plan
from :func:`fixed_batch_plan`, with the same defaults (:class:`zoo.configs.DPConfig`'s).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zoo.checks import require_number
from zoo.configs import DPConfig
from zoo.dp.accounting import calibrate_gaussian, truncation_budget, truncation_delta
from zoo.dp.mechanisms import GaussianNoise, Mechanism, Performance, clipped_aggregation, mechanism_for
from zoo.dp.mechanisms import accountant as account
from zoo.dp.sampling import PoissonSampler
from zoo.dp.validate import check_choices, check_units, validate
from zoo.parallel.layout import Layout

__all__ = ["DPPlan", "fixed_batch_plan", "make_plan", "plan_of"]

_DEFAULTS = DPConfig()  # the one place each setting's default is written


@dataclass(frozen=True)
class DPPlan:
    """The view of a mechanism and its performance choices that the DP step, the loop and the
    summary read: noise multiplier, clip norm, clipping method, microbatch size, noise PRNG, the
    public normaliser ``expected_batch_size`` and, for a run that samples its own batches, the
    sampler (padded to a multiple of ``pad_multiple``, truncated with probability at most
    ``truncation_prob`` per step), the accountant and the ``epsilon`` the planned steps spend at
    ``delta``. ``mechanism`` (None for :func:`fixed_batch_plan`'s) is what the accountant
    composes; ``performance`` what the step is computed with."""

    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float  # the noisy sum is divided by it: public, never the realised size
    microbatch_size: int | None = None
    clipping: str = _DEFAULTS.clipping  # a row of zoo.dp.clipping.CLIPPING
    noise_prng: str = _DEFAULTS.noise_prng
    accountant: str = _DEFAULTS.accountant
    delta: float = _DEFAULTS.delta
    sampler: PoissonSampler | None = None  # None: the caller hands the step fixed batches
    epsilon: float | None = None  # what the planned steps spend (None without a sampler)
    pad_multiple: int = 1  # lcm(microbatch size, the layout's batch ways)
    truncation_prob: float | None = None  # per-step bound the padding is sized for
    # The DP-PCA's Gaussian release before the first step (zoo.dp.pca; data.dp_pca), or None.
    pca_noise_multiplier: float | None = None
    # dp.unit = "user" under ULS: the record slots of a user (the batch is [users, k];
    # zoo.dp.users). None: a row of the batch is one record, clipped alone.
    records_per_user: int | None = None
    unit: str = _DEFAULTS.unit  # what the epsilon protects: a record or a user (dp.unit)
    # The records of one unit that a step draws each on its own: 1, or k under ELS.
    records_per_unit: int = 1
    mechanism: Any = None  # a zoo.dp.mechanisms mechanism; None: no accounting
    performance: Performance | None = None

    @property
    def aggregate(self):
        """The clipped aggregation the step runs (:func:`zoo.dp.mechanisms.clipped_aggregation`)."""
        return clipped_aggregation(
            self.clip_norm, Performance(self.clipping, self.microbatch_size, self.noise_prng)
        )

    @property
    def noise(self) -> GaussianNoise:
        """The step's noise transform (:class:`zoo.dp.mechanisms.GaussianNoise`)."""
        return GaussianNoise(self.noise_multiplier, self.clip_norm, self.expected_batch_size, self.noise_prng)

    def epsilon_at(self, steps: int) -> float:
        """Epsilon spent after ``steps`` steps at the plan's ``delta``: the accountant over the
        mechanism's ``dp_event(steps)`` (before the first: 0, or the DP-PCA's)."""
        return account.epsilon(self.mechanism, steps, self.delta, self.accountant)

    def privacy_at(self, steps: int) -> dict[str, float]:
        """The ``(epsilon, delta)`` guaranteed after ``steps`` steps, the Poisson truncation
        included: ``delta`` is the accountant's plus what truncating the draws to the padded
        size adds (:func:`zoo.dp.accounting.truncation_delta`). With DP-PCA, each part's
        epsilon too (``epsilon_pca``, ``epsilon_sgd``; they compose to ``epsilon``)."""
        eps = self.epsilon_at(steps)
        parts = account.part_epsilons(self.mechanism, steps, self.delta, self.accountant)
        units = self.sampler.units
        extra = truncation_delta(
            num_examples=units.num_examples,
            sampling_prob=units.sampling_prob,
            padded_batch_size=units.padded_batch_size,
            steps=steps,
            epsilon=eps,
            records_per_unit=self.records_per_unit,
        )
        return {
            "epsilon": eps,
            "delta": self.delta + extra,
            "delta_accountant": self.delta,
            "delta_truncation": extra,
            **parts,
        }


def make_plan(
    dp: DPConfig,
    num_records: int,
    steps: int,
    layout: Layout,
    *,
    seed: int,
    microbatch_size: int | None = None,
    canaries: int = 0,
    canary_rows: bool = False,
    users: tuple[np.ndarray, np.ndarray] | None = None,
    wrap: Callable[[Mechanism], Mechanism] | None = None,
) -> DPPlan:
    """The plan of an enabled ``[dp]`` section for ``num_records`` private records, ``steps``
    planned steps and the run's ``layout``; the sampler draws with ``seed``; the clipping takes
    the batch ``microbatch_size`` examples at a time (``train.microbatch_size``).

    ``wrap`` changes the section's mechanism before it is made (``zoo audit``'s
    :class:`zoo.dp.mechanisms.Canaries`). ``canaries``, ``canary_rows``: the same wrapper, by
    its settings (:meth:`Mechanism.with_canaries`): extra
    units, each in the training set with probability 1/2, so the accounting counts ``N +
    canaries // 2`` units (``q`` is the expected batch over them), while the sampler draws the
    ``N`` real ones. ``canary_rows``: they travel as batch rows (black-box), so the padding has
    room for all of them.

    The padded batch splits over the layout's batch axes and into clipping microbatches (a
    multiple of their lcm), and is sized so that truncating a draw adds at most ``delta / 1000``
    to delta (docs/dp.md, "Fixed shapes"). Padding only adds masked rows: the sample, the
    clipped sum and the accounting stay.

    Under ``dp.unit = "user"``, ``users`` (``(offsets, rows)``, :func:`zoo.data.users.group_rows`)
    groups the records by user, ``num_records`` is unused, and the units are users.
    """
    data, units = (users, _user_count(users)) if dp.unit == "user" else (num_records, num_records)
    check_units(units)  # before the canaries are counted: a run of canaries only is refused too
    check_choices(dp)
    mechanism = mechanism_for(dp, units).with_canaries(canaries, canary_rows)
    mechanism = wrap(mechanism) if wrap else mechanism
    performance = Performance.of(dp, microbatch_size, layout.spec.batch_ways)
    return plan_of(mechanism, performance, dp, steps, data=data, seed=seed)


def plan_of(
    mechanism: Mechanism, performance: Performance, dp: DPConfig, steps: int, *, data, seed: int
) -> DPPlan:
    """The plan of ``mechanism`` (its noise multiplier None: calibrated to ``dp.epsilon``) run
    with ``performance`` for ``steps`` steps over ``data``, accounted by ``dp.accountant`` at
    ``dp.delta``. Nothing in ``performance`` reaches the accounting."""
    validate(dp, mechanism.units, mechanism.records_per_unit)
    if mechanism.noise_multiplier is None:
        sigma = account.calibrate(mechanism.with_noise(1.0), dp.epsilon, dp.delta, steps, dp.accountant)
        mechanism = mechanism.with_noise(sigma)
    epsilon = account.epsilon(mechanism, steps, dp.delta, dp.accountant)
    truncation = truncation_budget(delta=dp.delta, epsilon=epsilon, steps=steps)
    made = mechanism.make(performance, data=data, seed=seed, truncation_prob=truncation)
    return DPPlan(
        noise_multiplier=mechanism.noise_multiplier,
        clip_norm=mechanism.clip_norm,
        expected_batch_size=made.sampler.sampling_prob * mechanism.units * mechanism.records_per_unit,
        microbatch_size=performance.microbatch_size,
        clipping=performance.clipping,
        noise_prng=performance.noise_prng,
        accountant=dp.accountant,
        delta=dp.delta,
        sampler=made.sampler,
        epsilon=epsilon,
        pad_multiple=performance.pad_multiple,
        truncation_prob=truncation,
        pca_noise_multiplier=getattr(mechanism, "pca_noise_multiplier", None),
        records_per_user=mechanism.records_per_user,
        unit=mechanism.unit,
        records_per_unit=mechanism.records_per_unit,
        mechanism=mechanism,
        performance=performance,
    )


def _user_count(users) -> int:
    """The number of users, the records a user-level plan is made over."""
    if users is None:
        raise ValueError("dp.unit = 'user' needs the records grouped by user (data.user_column)")
    return len(users[0]) - 1


def pca_noise_multiplier(dp: DPConfig) -> float | None:
    """The DP-PCA's noise multiplier: the one whose Gaussian release alone spends
    ``dp.pca_epsilon`` at ``dp.delta`` (None without DP-PCA). DP-SGD's is then calibrated for
    what the two spend composed (:mod:`zoo.dp.mechanisms.pca`)."""
    if dp.pca_epsilon is None:
        return None
    return calibrate_gaussian(epsilon=dp.pca_epsilon, delta=dp.delta, accountant=dp.accountant)


def without_noise(plan: DPPlan) -> DPPlan:
    """``plan`` with the noise turned off (the audit's ``--no-noise``): the same clipping,
    sampler and padding, and no privacy claimed (epsilon infinite)."""
    return dataclasses.replace(
        plan, noise_multiplier=0.0, epsilon=math.inf, mechanism=plan.mechanism.with_noise(0.0)
    )


def fixed_batch_plan(
    batch_size: float, *, noise_multiplier: float = 1.0, microbatch_size: int | None = None, **settings
) -> DPPlan:
    """The plan of a DP step fed batches by its caller (benches, tests): no sampler, no
    accounting, and the noisy sum divided by ``batch_size`` (the rows of a fixed batch, or
    the expected size of the padded batches the caller draws), clipped ``microbatch_size``
    examples at a time. ``settings`` are :class:`zoo.configs.DPConfig` fields (``clip_norm``,
    ``clipping``, ``noise_prng``...); the rest keep DPConfig's defaults."""
    dp = dataclasses.replace(_DEFAULTS, **settings)
    rows = require_number("batch_size", batch_size, positive=True, finite=True)
    return DPPlan(
        noise_multiplier=require_number("noise_multiplier", noise_multiplier, lo=0.0),
        clip_norm=dp.clip_norm,
        expected_batch_size=rows,
        microbatch_size=microbatch_size,
        clipping=dp.clipping,
        noise_prng=dp.noise_prng,
        accountant=dp.accountant,
        delta=dp.delta,
        pad_multiple=microbatch_size or 1,
        performance=Performance.of(dp, microbatch_size),
    )
