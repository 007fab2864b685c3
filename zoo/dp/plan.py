"""A run's DP plan: the made pieces of its mechanism, in one frozen value, made in one place.

:func:`make_plan` turns the recipe's ``[dp]`` section (:class:`zoo.configs.DPConfig`), the
number of records (or the users' records), the planned steps, the layout and
``train.microbatch_size`` into a :class:`DPPlan`. The section picks its mechanism from
:data:`zoo.dp.mechanisms.MECHANISMS` (DP-SGD over records or users, ELS, DP-PCA with DP-SGD),
its performance choices become a :class:`zoo.dp.mechanisms.Performance`, and the mechanism's
``make`` returns the sampler, the clipped aggregation, the noise and the ``dp_event`` that the
accountant composes (:mod:`zoo.dp.mechanisms.accountant`). The plan holds those pieces; the
engine calls them, and nothing copies their fields. ``zoo train``, ``zoo audit`` (its canaries
wrap the mechanism, :meth:`zoo.dp.mechanisms.Mechanism.with_canaries`, and its white-box
transform travels with the plan), ``zoo bench`` and ``benchmarks/`` all get their plan here, so
what the audit certifies is what training runs.

A bench or a test that feeds fixed batches of its own (no sampler, no accounting) gets its plan
from :func:`fixed_batch_plan`: a DP-SGD mechanism like every other path's (a batch of ``B`` rows
is ``q = 1`` over ``B`` units, normaliser ``B``), with :class:`zoo.configs.DPConfig`'s defaults.
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
from zoo.dp.clipping import KEEP_SUM, ClippedSumTransform
from zoo.dp.groups import ClipStyle
from zoo.dp.mechanisms import DPSGD, Made, Mechanism, Performance, UserDPSGD, mechanism_for
from zoo.dp.mechanisms import accountant as account
from zoo.dp.truncation import truncation_budget, truncation_delta
from zoo.dp.validate import check_choices, check_units, validate
from zoo.parallel.layout import Layout

__all__ = ["Accounting", "DPPlan", "fixed_batch_plan", "make_plan", "plan_of", "without_noise"]

_DEFAULTS = DPConfig()  # the one place each setting's default is written


@dataclass(frozen=True)
class Accounting:
    """How a plan's privacy is counted (``accountant`` at ``delta``) and what its planned steps
    spend: ``epsilon``, and the per-step probability ``truncation_prob`` the padding is sized for
    (both None for :func:`fixed_batch_plan`'s: not accounted)."""

    accountant: str = _DEFAULTS.accountant
    delta: float = _DEFAULTS.delta
    epsilon: float | None = None
    truncation_prob: float | None = None


@dataclass(frozen=True)
class DPPlan:
    """A mechanism and what it made: ``mechanism`` (what the accountant composes), the
    ``performance`` choices the step is computed with, ``made`` (sampler, clipped aggregation,
    noise, ``dp_event``: what the engine and the loop call), the ``accounting`` and the
    ``transform`` of the clipped sum before the noise (``zoo audit``'s white-box canaries; by
    default the sum as it is)."""

    mechanism: Any  # a zoo.dp.mechanisms mechanism
    performance: Performance
    made: Made
    accounting: Accounting
    transform: ClippedSumTransform = KEEP_SUM

    # -- small reads of the pieces ---------------------------------------------------------
    # The made sampler (None: the caller hands the step fixed batches).
    sampler = property(lambda self: self.made.sampler)
    noise_multiplier = property(lambda self: self.mechanism.noise_multiplier)
    clip_norm = property(lambda self: self.mechanism.clip_norm)
    clip_style = property(lambda self: self.mechanism.clip_style)  # zoo.dp.groups.ClipStyle
    # The noisy sum is divided by it: public, never the realised size (the made noise's).
    expected_batch_size = property(lambda self: self.made.noise.expected_batch_size)
    # ULS's record slots of a user (the batch is [users, k]); None: a row is clipped alone.
    records_per_user = property(lambda self: self.mechanism.records_per_user)
    unit = property(lambda self: self.mechanism.unit)  # what the epsilon protects (dp.unit)
    epsilon = property(lambda self: self.accounting.epsilon)  # the planned steps' (None: not accounted)
    delta = property(lambda self: self.accounting.delta)

    # -- accounting ------------------------------------------------------------------------
    def epsilon_at(self, steps: int) -> float:
        """Epsilon spent after ``steps`` steps at the plan's ``delta``: the accountant over the
        mechanism's ``dp_event(steps)`` (before the first: 0, or the DP-PCA's)."""
        return account.epsilon(self.mechanism, steps, self.delta, self.accounting.accountant)

    def privacy_at(self, steps: int) -> dict[str, float]:
        """The ``(epsilon, delta)`` guaranteed after ``steps`` steps, the Poisson truncation
        included: ``delta`` is the accountant's plus what truncating the draws to the padded
        size adds (:func:`zoo.dp.truncation.truncation_delta`). With DP-PCA, each part's
        epsilon too (``epsilon_pca``, ``epsilon_sgd``; they compose to ``epsilon``)."""
        eps = self.epsilon_at(steps)
        parts = account.part_epsilons(self.mechanism, steps, self.delta, self.accounting.accountant)
        units = self.sampler.units
        extra = truncation_delta(
            num_examples=units.num_examples,
            sampling_prob=units.sampling_prob,
            padded_batch_size=units.padded_batch_size,
            steps=steps,
            epsilon=eps,
            records_per_unit=self.mechanism.records_per_unit,
        )
        return {
            "epsilon": eps,
            "delta": self.delta + extra,
            "delta_accountant": self.delta,
            "delta_truncation": extra,
            **parts,
        }

    # -- variants --------------------------------------------------------------------------
    def with_noise(self, noise_multiplier: float) -> DPPlan:
        """The plan with another noise multiplier: the mechanism's and the made noise's (the
        accounting is left as it was: a variant for the audit and the tests, not a new plan)."""
        made = dataclasses.replace(
            self.made, noise=dataclasses.replace(self.made.noise, noise_multiplier=float(noise_multiplier))
        )
        return dataclasses.replace(self, mechanism=self.mechanism.with_noise(noise_multiplier), made=made)

    def with_transform(self, transform: ClippedSumTransform) -> DPPlan:
        """The plan with ``transform`` on its clipped sum before the noise (``zoo audit``)."""
        return dataclasses.replace(self, transform=transform)


def make_plan(
    dp: DPConfig,
    num_records: int,
    steps: int,
    layout: Layout,
    *,
    seed: int,
    microbatch_size: int | None,
    canaries: int = 0,
    canary_rows: bool = False,
    users: tuple[np.ndarray, np.ndarray] | None = None,
    wrap: Callable[[Mechanism], Mechanism] | None = None,
) -> DPPlan:
    """The plan of an enabled ``[dp]`` section for ``num_records`` private records, ``steps``
    planned steps and the run's ``layout``; the sampler draws with ``seed``; the clipping takes
    the batch ``microbatch_size`` examples at a time (``train.microbatch_size``; None: the whole
    batch at once). It has no default: a caller that forgot it would compile the whole batch.

    ``wrap`` changes the section's mechanism before it is made (``zoo audit``'s
    :class:`zoo.dp.mechanisms.Canaries`). ``canaries``, ``canary_rows``: the same wrapper, by
    its settings (:meth:`Mechanism.with_canaries`): extra units, each in the training set with
    probability 1/2, so the accounting counts ``N + canaries // 2`` units (``q`` is the expected
    batch over them), while the sampler draws the ``N`` real ones. ``canary_rows``: they travel
    as batch rows (black-box), so the padding has room for all of them.

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
    return DPPlan(mechanism, performance, made, Accounting(dp.accountant, dp.delta, epsilon, truncation))


def _user_count(users) -> int:
    """The number of users, the records a user-level plan is made over."""
    if users is None:
        raise ValueError("dp.unit = 'user' needs the records grouped by user (data.user_column)")
    return len(users[0]) - 1


def without_noise(plan: DPPlan) -> DPPlan:
    """``plan`` with the noise turned off (the audit's ``--no-noise``): the same clipping,
    sampler and padding, and no privacy claimed (epsilon infinite)."""
    quiet = plan.with_noise(0.0)
    return dataclasses.replace(quiet, accounting=dataclasses.replace(plan.accounting, epsilon=math.inf))


def fixed_batch_plan(
    batch_size: float, *, noise_multiplier: float = 1.0, microbatch_size: int | None = None, **settings
) -> DPPlan:
    """The plan of a DP step fed batches by its caller (benches, tests): no sampler, no
    accounting, and the noisy sum divided by ``batch_size`` (the rows of a fixed batch, or
    the expected size of the padded batches the caller draws), clipped ``microbatch_size``
    examples at a time. Its mechanism is DP-SGD's (ULS's under ``unit = "user"``: the batch's
    units are users of ``records_per_user`` slots) over ``batch_size`` units all drawn (q = 1).
    ``settings`` are :class:`zoo.configs.DPConfig` fields (``clip_norm``, ``clipping``,
    ``noise_prng``, ``unit``...); the rest keep DPConfig's defaults."""
    dp = dataclasses.replace(_DEFAULTS, **settings)
    rows = require_number("batch_size", batch_size, positive=True, finite=True)
    sigma = require_number("noise_multiplier", noise_multiplier, lo=0.0)
    common = {
        "noise_multiplier": sigma,
        "clip_norm": dp.clip_norm,
        "clip_style": ClipStyle.of(dp),
        "expected_batch_size": rows,
        "units": rows,
    }
    mechanism = UserDPSGD(**common, slots=dp.records_per_user) if dp.unit == "user" else DPSGD(**common)
    performance = Performance.of(dp, microbatch_size)
    return DPPlan(mechanism, performance, mechanism.make(performance), Accounting(dp.accountant, dp.delta))
