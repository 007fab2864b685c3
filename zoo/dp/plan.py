"""A run's DP-SGD plan: one frozen value, made in one place.

:func:`make_plan` turns the recipe's ``[dp]`` section (:class:`zoo.configs.DPConfig`), the
number of records, the planned steps and the layout into a :class:`DPPlan`: the calibrated
noise multiplier, the clip norm and clipping method, the Poisson sampler with its padding, the
accountant and the epsilon and delta the planned steps spend. ``zoo train``, ``zoo audit`` (its
canaries are extra records, :func:`make_plan`'s ``canaries``), ``zoo bench`` and
``benchmarks/`` all get their plan here, so what the audit certifies is what training runs.

A bench or a test that feeds fixed batches of its own (no sampler, no accounting) gets its plan
from :func:`fixed_batch_plan`, with the same defaults (:class:`zoo.configs.DPConfig`'s).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from zoo.checks import require_int, require_number
from zoo.configs import DPConfig
from zoo.dp.accounting import (
    calibrate_gaussian,
    epsilon_spent,
    guaranteed_privacy,
    resolve_noise_multiplier,
    truncation_budget,
)
from zoo.dp.sampling import SAMPLERS, PoissonSampler, make_sampler
from zoo.dp.validate import check_units
from zoo.parallel.layout import Layout

__all__ = ["DPPlan", "fixed_batch_plan", "make_plan"]

_DEFAULTS = DPConfig()  # the one place each setting's default is written


@dataclass(frozen=True)
class DPPlan:
    """What the DP step uses (noise multiplier, clip norm, clipping method, microbatch size,
    noise PRNG, and the public normaliser ``expected_batch_size``) and, for a run that samples
    its own batches, what the loop and the summary use: the sampler (padded to a multiple of
    ``pad_multiple``, truncated with probability at most ``truncation_prob`` per step), the
    accountant, and the ``epsilon`` the planned steps spend at ``delta``."""

    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float  # the noisy sum is divided by it: public, never the realised size
    microbatch_size: int | None = _DEFAULTS.microbatch_size
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
    # The records of one unit that a step draws each on its own, each a step's clipped term:
    # 1 (a record; a ULS user, drawn as one unit), or k = dp.records_per_user under ELS
    # (zoo.dp.els), accounted as a mixture of Gaussians (zoo.dp.accounting).
    records_per_unit: int = 1

    def epsilon_at(self, steps: int) -> float:
        """Epsilon spent after ``steps`` steps at the plan's ``delta`` (before the first: 0, or
        the DP-PCA's)."""
        if steps == 0 and self.pca_noise_multiplier is None:
            return 0.0
        return epsilon_spent(
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            sampling_prob=self.sampler.sampling_prob,
            steps=steps,
            accountant=self.accountant,
            pca_noise_multiplier=self.pca_noise_multiplier,
            records_per_unit=self.records_per_unit,
        )

    def privacy_at(self, steps: int) -> dict[str, float]:
        """The ``(epsilon, delta)`` guaranteed after ``steps`` steps, the Poisson truncation
        included (:func:`zoo.dp.accounting.guaranteed_privacy`; with DP-PCA, each part too)."""
        return guaranteed_privacy(
            self.sampler.units,
            noise_multiplier=self.noise_multiplier,
            delta=self.delta,
            steps=steps,
            accountant=self.accountant,
            pca_noise_multiplier=self.pca_noise_multiplier,
            records_per_unit=self.records_per_unit,
        )


def make_plan(
    dp: DPConfig,
    num_records: int,
    steps: int,
    layout: Layout,
    *,
    seed: int,
    canaries: int = 0,
    canary_rows: bool = False,
    users: tuple[np.ndarray, np.ndarray] | None = None,
) -> DPPlan:
    """The plan of an enabled ``[dp]`` section for ``num_records`` private records, ``steps``
    planned steps and the run's ``layout``; the sampler draws with ``seed``.

    ``canaries`` (``zoo audit``) are extra records, each in the training set with probability
    1/2: the accounting counts ``num_records + canaries // 2`` records (``q`` is the expected
    batch over them, the noise is calibrated for that ``q``), while the sampler draws the
    ``num_records`` real ones (the canaries toss coins of their own). ``canary_rows``: they
    travel as batch rows (black-box), so the padding has room for all of them.

    The padded batch splits over the layout's batch axes and into clipping microbatches
    (a multiple of their lcm), and is sized so that truncating a draw adds at most
    ``delta / 1000`` to delta (docs/dp.md, "Fixed shapes"). Padding only adds masked rows:
    the sample, the clipped sum and the accounting stay.

    Under ``dp.unit = "user"``, ``users`` (``(offsets, rows)``, :func:`zoo.data.users.group_rows`)
    groups the records by user, ``num_records`` is unused, and the sampler row's ``users``
    (:class:`zoo.dp.sampling.UserDraws`) draws them: ULS counts, samples and pads users
    (:class:`zoo.dp.users.UserSampler`), ELS records, at most ``k`` per user
    (:class:`zoo.dp.els.CappedRecordSampler`), and the accounting is per user for both.
    """
    if dp.unit == "user":
        return _user_plan(dp, steps, layout, seed, users, canaries, canary_rows)
    check_units(num_records)  # before the canaries are counted: a run of canaries only is refused too
    canaries = require_int("canaries", canaries, lo=0, what="an int >= 0")
    accounted = num_records + canaries // 2
    extra_rows = canaries if canary_rows else 0

    def sampler(truncation: float, multiple: int):
        return make_sampler(
            dp.sampler,
            num_records,
            dp.expected_batch_size,
            seed,
            truncation,
            pad_to_multiple=multiple,
            population=accounted,
            extra_rows=extra_rows,
        )

    return _plan(dp, accounted, steps, layout, sampler)


def _plan(dp: DPConfig, units: int, steps: int, layout: Layout, draw, records_per_unit: int = 1, **fields):
    """The plan over ``units`` privacy units of ``records_per_unit`` records each drawn on its
    own: the noise for them, and the sampler ``draw(truncation_prob, pad_to_multiple)``."""
    pca = pca_noise_multiplier(dp)
    sigma, epsilon = resolve_noise_multiplier(dp, units, steps, pca, records_per_unit)
    multiple = math.lcm(dp.microbatch_size or 1, layout.spec.batch_ways)
    truncation = truncation_budget(delta=dp.delta, epsilon=epsilon, steps=steps)
    sampler = draw(truncation, multiple)
    return DPPlan(
        noise_multiplier=sigma,
        clip_norm=dp.clip_norm,
        expected_batch_size=sampler.sampling_prob * units * records_per_unit,
        microbatch_size=dp.microbatch_size,
        clipping=dp.clipping,
        noise_prng=dp.noise_prng,
        accountant=dp.accountant,
        delta=dp.delta,
        sampler=sampler,
        epsilon=epsilon,
        pad_multiple=multiple,
        truncation_prob=truncation,
        pca_noise_multiplier=pca,
        records_per_unit=records_per_unit,
        **fields,
    )


def _user_plan(dp: DPConfig, steps: int, layout: Layout, seed: int, users, canaries, canary_rows) -> DPPlan:
    """The plan of ``dp.unit = "user"``: the sampler row's way of drawing users' records. zoo
    audit's canaries are users then, counted (``N_users + M // 2``), padded (black-box) and
    drawn as users (ULS; ELS refuses them)."""
    n_users = _user_count(users)
    check_units(n_users)
    canaries = require_int("canaries", canaries, lo=0, what="an int >= 0")
    draws, k = SAMPLERS[dp.sampler].users, dp.records_per_user  # the row: validate.check_choices
    accounted, extra_rows = n_users + canaries // 2, canaries if canary_rows else 0

    def sampler(truncation: float, multiple: int):
        return draws.make(
            users,
            k,
            dp.expected_batch_size,
            seed,
            truncation,
            pad_to_multiple=multiple,
            population=accounted,
            extra_rows=extra_rows,
        )

    per_unit, slots = (k, None) if draws.per_record else (1, k)
    return _plan(dp, accounted, steps, layout, sampler, per_unit, unit="user", records_per_user=slots)


def _user_count(users) -> int:
    """The number of users, the records a user-level plan is made over."""
    if users is None:
        raise ValueError("dp.unit = 'user' needs the records grouped by user (data.user_column)")
    return len(users[0]) - 1


def pca_noise_multiplier(dp: DPConfig) -> float | None:
    """The DP-PCA's noise multiplier: the one whose Gaussian release alone spends
    ``dp.pca_epsilon`` at ``dp.delta`` (None without DP-PCA). DP-SGD's is then calibrated for
    what the two spend composed (:func:`zoo.dp.accounting.resolve_noise_multiplier`)."""
    if dp.pca_epsilon is None:
        return None
    return calibrate_gaussian(epsilon=dp.pca_epsilon, delta=dp.delta, accountant=dp.accountant)


def without_noise(plan: DPPlan) -> DPPlan:
    """``plan`` with the noise turned off (the audit's ``--no-noise``): the same clipping,
    sampler and padding, and no privacy claimed (epsilon infinite)."""
    return dataclasses.replace(plan, noise_multiplier=0.0, epsilon=math.inf)


def fixed_batch_plan(batch_size: float, *, noise_multiplier: float = 1.0, **settings) -> DPPlan:
    """The plan of a DP step fed batches by its caller (benches, tests): no sampler, no
    accounting, and the noisy sum divided by ``batch_size`` (the rows of a fixed batch, or
    the expected size of the padded batches the caller draws). ``settings`` are
    :class:`zoo.configs.DPConfig` fields (``clip_norm``, ``clipping``, ``microbatch_size``,
    ``noise_prng``...); the rest keep DPConfig's defaults."""
    dp = dataclasses.replace(_DEFAULTS, **settings)
    rows = require_number("batch_size", batch_size, positive=True, finite=True)
    return DPPlan(
        noise_multiplier=require_number("noise_multiplier", noise_multiplier, lo=0.0),
        clip_norm=dp.clip_norm,
        expected_batch_size=rows,
        microbatch_size=dp.microbatch_size,
        clipping=dp.clipping,
        noise_prng=dp.noise_prng,
        accountant=dp.accountant,
        delta=dp.delta,
        pad_multiple=dp.microbatch_size or 1,
    )
