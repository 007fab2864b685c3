"""DP-SGD configuration and privacy accounting via ``dp_accounting``.

One DP-SGD step is modelled as ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
(Poisson subsampling with rate ``q``, Gaussian noise with multiplier ``sigma``
relative to the clip norm); ``steps`` steps are its self-composition.  The
neighbouring relation is add/remove-one example, matching the sensitivity ``C``
of the clipped sum in :mod:`zoo.dp.clipping`. A unit with ``records_per_unit = k > 1``
records, each Poisson-sampled on its own (ELS, :mod:`zoo.dp.els`), moves the sum by
``Binomial(k, q)`` clip norms: the step is dp_accounting's ``MixtureOfGaussiansDpEvent``
over that sensitivity, as jax_privacy's ``DpsgdTrainingUserLevelAccountant`` builds it.

Accountants: ``"pld"`` (privacy loss distributions, tight; the default) and
``"rdp"`` (Renyi DP, faster but looser).  The PLD discretisation is exposed as
``pld_discretization``: coarser values are faster and still give valid
(pessimistic) upper bounds on epsilon.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from zoo.checks import is_int, is_number
from zoo.configs import DPConfig
from zoo.dp import bounds, mixture
from zoo.dp.truncation import check_steps as _check_steps
from zoo.dp.truncation import truncation_budget, truncation_delta
from zoo.dp.validate import ACCOUNTANTS, check_choices, check_pca, validate
from zoo.errors import ZooError, choice_error

if TYPE_CHECKING:
    from dp_accounting import DpEvent

    from zoo.dp.sampling import PoissonSampler

__all__ = [
    "ACCOUNTANTS",
    "DPConfig",
    "check_choices",
    "check_pca",
    "validate",
    "calibrate_gaussian",
    "calibrate_noise_multiplier",
    "epsilon_spent",
    "guaranteed_privacy",
    "truncation_budget",
    "truncation_delta",
    "max_steps_within_budget",
    "resolve_noise_multiplier",
]

DEFAULT_PLD_DISCRETIZATION = 1e-4  # dp_accounting's own default
# The calibration searches with a coarser grid. A pessimistic PLD on any grid is an upper
# bound on epsilon, so the sigma it finds meets the budget, only slightly above the sigma the
# default grid finds, and it finds it sooner (the comparison is in benchmarks/dp/RESULTS.md, "Accounting times").
SEARCH_PLD_DISCRETIZATION = 1e-3


def _grids(pld_discretization: float, per_unit: int) -> tuple[float, float]:
    """The PLD grids ``(searched, reported)`` for a unit of ``per_unit`` records."""
    return mixture.grids(pld_discretization, per_unit, SEARCH_PLD_DISCRETIZATION)


def _dp_accounting():
    # Imported on first use: it takes about a second, and configs and the CLI import this module.
    import dp_accounting

    return dp_accounting


def _make_accountant(accountant: str, pld_discretization: float):
    if accountant == "pld":
        from dp_accounting.pld import PLDAccountant

        return functools.partial(PLDAccountant, value_discretization_interval=pld_discretization)
    if accountant == "rdp":
        from dp_accounting.rdp import RdpAccountant

        bounds.quiet_rdp()
        return RdpAccountant
    raise choice_error("accountant", accountant, ACCOUNTANTS)


def _check_common(delta: float, sampling_prob: float) -> None:
    if not (is_number(delta) and 0.0 < delta < 1.0):
        raise ZooError(f"delta must be in (0, 1); got delta={delta!r}.")
    if not (is_number(sampling_prob) and 0.0 < sampling_prob <= 1.0):
        raise ZooError(f"sampling_prob must be in (0, 1]; got sampling_prob={sampling_prob!r}.")


def _dpsgd_event(
    noise_multiplier: float, sampling_prob: float, steps: int, pca: float | None = None, per_unit: int = 1
) -> DpEvent:
    """``steps`` Poisson-subsampled Gaussian steps (a mixture of Gaussians for ``per_unit > 1``
    records per unit), after one Gaussian release of noise multiplier ``pca`` when the run fits
    a DP-PCA projection first (:mod:`zoo.dp.pca`)."""
    dp_accounting = _dp_accounting()
    step = dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(noise_multiplier))
    if per_unit > 1:  # the unit is drawn Binomial(per_unit, q) times in a step
        from scipy import stats

        draws = range(per_unit + 1)
        chances = [float(stats.binom.pmf(x, per_unit, sampling_prob)) for x in draws]
        step = dp_accounting.dp_event.MixtureOfGaussiansDpEvent(noise_multiplier, list(draws), chances)
    sgd = dp_accounting.SelfComposedDpEvent(step, steps)
    if pca is None:
        return sgd
    first = dp_accounting.GaussianDpEvent(pca)
    return dp_accounting.ComposedDpEvent([first, sgd]) if steps else first


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
    pca = None if pca_noise_multiplier is None else float(pca_noise_multiplier)
    per_unit = _per_unit(records_per_unit, accountant)
    args = (float(noise_multiplier), float(delta), float(sampling_prob), steps, accountant)
    return _epsilon_spent(*args, _grids(pld_discretization, per_unit)[1], pca, per_unit)


def _per_unit(records_per_unit: int, accountant: str) -> int:
    if not (is_int(records_per_unit) and records_per_unit >= 1):
        raise ZooError(f"records_per_unit must be an int >= 1; got records_per_unit={records_per_unit!r}.")
    if records_per_unit > 1 and accountant != "pld":
        raise ZooError(
            f"a unit of {records_per_unit} records is accounted by 'pld' only; got accountant={accountant!r}"
        )
    return int(records_per_unit)


# Both are pure functions of a few numbers and take seconds (a PLD composition; a search over
# them): a run asks the same question at every eval, on resume and for its summary.
@functools.lru_cache(maxsize=256)
def _epsilon_spent(
    noise_multiplier, delta, sampling_prob, steps, accountant, pld_discretization, pca=None, per_unit=1
) -> float:
    if steps == 0 and pca is None:
        return 0.0
    if (steps and noise_multiplier == 0) or pca == 0:
        return math.inf
    event = _dpsgd_event(noise_multiplier, sampling_prob, steps, pca, per_unit)
    kept = mixture.self_composed_epsilon(event, delta, pld_discretization) if accountant == "pld" else None
    if kept is not None:  # ELS: the accountant's answer, with the step's PLD built once
        return kept
    acc = _make_accountant(accountant, pld_discretization)()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
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
    """A noise multiplier whose epsilon after ``steps`` (composed with a DP-PCA release of
    ``pca_noise_multiplier``, when given; ``records_per_unit`` as :func:`epsilon_spent`) is
    <= ``epsilon``: the smallest one
    (to ~1e-6) on the PLD grid :data:`SEARCH_PLD_DISCRETIZATION`, whose pessimistic epsilon
    bounds the one on the finer ``pld_discretization`` grid from above; the result is then
    checked on the finer grid (and searched there again in the unlikely case it fails).

    Uses ``dp_accounting.calibrate_dp_mechanism``, which guarantees the returned
    value does not exceed the budget of the grid it searches on.
    """
    _check_common(delta, sampling_prob)
    steps = _check_steps(steps)
    if steps == 0:
        raise ZooError("steps must be >= 1 to calibrate a noise multiplier; got steps=0.")
    if not (is_number(epsilon) and epsilon > 0 and math.isfinite(epsilon)):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={epsilon!r}.")
    pca, per_unit = pca_noise_multiplier, _per_unit(records_per_unit, accountant)
    search = functools.partial(
        _search_sigma, epsilon, delta, sampling_prob, steps, accountant, pca=pca, per_unit=per_unit
    )
    coarse, fine = _grids(pld_discretization, per_unit)
    if accountant == "pld" and fine < coarse:
        sigma = search(coarse)
        if _epsilon_spent(sigma, delta, sampling_prob, steps, accountant, fine, pca, per_unit) <= epsilon:
            return sigma
        # Too little noise on the fine grid: the answer there lies above the coarse sigma.
        return search(fine, sigma)
    return search(fine)


def _search_sigma(
    epsilon, delta, sampling_prob, steps, accountant, pld_discretization, lower=0.0, pca=None, per_unit=1
) -> float:
    make_acc = _make_accountant(accountant, pld_discretization)
    q = float(sampling_prob)
    dp_accounting = _dp_accounting()
    if not lower:  # zoo.dp.bounds: search only where the accountant answers in seconds
        spent = lambda s: _epsilon_spent(  # noqa: E731
            s, delta, q, steps, accountant, pld_discretization, pca, per_unit=per_unit
        )
        bounds.check_in_range(epsilon, delta, steps, spent)
    sigma = dp_accounting.calibrate_dp_mechanism(
        bounds.with_deadline(make_acc),
        lambda s: _dpsgd_event(s, q, steps, pca, per_unit),
        float(epsilon),
        float(delta),
        bracket_interval=dp_accounting.LowerEndpointAndGuess(lower, 1.05 * lower if lower else 1.0),
    )
    return float(sigma)


@functools.lru_cache(maxsize=64)
def calibrate_gaussian(
    *,
    epsilon: float,
    delta: float,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """The smallest noise multiplier (to ~1e-6) whose one Gaussian release of sensitivity 1 is
    ``(epsilon, delta)``-DP: the DP-PCA's noise for its share ``dp.pca_epsilon``."""
    if not (is_number(epsilon) and epsilon > 0 and math.isfinite(epsilon)):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={epsilon!r}.")
    _check_common(delta, 1.0)
    dp_accounting = _dp_accounting()
    make_acc = _make_accountant(accountant, pld_discretization)
    spent = lambda s: make_acc().compose(dp_accounting.GaussianDpEvent(s)).get_epsilon(delta)  # noqa: E731
    _check_pca_range(epsilon, delta, spent)
    sigma = dp_accounting.calibrate_dp_mechanism(
        make_acc,
        dp_accounting.GaussianDpEvent,
        float(epsilon),
        float(delta),
        bracket_interval=dp_accounting.LowerEndpointAndGuess(bounds.SIGMA_MIN, 1.0),
    )
    return float(sigma)


def _check_pca_range(epsilon: float, delta: float, spent) -> None:
    """ZooError naming ``dp.pca_epsilon`` unless the multiplier that meets it lies in the searched
    range: the budget is DP-PCA's one Gaussian release, not DP-SGD's steps, so the fix is there."""
    release = (
        f"dp.pca_epsilon={epsilon:g} at delta={delta:g} (the DP-PCA projection: one Gaussian "
        "release, not DP-SGD's steps)"
    )
    low = spent(bounds.SIGMA_MIN)
    if low <= epsilon:
        raise ZooError(
            f"noise calibration: {release} is met already by noise multiplier {bounds.SIGMA_MIN:g}, "
            f"the smallest searched (it spends epsilon={low:.3g}); set dp.pca_epsilon below {low:.3g}"
        )
    high = spent(bounds.SIGMA_MAX)
    if not high <= epsilon:
        why = (
            f"delta={delta:g} is below what the accountant resolves; raise dp.delta"
            if math.isinf(high)
            else f"even noise multiplier {bounds.SIGMA_MAX:g}, the largest searched, spends "
            f"epsilon={high:.3g}; raise dp.pca_epsilon to at least that"
        )
        raise ZooError(f"noise calibration: {release} is too small: {why}")


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
    (num_examples * records_per_unit)``; ELS's users, :mod:`zoo.dp.els`).

    With ``cfg.epsilon`` set the noise multiplier is calibrated to it (and the
    returned epsilon is what that multiplier actually spends, <= target); with
    ``cfg.noise_multiplier`` set, the epsilon it spends is computed.
    """
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
    of ``records_per_unit`` records each drawn on its own (:func:`epsilon_spent`).

    ``epsilon`` is accounted at the accountant's ``delta`` (:func:`epsilon_spent`);
    ``delta_truncation`` is what truncating the Poisson draws to the sampler's padded size adds
    (:func:`truncation_delta`), and ``delta`` is the sum of the two: the run is
    ``(epsilon, delta)``-DP. Keys: ``epsilon``, ``delta``, ``delta_accountant``,
    ``delta_truncation``; with DP-PCA also ``epsilon_pca`` and ``epsilon_sgd``, each part
    alone at the same delta (the parts do not add up: ``epsilon`` is their composition).
    """
    common = {"delta": delta, "sampling_prob": sampler.sampling_prob, "accountant": accountant}
    common["records_per_unit"] = records_per_unit
    eps = epsilon_spent(
        noise_multiplier=noise_multiplier, steps=steps, pca_noise_multiplier=pca_noise_multiplier, **common
    )
    parts = {}
    if pca_noise_multiplier is not None:
        parts = {
            "epsilon_pca": epsilon_spent(
                noise_multiplier=0.0, steps=0, pca_noise_multiplier=pca_noise_multiplier, **common
            ),
            "epsilon_sgd": epsilon_spent(noise_multiplier=noise_multiplier, steps=steps, **common),
        }
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
        **parts,
    }
