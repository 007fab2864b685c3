"""ELS (:mod:`zoo.dp.els_sampler`): the unit is a user, whose at most ``k`` kept records are each drawn
with probability ``q = E / (N_users * k)`` and clipped alone. In one step a user is in the batch
``Binomial(k, q)`` times: the step is dp_accounting's ``MixtureOfGaussiansDpEvent`` over that
sensitivity, as jax_privacy's ``DpsgdTrainingUserLevelAccountant`` builds it (PLD only)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zoo.dp.mechanisms.base import Mechanism

__all__ = ["ELS"]


@dataclass(frozen=True)
class ELS(Mechanism):
    """ELS over ``units`` users of at most ``k`` records each; ``data``: the users'
    ``(offsets, rows)``."""

    k: int = 1
    name: ClassVar[str] = "els"
    unit: ClassVar[str] = "user"

    @property
    def records_per_unit(self) -> int:  # type: ignore[override]
        return self.k

    def step_event(self):
        import dp_accounting
        from scipy import stats

        if self.k == 1:  # one record a user: the plain Poisson-sampled Gaussian (its finer grid)
            noise = dp_accounting.GaussianDpEvent(self.noise_multiplier)
            return dp_accounting.PoissonSampledDpEvent(self.sampling_prob, noise)
        draws = list(range(self.k + 1))
        chances = [float(stats.binom.pmf(x, self.k, self.sampling_prob)) for x in draws]
        return dp_accounting.dp_event.MixtureOfGaussiansDpEvent(self.noise_multiplier, draws, chances)

    def sampler(self, data, seed: int, truncation_prob: float, pad_multiple: int):
        return self.user_sampler(data, self.k, seed, truncation_prob, pad_multiple)
