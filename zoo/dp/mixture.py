"""The epsilon of ELS's steps (:mod:`zoo.dp.els_sampler`): ``steps`` self-compositions of one
mixture-of-Gaussians step, computed as dp_accounting's ``PLDAccountant`` computes it, with the
step's PLD built once.

dp_accounting builds a mixture's privacy loss distribution point by point: seconds on the
1e-3 grid, for every new step count, while composing it ``steps`` times takes a few
milliseconds. A run asks for its epsilon at every eval, at the end and on resume, each time at
a new step count, so the one-step PLD is kept (:func:`step_pld`) and only the composition is
redone. The result is the accountant's own: the same PLD, composed in the same order.
"""

from __future__ import annotations

import functools

# A mixture has no closed-form PLD: it is reported on the 1e-3 grid (1e-6 relative from
# 1e-4's, measured) and searched on 1e-2.
MIXTURE_PLD_DISCRETIZATION, MIXTURE_SEARCH_PLD_DISCRETIZATION = 1e-3, 1e-2


def grids(pld_discretization: float, per_unit: int, search: float) -> tuple[float, float]:
    """The PLD grids ``(searched, reported)`` for a unit of ``per_unit`` records (``search``:
    the grid a unit of one record is searched on)."""
    if per_unit == 1:
        return search, pld_discretization
    return MIXTURE_SEARCH_PLD_DISCRETIZATION, max(pld_discretization, MIXTURE_PLD_DISCRETIZATION)


@functools.lru_cache(maxsize=16)
def step_pld(standard_deviation: float, sensitivities: tuple, sampling_probs: tuple, grid: float):
    """One mixture-of-Gaussians step's PLD, as ``PLDAccountant`` builds it."""
    from dp_accounting.pld.privacy_loss_distribution import from_mixture_gaussian_mechanism

    return from_mixture_gaussian_mechanism(
        standard_deviation=standard_deviation,
        sensitivities=list(sensitivities),
        sampling_probs=list(sampling_probs),
        value_discretization_interval=grid,
    )


def self_composed_epsilon(event, delta: float, grid: float) -> float | None:
    """The PLD accountant's epsilon at ``delta`` of ``event`` when it is ``count`` steps of one
    mixture of Gaussians (``None`` for any other event: ask the accountant)."""
    from dp_accounting import dp_event
    from dp_accounting.pld.privacy_loss_distribution import identity

    if not isinstance(event, dp_event.SelfComposedDpEvent):
        return None
    step = event.event
    if not isinstance(step, dp_event.MixtureOfGaussiansDpEvent) or not step.standard_deviation:
        return None
    pld = step_pld(step.standard_deviation, tuple(step.sensitivities), tuple(step.sampling_probs), grid)
    return float(identity(grid).compose(pld.self_compose(event.count)).get_epsilon_for_delta(delta))
