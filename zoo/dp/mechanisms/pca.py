"""DP-PCA composed with DP-SGD (:mod:`zoo.dp.pca_fit`): one Gaussian release of the features'
second moment before the first step, with noise multiplier ``pca_noise_multiplier``, then the
``inner`` mechanism's steps. Its event is the two composed; the noise multiplier it calibrates
is the inner mechanism's, for what the two spend together."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zoo.dp.mechanisms.base import Made, Mechanism, Performance

__all__ = ["DPPCA"]


@dataclass(frozen=True)
class DPPCA:
    """``inner`` (any mechanism) after a DP-PCA release of noise multiplier ``pca_noise_multiplier``."""

    inner: Mechanism
    pca_noise_multiplier: float
    name = "dp-pca"

    def __getattr__(self, attr):  # the DP-SGD settings are the inner mechanism's
        if attr.startswith("__"):
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def with_noise(self, noise_multiplier: float) -> DPPCA:
        return dataclasses.replace(self, inner=self.inner.with_noise(noise_multiplier))

    def with_canaries(self, canaries: int, rows: bool = False) -> DPPCA:
        return dataclasses.replace(self, inner=self.inner.with_canaries(canaries, rows))

    def pca_event(self):
        import dp_accounting

        return dp_accounting.GaussianDpEvent(self.pca_noise_multiplier)

    def dp_event(self, steps: int):
        import dp_accounting

        if steps == 0:
            return self.pca_event()
        return dp_accounting.ComposedDpEvent([self.pca_event(), self.inner.dp_event(steps)])

    def parts(self, steps: int) -> dict:
        """The events of each part alone: ``{"pca": ..., "sgd": ...}``."""
        return {"pca": self.pca_event(), "sgd": self.inner.dp_event(steps)}

    def make(
        self, performance: Performance, *, data=None, seed: int = 0, truncation_prob: float = 0.0
    ) -> Made:
        made = self.inner.make(performance, data=data, seed=seed, truncation_prob=truncation_prob)
        return dataclasses.replace(made, dp_event=self.dp_event)
