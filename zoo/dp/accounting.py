"""DP-SGD's privacy from numbers: thin wrappers that build a mechanism and ask the accountant.

A question asked with numbers (a noise multiplier, a sampling rate ``q``, steps, a DP-PCA
release, ``k`` records a unit each drawn on its own) is the question asked of the mechanism
those numbers make: :class:`zoo.dp.mechanisms.DPSGD`'s ``PoissonSampledDpEvent(q,
GaussianDpEvent(sigma))`` self-composed over the steps (for ``k > 1``, ELS's
``MixtureOfGaussiansDpEvent``), composed after DP-PCA's ``GaussianDpEvent`` when there is one.
:mod:`zoo.dp.mechanisms.accountant` composes it: the same grids, search and range checks a run's
plan gets, so a number asked here is a run's number. The neighbouring relation is add/remove one
unit, matching the sensitivity ``C`` of the clipped sum (:mod:`zoo.dp.clipping`).

Accountants: ``"pld"`` (privacy loss distributions, tight; the default) and ``"rdp"`` (Renyi
DP, faster but looser). ``pld_discretization`` is the PLD grid: coarser is faster and still a
valid (pessimistic) upper bound on epsilon.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from zoo.checks import is_int, is_number
from zoo.configs import DPConfig
from zoo.dp.mechanisms import DPPCA, ELS
from zoo.dp.mechanisms import accountant as account
from zoo.dp.mechanisms.accountant import (
    DEFAULT_PLD_DISCRETIZATION,
    SEARCH_PLD_DISCRETIZATION,
    calibrate_gaussian,
)
from zoo.dp.truncation import check_steps as _check_steps
from zoo.dp.truncation import truncation_budget, truncation_delta
from zoo.dp.validate import ACCOUNTANTS, check_choices, check_pca, validate
from zoo.errors import ZooError

if TYPE_CHECKING:
    from zoo.dp.sampling import PoissonSampler

__all__ = [
    "ACCOUNTANTS",
    "DEFAULT_PLD_DISCRETIZATION",
    "DPConfig",
    "SEARCH_PLD_DISCRETIZATION",
    "check_choices",
    "check_pca",
    "validate",
    "calibrate_gaussian",
    "calibrate_noise_multiplier",
    "epsilon_spent",
    "guaranteed_privacy",
    "mechanism_at",
    "truncation_budget",
    "truncation_delta",
    "max_steps_within_budget",
    "resolve_noise_multiplier",
]


@dataclass(frozen=True)
class _AtRate(ELS):
    """DP-SGD at a sampling rate given as a number: ELS's step over ``k`` records a unit, each
    drawn at ``rate`` (``k = 1``: the Poisson-sampled Gaussian of :class:`DPSGD`)."""

    rate: float = 1.0

    @property
    def sampling_prob(self) -> float:
        return self.rate


def mechanism_at(
    noise_multiplier: float,
    sampling_prob: float,
    pca_noise_multiplier: float | None = None,
    records_per_unit: int = 1,
):
    """The mechanism of these numbers: DP-SGD drawing each unit at ``sampling_prob`` (``k =
    records_per_unit`` records each drawn on its own: ELS), after a DP-PCA release of
    ``pca_noise_multiplier`` when given."""
    sgd = _AtRate(
        float(noise_multiplier), 1.0, float(sampling_prob), 1, k=records_per_unit, rate=float(sampling_prob)
    )
    return sgd if pca_noise_multiplier is None else DPPCA(sgd, float(pca_noise_multiplier))


def _check_common(delta: float, sampling_prob: float) -> None:
    if not (is_number(delta) and 0.0 < delta < 1.0):
        raise ZooError(f"delta must be in (0, 1); got delta={delta!r}.")
    if not (is_number(sampling_prob) and 0.0 < sampling_prob <= 1.0):
        raise ZooError(f"sampling_prob must be in (0, 1]; got sampling_prob={sampling_prob!r}.")


def _per_unit(records_per_unit: int, accountant: str) -> int:
    if not (is_int(records_per_unit) and records_per_unit >= 1):
        raise ZooError(f"records_per_unit must be an int >= 1; got records_per_unit={records_per_unit!r}.")
    if records_per_unit > 1 and accountant != "pld":
        raise ZooError(
            f"a unit of {records_per_unit} records is accounted by 'pld' only; got accountant={accountant!r}"
        )
    return int(records_per_unit)


def epsilon_spent(
    *,
    noise_multiplier: float,
    delta: float,
    sampling_prob: float,
    steps: int,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
    pca_noise_multiplier: float | None = None,
    records_per_unit: int = 1,
) -> float:
    """Epsilon at ``delta`` after ``steps`` Poisson-subsampled Gaussian steps (composed with
    the DP-PCA's Gaussian release of ``pca_noise_multiplier``, when given), for a unit of
    ``records_per_unit`` records each drawn on its own (ELS; the PLD accountant only, on a grid
    no finer than :data:`zoo.dp.mixture.MIXTURE_PLD_DISCRETIZATION`)."""
    _check_common(delta, sampling_prob)
    steps = _check_steps(steps)
    for name, value in (
        ("noise_multiplier", noise_multiplier),
        ("pca_noise_multiplier", pca_noise_multiplier),
    ):
        if value is not None and not (is_number(value) and value >= 0):
            raise ZooError(f"{name} must be >= 0; got {name}={value!r}.")
    mechanism = mechanism_at(
        noise_multiplier, sampling_prob, pca_noise_multiplier, _per_unit(records_per_unit, accountant)
    )
    return account.epsilon(mechanism, steps, float(delta), accountant, pld_discretization)


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sampling_prob: float,
    steps: int,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
    pca_noise_multiplier: float | None = None,
    records_per_unit: int = 1,
) -> float:
    """The smallest noise multiplier (to ~1e-6) whose epsilon after ``steps`` (composed with a
    DP-PCA release of ``pca_noise_multiplier``, when given; ``records_per_unit`` as
    :func:`epsilon_spent`) is <= ``epsilon``: searched on :data:`SEARCH_PLD_DISCRETIZATION`,
    whose pessimistic epsilon bounds the finer grid's from above, then checked on the finer
    ``pld_discretization`` grid (and searched there again in the unlikely case it fails)."""
    _check_common(delta, sampling_prob)
    steps = _check_steps(steps)
    if steps == 0:
        raise ZooError("steps must be >= 1 to calibrate a noise multiplier; got steps=0.")
    if not (is_number(epsilon) and epsilon > 0 and math.isfinite(epsilon)):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={epsilon!r}.")
    mechanism = mechanism_at(
        1.0, sampling_prob, pca_noise_multiplier, _per_unit(records_per_unit, accountant)
    )
    return account.calibrate(mechanism, float(epsilon), float(delta), steps, accountant, pld_discretization)


def max_steps_within_budget(
    *,
    noise_multiplier: float,
    epsilon: float,
    delta: float,
    sampling_prob: float,
    upper: int = 100000,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> int:
    """Largest ``steps`` in ``[0, upper]`` with ``epsilon_spent(steps) <= epsilon`` (binary search)."""
    upper = _check_steps(upper)
    if not (is_number(epsilon) and epsilon > 0):
        raise ZooError(f"epsilon must be > 0; got epsilon={epsilon!r}.")
    spent = functools.partial(
        epsilon_spent,
        noise_multiplier=noise_multiplier,
        delta=delta,
        sampling_prob=sampling_prob,
        accountant=accountant,
        pld_discretization=pld_discretization,
    )
    if upper == 0 or spent(steps=upper) <= epsilon:
        return upper
    lo, hi = 0, upper  # invariant: spent(lo) <= epsilon < spent(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if spent(steps=mid) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def resolve_noise_multiplier(
    cfg: DPConfig,
    num_examples: int,
    steps: int,
    pca_noise_multiplier: float | None = None,
    records_per_unit: int = 1,
) -> tuple[float, float]:
    """``(noise_multiplier, epsilon)`` for a validated, enabled config run for ``steps`` steps
    (after a DP-PCA release of ``pca_noise_multiplier``, when given: the epsilon is the two
    composed, and a calibrated noise multiplier is DP-SGD's share of ``cfg.epsilon``), over
    ``num_examples`` units of ``records_per_unit`` records each drawn on its own (``q = E /
    (num_examples * records_per_unit)``). With ``cfg.epsilon`` the noise multiplier is
    calibrated to it (the epsilon returned is what it spends, <= target); with
    ``cfg.noise_multiplier``, the epsilon it spends is computed."""
    if not cfg.enabled:
        raise ZooError("resolve_noise_multiplier needs a config with enabled=True.")
    validate(cfg, num_examples, records_per_unit)
    q = cfg.expected_batch_size / (num_examples * records_per_unit)
    common = {"delta": cfg.delta, "sampling_prob": q, "steps": steps, "records_per_unit": records_per_unit}
    common.update(accountant=cfg.accountant, pca_noise_multiplier=pca_noise_multiplier)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise_multiplier(epsilon=cfg.epsilon, **common)
    return float(sigma), epsilon_spent(noise_multiplier=sigma, **common)


def guaranteed_privacy(
    sampler: PoissonSampler,
    *,
    noise_multiplier: float,
    delta: float,
    steps: int,
    accountant: str = "pld",
    pca_noise_multiplier: float | None = None,
    records_per_unit: int = 1,
) -> dict[str, float]:
    """The ``(epsilon, delta)`` a DP-SGD run with this fixed-shape ``sampler`` guarantees after
    ``steps`` steps (after a DP-PCA release of ``pca_noise_multiplier``, when given), for units
    of ``records_per_unit`` records each drawn on its own: ``epsilon`` at the accountant's
    ``delta``, plus what truncating the Poisson draws to the sampler's padded size adds
    (``delta_truncation``, :func:`truncation_delta`); ``delta`` is the sum. With DP-PCA also
    ``epsilon_pca`` and ``epsilon_sgd``, each part alone (their composition is ``epsilon``)."""
    mechanism = mechanism_at(noise_multiplier, sampler.sampling_prob, pca_noise_multiplier, records_per_unit)
    eps = epsilon_spent(
        noise_multiplier=noise_multiplier,
        delta=delta,
        sampling_prob=sampler.sampling_prob,
        steps=steps,
        accountant=accountant,
        pca_noise_multiplier=pca_noise_multiplier,
        records_per_unit=records_per_unit,
    )
    extra = truncation_delta(
        num_examples=sampler.num_examples,
        sampling_prob=sampler.sampling_prob,
        padded_batch_size=sampler.padded_batch_size,
        steps=steps,
        epsilon=eps,
        records_per_unit=records_per_unit,
    )
    return {
        "epsilon": eps,
        "delta": delta + extra,
        "delta_accountant": delta,
        "delta_truncation": extra,
        **account.part_epsilons(mechanism, steps, delta, accountant),
    }
