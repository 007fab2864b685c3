"""The tests' oracle for the accountant: DP-SGD's epsilon computed from the numbers, as zoo
computed it before mechanisms were objects (the events written out here, composed by
dp_accounting). zoo's accountant composes each mechanism's own ``dp_event``
(:mod:`zoo.dp.mechanisms.accountant`); tests/dp/mechanisms/test_accountant.py holds every
mechanism's epsilon and calibrated noise to this, bit for bit."""

from __future__ import annotations

import functools
import math

from zoo.dp import bounds, mixture
from zoo.dp.mechanisms.accountant import (
    DEFAULT_PLD_DISCRETIZATION,
    SEARCH_PLD_DISCRETIZATION,
    calibrate_gaussian,
    make_accountant,
)
from zoo.dp.truncation import truncation_delta
from zoo.dp.validate import validate


def pca_noise_multiplier(dp) -> float | None:
    """The DP-PCA release's noise multiplier for ``dp.pca_epsilon`` (None without DP-PCA)."""
    if dp.pca_epsilon is None:
        return None
    return calibrate_gaussian(epsilon=dp.pca_epsilon, delta=dp.delta, accountant=dp.accountant)


def _grids(pld_discretization: float, per_unit: int) -> tuple[float, float]:
    return mixture.grids(pld_discretization, per_unit, SEARCH_PLD_DISCRETIZATION)


def _dpsgd_event(noise_multiplier, sampling_prob, steps, pca=None, per_unit=1):
    """``steps`` Poisson-subsampled Gaussian steps (a mixture of Gaussians for ``per_unit > 1``
    records per unit), after one Gaussian release of noise multiplier ``pca``."""
    import dp_accounting

    step = dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(noise_multiplier))
    if per_unit > 1:
        from scipy import stats

        draws = range(per_unit + 1)
        chances = [float(stats.binom.pmf(x, per_unit, sampling_prob)) for x in draws]
        step = dp_accounting.dp_event.MixtureOfGaussiansDpEvent(noise_multiplier, list(draws), chances)
    sgd = dp_accounting.SelfComposedDpEvent(step, steps)
    if pca is None:
        return sgd
    first = dp_accounting.GaussianDpEvent(pca)
    return dp_accounting.ComposedDpEvent([first, sgd]) if steps else first


@functools.lru_cache(maxsize=256)
def _epsilon_spent(noise_multiplier, delta, sampling_prob, steps, accountant, grid, pca=None, per_unit=1):
    if steps == 0 and pca is None:
        return 0.0
    if (steps and noise_multiplier == 0) or pca == 0:
        return math.inf
    event = _dpsgd_event(noise_multiplier, sampling_prob, steps, pca, per_unit)
    kept = mixture.self_composed_epsilon(event, delta, grid) if accountant == "pld" else None
    if kept is not None:
        return kept
    acc = make_accountant(accountant, grid)()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def epsilon_spent(*, noise_multiplier, delta, sampling_prob, steps, accountant="pld", pca=None, per_unit=1):
    grid = _grids(DEFAULT_PLD_DISCRETIZATION, per_unit)[1]
    pca = None if pca is None else float(pca)
    return _epsilon_spent(
        float(noise_multiplier), float(delta), float(sampling_prob), steps, accountant, grid, pca, per_unit
    )


def _search_sigma(epsilon, delta, q, steps, accountant, grid, lower=0.0, pca=None, per_unit=1) -> float:
    import dp_accounting

    if not lower:
        bounds.check_in_range(
            epsilon,
            delta,
            steps,
            lambda s: _epsilon_spent(s, delta, q, steps, accountant, grid, pca, per_unit),
        )
    sigma = dp_accounting.calibrate_dp_mechanism(
        bounds.with_deadline(make_accountant(accountant, grid)),
        lambda s: _dpsgd_event(s, q, steps, pca, per_unit),
        float(epsilon),
        float(delta),
        bracket_interval=dp_accounting.LowerEndpointAndGuess(lower, 1.05 * lower if lower else 1.0),
    )
    return float(sigma)


def calibrate_noise_multiplier(
    *, epsilon, delta, sampling_prob, steps, accountant="pld", pca=None, per_unit=1
):
    search = functools.partial(
        _search_sigma, epsilon, delta, sampling_prob, steps, accountant, pca=pca, per_unit=per_unit
    )
    coarse, fine = _grids(DEFAULT_PLD_DISCRETIZATION, per_unit)
    if accountant == "pld" and fine < coarse:
        sigma = search(coarse)
        if _epsilon_spent(sigma, delta, sampling_prob, steps, accountant, fine, pca, per_unit) <= epsilon:
            return sigma
        return search(fine, sigma)
    return search(fine)


def resolve_noise_multiplier(cfg, num_examples, steps, pca=None, per_unit=1) -> tuple[float, float]:
    """``(noise_multiplier, epsilon)`` of an enabled ``[dp]`` section over ``num_examples`` units."""
    validate(cfg, num_examples, per_unit)
    q = cfg.expected_batch_size / (num_examples * per_unit)
    common = {"delta": cfg.delta, "sampling_prob": q, "steps": steps, "per_unit": per_unit}
    common.update(accountant=cfg.accountant, pca=pca)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise_multiplier(epsilon=cfg.epsilon, **common)
    return float(sigma), epsilon_spent(noise_multiplier=sigma, **common)


def guaranteed_privacy(
    sampler, *, noise_multiplier, delta, steps, accountant="pld", pca=None, per_unit=1
) -> dict:
    """The ``(epsilon, delta)`` a run with ``sampler`` guarantees, truncation and parts included."""
    common = {
        "delta": delta,
        "sampling_prob": sampler.sampling_prob,
        "accountant": accountant,
        "per_unit": per_unit,
    }
    eps = epsilon_spent(noise_multiplier=noise_multiplier, steps=steps, pca=pca, **common)
    parts = {}
    if pca is not None:
        parts = {
            "epsilon_pca": epsilon_spent(noise_multiplier=0.0, steps=0, pca=pca, **common),
            "epsilon_sgd": epsilon_spent(noise_multiplier=noise_multiplier, steps=steps, **common),
        }
    extra = truncation_delta(
        num_examples=sampler.num_examples,
        sampling_prob=sampler.sampling_prob,
        padded_batch_size=sampler.padded_batch_size,
        steps=steps,
        epsilon=eps,
        records_per_unit=per_unit,
    )
    return {
        "epsilon": eps,
        "delta": delta + extra,
        "delta_accountant": delta,
        "delta_truncation": extra,
        **parts,
    }
