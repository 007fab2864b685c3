"""The accountant: it composes a mechanism's own ``dp_event``. zoo's one.

:func:`epsilon` is dp_accounting's PLD or RDP accountant over ``mechanism.dp_event(steps)``;
:func:`calibrate` finds the smallest noise multiplier whose event meets a budget, and
:func:`calibrate_gaussian` the DP-PCA release's (one Gaussian of sensitivity 1, its share
``dp.pca_epsilon``: the one place the PCA noise is calibrated). The numbers-based functions of
:mod:`zoo.dp.accounting` build a mechanism and call these; the code that computed from the
numbers before mechanisms were objects is the tests' oracle (``tests/dp/oracle.py``), and a
mechanism's epsilon is the one it computes.
"""

from __future__ import annotations

import functools
import math

from zoo.checks import is_number
from zoo.dp import bounds, mixture
from zoo.dp.validate import ACCOUNTANTS
from zoo.errors import ZooError, choice_error

__all__ = [
    "DEFAULT_PLD_DISCRETIZATION",
    "SEARCH_PLD_DISCRETIZATION",
    "calibrate",
    "calibrate_gaussian",
    "epsilon",
    "event_epsilon",
    "make_accountant",
    "part_epsilons",
]

DEFAULT_PLD_DISCRETIZATION = 1e-4  # dp_accounting's own default
# The calibration searches with a coarser grid. A pessimistic PLD on any grid is an upper
# bound on epsilon, so the sigma it finds meets the budget, only slightly above the sigma the
# default grid finds, and it finds it sooner (the comparison is in benchmarks/dp/RESULTS.md, "Accounting times").
SEARCH_PLD_DISCRETIZATION = 1e-3


def make_accountant(accountant: str, pld_discretization: float):
    """A factory of dp_accounting's ``accountant`` (``"pld"`` on the grid ``pld_discretization``,
    or ``"rdp"``)."""
    if accountant == "pld":
        from dp_accounting.pld import PLDAccountant

        return functools.partial(PLDAccountant, value_discretization_interval=pld_discretization)
    if accountant == "rdp":
        from dp_accounting.rdp import RdpAccountant

        bounds.quiet_rdp()
        return RdpAccountant
    raise choice_error("accountant", accountant, ACCOUNTANTS)


def _leaves(event):
    """The events ``event`` is composed of, down to the noise of each."""
    from dp_accounting import dp_event

    if isinstance(event, dp_event.ComposedDpEvent):
        for part in event.events:
            yield from _leaves(part)
    elif isinstance(event, dp_event.SelfComposedDpEvent | dp_event.PoissonSampledDpEvent):
        yield from _leaves(event.event)
    else:
        yield event


def _mixture(event) -> bool:
    from dp_accounting import dp_event

    return any(isinstance(leaf, dp_event.MixtureOfGaussiansDpEvent) for leaf in _leaves(event))


def _noiseless(event) -> bool:
    from dp_accounting import dp_event

    for leaf in _leaves(event):
        std = getattr(leaf, "noise_multiplier", None)
        if isinstance(leaf, dp_event.MixtureOfGaussiansDpEvent):
            std = leaf.standard_deviation
        if std == 0:
            return True
    return False


def grids(event, pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> tuple[float, float]:
    """The PLD grids ``(searched, reported)`` of ``event`` (coarser for a mixture of Gaussians)."""
    return mixture.grids(pld_discretization, 2 if _mixture(event) else 1, SEARCH_PLD_DISCRETIZATION)


def event_epsilon(event, delta: float, accountant: str = "pld", grid: float | None = None) -> float:
    """Epsilon at ``delta`` of ``event`` by ``accountant`` (``"pld"``, ``"rdp"``) on the PLD
    ``grid`` (default: the event's reported grid). No event: 0; noise 0 anywhere: infinite.

    Kept per event (dp_accounting's events are frozen values): a DP run's reported epsilon is
    the event :func:`calibrate` checked on the fine grid already, and one PLD composition of
    it took about half a second of the run's start (digits-mlp-dp)."""
    grid = grids(event)[1] if grid is None else grid
    try:
        hash(event)
    except TypeError:  # an event holding a list: composed each time
        return _event_epsilon(event, delta, accountant, grid)
    return _kept_event_epsilon(event, delta, accountant, grid)


def _event_epsilon(event, delta: float, accountant: str, grid: float) -> float:
    from dp_accounting import dp_event

    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if _noiseless(event):
        return math.inf
    kept = mixture.self_composed_epsilon(event, delta, grid) if accountant == "pld" else None
    if kept is not None:  # a mixture's steps, with the step's PLD built once
        return kept
    acc = make_accountant(accountant, grid)()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


_kept_event_epsilon = functools.lru_cache(maxsize=256)(_event_epsilon)


# A run asks at every eval, on resume and for its summary: mechanisms are frozen, so hashable.
@functools.lru_cache(maxsize=256)
def epsilon(
    mechanism,
    steps: int,
    delta: float,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """Epsilon at ``delta`` after ``steps`` steps of ``mechanism``: its ``dp_event(steps)``
    composed by the accountant (on its reported grid for ``pld_discretization``)."""
    event = mechanism.dp_event(steps)
    return event_epsilon(event, delta, accountant, grids(event, pld_discretization)[1])


@functools.lru_cache(maxsize=64)
def part_epsilons(mechanism, steps: int, delta: float, accountant: str = "pld") -> dict[str, float]:
    """Each part's epsilon alone, on the whole event's grid, for a mechanism composed of parts
    (DP-PCA: ``{"epsilon_pca": ..., "epsilon_sgd": ...}``); ``{}`` for one of a single part."""
    if not hasattr(mechanism, "parts"):
        return {}
    grid = grids(mechanism.dp_event(steps))[1]
    events = mechanism.parts(steps).items()
    return {f"epsilon_{name}": event_epsilon(event, delta, accountant, grid) for name, event in events}


@functools.lru_cache(maxsize=64)
def calibrate(
    mechanism,
    epsilon: float,
    delta: float,
    steps: int,
    accountant: str = "pld",
    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION,
) -> float:
    """The smallest noise multiplier (to ~1e-6) whose ``steps`` steps of ``mechanism`` spend at
    most ``epsilon`` at ``delta``: searched on the event's coarse PLD grid (an upper bound on
    the fine one's epsilon), checked on the fine grid, and searched there again if it fails."""
    coarse, fine = grids(mechanism.with_noise(1.0).dp_event(steps), pld_discretization)
    search = functools.partial(_search, mechanism, epsilon, delta, steps, accountant)
    if accountant == "pld" and fine < coarse:
        sigma = search(coarse)
        if event_epsilon(mechanism.with_noise(sigma).dp_event(steps), delta, accountant, fine) <= epsilon:
            return sigma
        return search(fine, sigma)  # too little noise on the fine grid: the answer lies above
    return search(fine)


def _search(mechanism, epsilon, delta, steps, accountant, grid, lower=0.0) -> float:
    import dp_accounting

    def event(sigma):
        return mechanism.with_noise(sigma).dp_event(steps)

    if not lower:  # zoo.dp.bounds: search only where the accountant answers in seconds
        bounds.check_in_range(
            epsilon, delta, steps, lambda s: event_epsilon(event(s), delta, accountant, grid)
        )
    sigma = dp_accounting.calibrate_dp_mechanism(
        bounds.with_deadline(make_accountant(accountant, grid)),
        event,
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
    import dp_accounting

    if not (is_number(epsilon) and epsilon > 0 and math.isfinite(epsilon)):
        raise ZooError(f"epsilon must be a finite number > 0; got epsilon={epsilon!r}.")
    if not (is_number(delta) and 0.0 < delta < 1.0):
        raise ZooError(f"delta must be in (0, 1); got delta={delta!r}.")
    make_acc = make_accountant(accountant, pld_discretization)
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
