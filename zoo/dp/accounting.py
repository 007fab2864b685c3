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
from zoo.dp.clipping import clipping_method
from zoo.dp.noise import NOISE_PRNGS
from zoo.dp.sampling import SAMPLERS
from zoo.errors import ZooError, choice_error

if TYPE_CHECKING:
    from dp_accounting import DpEvent

    from zoo.dp.sampling import PoissonSampler

__all__ = [
    "ACCOUNTANTS",
    "DPConfig",
    "check_choices",
    "validate",
    "calibrate_noise_multiplier",
    "epsilon_spent",
    "guaranteed_privacy",
    "truncation_budget",
    "truncation_delta",
    "max_steps_within_budget",
    "resolve_noise_multiplier",
]

ACCOUNTANTS = ("pld", "rdp")
DEFAULT_PLD_DISCRETIZATION = 1e-4  # dp_accounting's own default
# The calibration searches with a coarser grid. A pessimistic PLD on any grid is an upper
# bound on epsilon, so the sigma it finds meets the budget, only slightly above the sigma the
# default grid finds, and it finds it sooner (the comparison is in docs/dp.md).
SEARCH_PLD_DISCRETIZATION = 1e-3


def check_choices(cfg: DPConfig) -> None:
    """The named choices of an enabled config: sampler and clipping (rows of their tables,
    :data:`zoo.dp.sampling.SAMPLERS`, :data:`zoo.dp.clipping.CLIPPING`), accountant and noise
    PRNG. Recipes are checked with it when they are read."""
    if not cfg.enabled:
        return
    if cfg.sampler not in SAMPLERS:
        raise ZooError(
            f"DP-SGD requires a sampler the accountant models ({', '.join(SAMPLERS)}: "
            f"Poisson subsampling); got sampler={cfg.sampler!r}."
        )
    if cfg.accountant not in ACCOUNTANTS:
        raise choice_error("accountant", cfg.accountant, ACCOUNTANTS)
    clipping_method(cfg.clipping)
    if cfg.noise_prng not in NOISE_PRNGS:
        raise choice_error("noise_prng", cfg.noise_prng, NOISE_PRNGS)


def validate(cfg: DPConfig, num_examples: int) -> None:
    """Raise :class:`zoo.errors.ZooError` (a ``ValueError``) saying what is wrong.

    A disabled config (``enabled=False``) is not checked: its DP fields are unused.
    """
    if not cfg.enabled:
        return
    if not is_int(num_examples) or num_examples < 1:
        raise ZooError(f"DP needs a positive number of training examples; got num_examples={num_examples!r}.")
    n = int(num_examples)
    check_choices(cfg)
    if cfg.noise_seed is not None and not (is_int(cfg.noise_seed) and 0 <= cfg.noise_seed < 2**32):
        raise ZooError(
            f"noise_seed must be an int in [0, 2**32) (JAX keys hold 32 bits of a seed), or unset "
            f"for 64 secret bits from the OS; got noise_seed={cfg.noise_seed!r}."
        )
    if (cfg.epsilon is None) == (cfg.noise_multiplier is None):
        raise ZooError(
            "set exactly one of epsilon (target budget; the noise multiplier is "
            "calibrated) and noise_multiplier (epsilon is then reported); got "
            f"epsilon={cfg.epsilon!r}, noise_multiplier={cfg.noise_multiplier!r}"
            " (--set dp.epsilon=none unsets a recipe's epsilon)."
        )
    if cfg.epsilon is not None and not (
        is_number(cfg.epsilon) and cfg.epsilon > 0 and math.isfinite(cfg.epsilon)
    ):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={cfg.epsilon!r}.")
    if cfg.noise_multiplier is not None and not (
        is_number(cfg.noise_multiplier) and cfg.noise_multiplier > 0 and math.isfinite(cfg.noise_multiplier)
    ):
        raise ZooError(
            f"noise_multiplier must be a finite number > 0 (0 gives no privacy); "
            f"got noise_multiplier={cfg.noise_multiplier!r}."
        )
    if not (is_number(cfg.delta) and cfg.delta > 0):
        raise ZooError(f"delta must be > 0; got delta={cfg.delta!r}.")
    if cfg.delta >= 1.0 / n:
        raise ZooError(
            f"delta={cfg.delta!r} must be < 1/num_examples = 1/{n} = {1.0 / n:.3g}; "
            "a larger delta allows releasing whole examples."
        )
    if not (is_number(cfg.clip_norm) and cfg.clip_norm > 0 and math.isfinite(cfg.clip_norm)):
        raise ZooError(f"clip_norm must be a finite number > 0; got clip_norm={cfg.clip_norm!r}.")
    if not (is_number(cfg.expected_batch_size) and cfg.expected_batch_size > 0):
        raise ZooError(
            f"expected_batch_size must be > 0; got expected_batch_size={cfg.expected_batch_size!r}."
        )
    q = cfg.expected_batch_size / n
    if not (0.0 < q <= 1.0):
        raise ZooError(
            f"sampling rate q = expected_batch_size / num_examples = "
            f"{cfg.expected_batch_size}/{n} = {q:.6g} is outside (0, 1]; lower "
            "expected_batch_size or use more data."
        )
    mb = cfg.microbatch_size
    if mb is not None and (not is_int(mb) or mb < 1):
        raise ZooError(f"microbatch_size must be a positive int or None; got microbatch_size={mb!r}.")


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


def _dpsgd_event(noise_multiplier: float, sampling_prob: float, steps: int) -> DpEvent:
    dp_accounting = _dp_accounting()
    step = dp_accounting.PoissonSampledDpEvent(sampling_prob, dp_accounting.GaussianDpEvent(noise_multiplier))
    return dp_accounting.SelfComposedDpEvent(step, steps)


def epsilon_spent(
    *,
    noise_multiplier: float,
    delta: float,
    sampling_prob: float,
    steps: int,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """Epsilon at ``delta`` after ``steps`` Poisson-subsampled Gaussian steps."""
    _check_common(delta, sampling_prob)
    steps = _check_steps(steps)
    if not (is_number(noise_multiplier) and noise_multiplier >= 0):
        raise ZooError(f"noise_multiplier must be >= 0; got noise_multiplier={noise_multiplier!r}.")
    return _epsilon_spent(
        float(noise_multiplier), float(delta), float(sampling_prob), steps, accountant, pld_discretization
    )


# Both are pure functions of a few numbers and take seconds (a PLD composition; a search over
# them): a run asks the same question at every eval, on resume and for its summary.
@functools.lru_cache(maxsize=256)
def _epsilon_spent(noise_multiplier, delta, sampling_prob, steps, accountant, pld_discretization) -> float:
    if steps == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    acc = _make_accountant(accountant, pld_discretization)()
    acc.compose(_dpsgd_event(noise_multiplier, sampling_prob, steps))
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
) -> float:
    """A noise multiplier whose epsilon after ``steps`` is <= ``epsilon``: the smallest one
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
    if accountant == "pld" and pld_discretization < SEARCH_PLD_DISCRETIZATION:
        sigma = _search_sigma(epsilon, delta, sampling_prob, steps, accountant, SEARCH_PLD_DISCRETIZATION)
        spent = epsilon_spent(
            noise_multiplier=sigma,
            delta=delta,
            sampling_prob=sampling_prob,
            steps=steps,
            accountant=accountant,
            pld_discretization=pld_discretization,
        )
        if spent <= epsilon:
            return sigma
        # Too little noise on the fine grid: the answer there lies above the coarse sigma.
        return _search_sigma(epsilon, delta, sampling_prob, steps, accountant, pld_discretization, sigma)
    return _search_sigma(epsilon, delta, sampling_prob, steps, accountant, pld_discretization)


def _search_sigma(epsilon, delta, sampling_prob, steps, accountant, pld_discretization, lower=0.0) -> float:
    make_acc = _make_accountant(accountant, pld_discretization)
    q = float(sampling_prob)
    dp_accounting = _dp_accounting()
    if not lower:  # zoo.dp.bounds: search only where the accountant answers in seconds
        spent = lambda s: _epsilon_spent(s, delta, q, steps, accountant, pld_discretization)  # noqa: E731
        bounds.check_in_range(epsilon, delta, steps, spent)
    sigma = dp_accounting.calibrate_dp_mechanism(
        bounds.with_deadline(make_acc),
        lambda s: _dpsgd_event(s, q, steps),
        float(epsilon),
        float(delta),
        bracket_interval=dp_accounting.LowerEndpointAndGuess(lower, 1.05 * lower if lower else 1.0),
    )
    return float(sigma)


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


def resolve_noise_multiplier(cfg: DPConfig, num_examples: int, steps: int) -> tuple[float, float]:
    """``(noise_multiplier, epsilon)`` for a validated, enabled config run for ``steps`` steps.

    With ``cfg.epsilon`` set the noise multiplier is calibrated to it (and the
    returned epsilon is what that multiplier actually spends, <= target); with
    ``cfg.noise_multiplier`` set, the epsilon it spends is computed.
    """
    if not cfg.enabled:
        raise ZooError("resolve_noise_multiplier needs a config with enabled=True.")
    validate(cfg, num_examples)
    q = cfg.expected_batch_size / num_examples
    sigma = cfg.noise_multiplier
    if sigma is None:
        sigma = calibrate_noise_multiplier(
            epsilon=cfg.epsilon, delta=cfg.delta, sampling_prob=q, steps=steps, accountant=cfg.accountant
        )
    eps = epsilon_spent(
        noise_multiplier=sigma, delta=cfg.delta, sampling_prob=q, steps=steps, accountant=cfg.accountant
    )
    return float(sigma), eps


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
    sampler: PoissonSampler, *, noise_multiplier: float, delta: float, steps: int, accountant: str = "pld"
) -> dict[str, float]:
    """The ``(epsilon, delta)`` a DP-SGD run with this fixed-shape ``sampler`` guarantees after
    ``steps`` steps.

    ``epsilon`` is accounted at the accountant's ``delta`` (:func:`epsilon_spent`);
    ``delta_truncation`` is what truncating the Poisson draws to the sampler's padded size adds
    (:func:`truncation_delta`), and ``delta`` is the sum of the two: the run is
    ``(epsilon, delta)``-DP. Keys: ``epsilon``, ``delta``, ``delta_accountant``,
    ``delta_truncation``.
    """
    eps = epsilon_spent(
        noise_multiplier=noise_multiplier,
        delta=delta,
        sampling_prob=sampler.sampling_prob,
        steps=steps,
        accountant=accountant,
    )
    extra = truncation_delta(
        num_examples=sampler.num_examples,
        sampling_prob=sampler.sampling_prob,
        padded_batch_size=sampler.padded_batch_size,
        steps=steps,
        epsilon=eps,
    )
    return {"epsilon": eps, "delta": delta + extra, "delta_accountant": delta, "delta_truncation": extra}
