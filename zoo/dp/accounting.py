"""DP-SGD configuration and privacy accounting via ``dp_accounting``.

One DP-SGD step is modelled as ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
(Poisson subsampling with rate ``q``, Gaussian noise with multiplier ``sigma``
relative to the clip norm); ``steps`` steps are its self-composition.  The
neighbouring relation is add/remove-one example, matching the sensitivity ``C``
of the clipped sum in :mod:`zoo.dp.clipping`.

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
from zoo.dp import bounds
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
# default grid finds, and it finds it sooner (the comparison is in docs/dp.md).
SEARCH_PLD_DISCRETIZATION = 1e-3


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

        return RdpAccountant
    raise choice_error("accountant", accountant, ACCOUNTANTS)


def _check_common(delta: float, sampling_prob: float) -> None:
    if not (is_number(delta) and 0.0 < delta < 1.0):
        raise ZooError(f"delta must be in (0, 1); got delta={delta!r}.")
    if not (is_number(sampling_prob) and 0.0 < sampling_prob <= 1.0):
        raise ZooError(f"sampling_prob must be in (0, 1]; got sampling_prob={sampling_prob!r}.")


def _check_steps(steps: int) -> int:
    if not is_int(steps) or steps < 0:
        raise ZooError(f"steps must be a non-negative int; got steps={steps!r}.")
    return int(steps)


def _dpsgd_event(
    noise_multiplier: float, sampling_prob: float, steps: int, pca: float | None = None
) -> DpEvent:
    """``steps`` Poisson-subsampled Gaussian steps, after one Gaussian release of noise
    multiplier ``pca`` when the run fits a DP-PCA projection first (:mod:`zoo.dp.pca`)."""
    dp_accounting = _dp_accounting()
    step = dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(noise_multiplier))
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
) -> float:
    """Epsilon at ``delta`` after ``steps`` Poisson-subsampled Gaussian steps (composed with
    the DP-PCA's Gaussian release of ``pca_noise_multiplier``, when given)."""
    _check_common(delta, sampling_prob)
    steps = _check_steps(steps)
    for name, value in (
        ("noise_multiplier", noise_multiplier),
        ("pca_noise_multiplier", pca_noise_multiplier),
    ):
        if value is not None and not (is_number(value) and value >= 0):
            raise ZooError(f"{name} must be >= 0; got {name}={value!r}.")
    pca = None if pca_noise_multiplier is None else float(pca_noise_multiplier)
    return _epsilon_spent(
        float(noise_multiplier),
        float(delta),
        float(sampling_prob),
        steps,
        accountant,
        pld_discretization,
        pca,
    )


# Both are pure functions of a few numbers and take seconds (a PLD composition; a search over
# them): a run asks the same question at every eval, on resume and for its summary.
@functools.lru_cache(maxsize=256)
def _epsilon_spent(
    noise_multiplier, delta, sampling_prob, steps, accountant, pld_discretization, pca=None
) -> float:
    if steps == 0 and pca is None:
        return 0.0
    if (steps and noise_multiplier == 0) or pca == 0:
        return math.inf
    acc = _make_accountant(accountant, pld_discretization)()
    acc.compose(_dpsgd_event(noise_multiplier, sampling_prob, steps, pca))
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
) -> float:
    """A noise multiplier whose epsilon after ``steps`` (composed with a DP-PCA release of
    ``pca_noise_multiplier``, when given) is <= ``epsilon``: the smallest one
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
    pca = pca_noise_multiplier
    if accountant == "pld" and pld_discretization < SEARCH_PLD_DISCRETIZATION:
        sigma = _search_sigma(
            epsilon, delta, sampling_prob, steps, accountant, SEARCH_PLD_DISCRETIZATION, pca=pca
        )
        spent = _epsilon_spent(sigma, delta, sampling_prob, steps, accountant, pld_discretization, pca)
        if spent <= epsilon:
            return sigma
        # Too little noise on the fine grid: the answer there lies above the coarse sigma.
        return _search_sigma(
            epsilon, delta, sampling_prob, steps, accountant, pld_discretization, sigma, pca=pca
        )
    return _search_sigma(epsilon, delta, sampling_prob, steps, accountant, pld_discretization, pca=pca)


def _search_sigma(
    epsilon, delta, sampling_prob, steps, accountant, pld_discretization, lower=0.0, pca=None
) -> float:
    make_acc = _make_accountant(accountant, pld_discretization)
    q = float(sampling_prob)
    dp_accounting = _dp_accounting()
    if not lower:  # zoo.dp.bounds: search only where the accountant answers in seconds
        spent = lambda s: _epsilon_spent(s, delta, q, steps, accountant, pld_discretization, pca)  # noqa: E731
        bounds.check_in_range(epsilon, delta, steps, spent)
    sigma = dp_accounting.calibrate_dp_mechanism(
        bounds.with_deadline(make_acc),
        lambda s: _dpsgd_event(s, q, steps, pca),
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
    cfg: DPConfig, num_examples: int, steps: int, pca_noise_multiplier: float | None = None
) -> tuple[float, float]:
    """``(noise_multiplier, epsilon)`` for a validated, enabled config run for ``steps`` steps
    (after a DP-PCA release of ``pca_noise_multiplier``, when given: the epsilon is the two
    composed, and a calibrated noise multiplier is DP-SGD's share of ``cfg.epsilon``).

    With ``cfg.epsilon`` set the noise multiplier is calibrated to it (and the
    returned epsilon is what that multiplier actually spends, <= target); with
    ``cfg.noise_multiplier`` set, the epsilon it spends is computed.
    """
    if not cfg.enabled:
        raise ZooError("resolve_noise_multiplier needs a config with enabled=True.")
    validate(cfg, num_examples)
    common = {"delta": cfg.delta, "sampling_prob": cfg.expected_batch_size / num_examples, "steps": steps}
    common.update(accountant=cfg.accountant, pca_noise_multiplier=pca_noise_multiplier)
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise_multiplier(epsilon=cfg.epsilon, **common)
    return float(sigma), epsilon_spent(noise_multiplier=sigma, **common)


# Fixed-shape Poisson batches drop records when a draw exceeds the padded size. That event is
# not part of the accounted mechanism; the padding is sized so that it adds at most this share
# of delta over the run, and the delta a run reports includes what it does add.
TRUNCATION_SHARE = 1e-3


def truncation_budget(*, delta: float, epsilon: float, steps: int, share: float = TRUNCATION_SHARE) -> float:
    """Per-step truncation probability ``p`` whose cost ``(1 + e^epsilon) * steps * p`` on delta
    (:func:`truncation_delta`) is ``share * delta``."""
    if not (is_number(epsilon) and epsilon >= 0):
        raise ZooError(f"epsilon must be a number >= 0; got epsilon={epsilon!r}.")
    steps = max(_check_steps(steps), 1)
    return 0.0 if not epsilon < 700 else share * delta / (steps * (1.0 + math.exp(epsilon)))


def truncation_delta(
    *, num_examples: int, sampling_prob: float, padded_batch_size: int, steps: int, epsilon: float
) -> float:
    """What truncating Poisson draws to ``padded_batch_size`` adds to delta over ``steps`` steps.

    The truncated mechanism M' and the accounted one M differ only when a draw exceeds the
    padding: per step with probability at most ``p = P(Binomial(N + 1, q) > P)`` on either
    neighbour (the larger has N + 1 examples), so M'(D), M(D) are within ``steps * p`` in total
    variation and M' is ``(eps, delta + (1 + e^eps) * steps * p)``-DP. Returns at most 1.
    """
    steps, n = _check_steps(steps), int(num_examples)
    if steps == 0 or padded_batch_size >= n + 1:
        return 0.0
    from scipy import stats  # on first use: scipy.stats takes most of a second to import

    p = float(stats.binom.sf(int(padded_batch_size), n + 1, float(sampling_prob)))
    if p == 0.0:
        return 0.0
    return 1.0 if not epsilon < 700 else min(1.0, (1.0 + math.exp(epsilon)) * steps * p)


def guaranteed_privacy(
    sampler: PoissonSampler,
    *,
    noise_multiplier: float,
    delta: float,
    steps: int,
    accountant: str = "pld",
    pca_noise_multiplier: float | None = None,
) -> dict[str, float]:
    """The ``(epsilon, delta)`` a DP-SGD run with this fixed-shape ``sampler`` guarantees after
    ``steps`` steps (after a DP-PCA release of ``pca_noise_multiplier``, when given).

    ``epsilon`` is accounted at the accountant's ``delta`` (:func:`epsilon_spent`);
    ``delta_truncation`` is what truncating the Poisson draws to the sampler's padded size adds
    (:func:`truncation_delta`), and ``delta`` is the sum of the two: the run is
    ``(epsilon, delta)``-DP. Keys: ``epsilon``, ``delta``, ``delta_accountant``,
    ``delta_truncation``; with DP-PCA also ``epsilon_pca`` and ``epsilon_sgd``, each part
    alone at the same delta (the parts do not add up: ``epsilon`` is their composition).
    """
    common = {"delta": delta, "sampling_prob": sampler.sampling_prob, "accountant": accountant}
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
    )
    return {
        "epsilon": eps,
        "delta": delta + extra,
        "delta_accountant": delta,
        "delta_truncation": extra,
        **parts,
    }
