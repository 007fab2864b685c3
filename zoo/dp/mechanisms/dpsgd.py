"""DP-SGD with a record or a user as the unit: each step draws every unit with probability ``q``
(Poisson), clips its gradient to ``clip_norm`` and adds Gaussian noise to the sum. A step is
dp_accounting's ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))`` over the units.

:class:`DPSGD` draws records (a row of :data:`zoo.dp.sampling.SAMPLERS` that draws records);
:class:`UserDPSGD` draws users (ULS, :mod:`zoo.dp.users`), each one clipped unit of at most
``records_per_user`` record slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from zoo.dp.mechanisms.base import Mechanism
from zoo.dp.sampling import make_sampler

__all__ = ["DPSGD", "UserDPSGD"]


@dataclass(frozen=True)
class DPSGD(Mechanism):
    """DP-SGD over records: ``data`` is the number of records."""

    name: ClassVar[str] = "dpsgd"

    def step_event(self):
        import dp_accounting

        noise = dp_accounting.GaussianDpEvent(self.noise_multiplier)
        return dp_accounting.PoissonSampledDpEvent(self.sampling_prob, noise)

    def sampler(self, data, seed: int, truncation_prob: float, pad_multiple: int):
        return make_sampler(
            self.sampler_name,
            data,
            self.expected_batch_size,
            seed,
            truncation_prob,
            pad_to_multiple=pad_multiple,
            population=self.units,
            extra_rows=self.extra_rows,
        )


@dataclass(frozen=True)
class UserDPSGD(DPSGD):
    """DP-SGD over users (ULS): ``data`` is the users' ``(offsets, rows)``; a user is drawn and
    clipped as one unit of ``slots`` record slots."""

    slots: int = 1
    name: ClassVar[str] = "uls"
    unit: ClassVar[str] = "user"

    @property
    def records_per_user(self) -> int:
        return self.slots

    def sampler(self, data, seed: int, truncation_prob: float, pad_multiple: int):
        return self.user_sampler(data, self.slots, seed, truncation_prob, pad_multiple)
