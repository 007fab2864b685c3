"""ELS's epsilon with the step's PLD kept (``zoo.dp.mixture``): dp_accounting's own
``PLDAccountant`` on the same event is the reference, and a new step count must not rebuild
the step."""

import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from scipy import stats

from zoo.dp import mixture

DELTA = 1e-5
GRID = 1e-2  # the search grid: the coarsest, so the reference PLDs build fast


def mixture_steps(sigma: float, q: float, k: int, steps: int):
    draws = list(range(k + 1))
    chances = [float(stats.binom.pmf(x, k, q)) for x in draws]
    return dp_event.SelfComposedDpEvent(dp_event.MixtureOfGaussiansDpEvent(sigma, draws, chances), steps)


def accountant_epsilon(event) -> float:
    return PLDAccountant(value_discretization_interval=GRID).compose(event).get_epsilon(DELTA)


@pytest.mark.parametrize(("sigma", "q", "k"), [(1.0, 0.04, 4), (2.0, 0.1, 2)])
def test_equals_the_pld_accountant_at_every_step_count(sigma, q, k):
    for steps in (1, 40, 300):
        event = mixture_steps(sigma, q, k, steps)
        assert mixture.self_composed_epsilon(event, DELTA, GRID) == accountant_epsilon(event)


def test_the_step_is_built_once_for_every_step_count(monkeypatch):
    built = []
    original = privacy_loss_distribution.from_mixture_gaussian_mechanism

    def counted(**kwargs):
        built.append(kwargs["standard_deviation"])
        return original(**kwargs)

    monkeypatch.setattr(privacy_loss_distribution, "from_mixture_gaussian_mechanism", counted)
    mixture.step_pld.cache_clear()
    for steps in (10, 20, 30):
        mixture.self_composed_epsilon(mixture_steps(1.5, 0.05, 3, steps), DELTA, GRID)
    mixture.self_composed_epsilon(mixture_steps(1.6, 0.05, 3, 10), DELTA, GRID)
    assert built == [1.5, 1.6]  # one build per step, none per step count


def test_other_events_are_left_to_the_accountant():
    gaussian = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    assert mixture.self_composed_epsilon(dp_event.SelfComposedDpEvent(gaussian, 10), DELTA, GRID) is None
    assert mixture.self_composed_epsilon(mixture_steps(1.0, 0.1, 2, 5).event, DELTA, GRID) is None
    assert mixture.self_composed_epsilon(mixture_steps(0.0, 0.1, 2, 5), DELTA, GRID) is None
