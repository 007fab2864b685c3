"""The accountant of a mechanism: it composes the mechanism's own ``dp_event``.

:func:`epsilon` is dp_accounting's PLD or RDP accountant over ``mechanism.dp_event(steps)``;
:func:`calibrate` finds the smallest noise multiplier whose event meets a budget. Both do what
:mod:`zoo.dp.accounting` does for its numbers (the same PLD grids, search and range checks), so a
mechanism's epsilon is the one zoo reported before mechanisms were objects.
"""

from __future__ import annotations

import functools
import math

from zoo.dp import bounds, mixture
from zoo.dp.accounting import DEFAULT_PLD_DISCRETIZATION, SEARCH_PLD_DISCRETIZATION, _make_accountant

__all__ = ["calibrate", "epsilon", "event_epsilon", "part_epsilons"]


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
    ``grid`` (default: the event's reported grid). No event: 0; noise 0 anywhere: infinite."""
    from dp_accounting import dp_event

    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if _noiseless(event):
        return math.inf
    grid = grids(event)[1] if grid is None else grid
    kept = mixture.self_composed_epsilon(event, delta, grid) if accountant == "pld" else None
    if kept is not None:  # a mixture's steps, with the step's PLD built once
        return kept
    acc = _make_accountant(accountant, grid)()
    acc.compose(event)
    return float(acc.get_epsilon(delta))


# A run asks at every eval, on resume and for its summary: mechanisms are frozen, so hashable.
@functools.lru_cache(maxsize=256)
def epsilon(mechanism, steps: int, delta: float, accountant: str = "pld") -> float:
    """Epsilon at ``delta`` after ``steps`` steps of ``mechanism``: its ``dp_event(steps)``
    composed by the accountant."""
    return event_epsilon(mechanism.dp_event(steps), delta, accountant)


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
def calibrate(mechanism, epsilon: float, delta: float, steps: int, accountant: str = "pld") -> float:
    """The smallest noise multiplier (to ~1e-6) whose ``steps`` steps of ``mechanism`` spend at
    most ``epsilon`` at ``delta``: searched on the event's coarse PLD grid (an upper bound on
    the fine one's epsilon), checked on the fine grid, and searched there again if it fails."""
    coarse, fine = grids(mechanism.with_noise(1.0).dp_event(steps))
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
        bounds.with_deadline(_make_accountant(accountant, grid)),
        event,
        float(epsilon),
        float(delta),
        bracket_interval=dp_accounting.LowerEndpointAndGuess(lower, 1.05 * lower if lower else 1.0),
    )
    return float(sigma)
