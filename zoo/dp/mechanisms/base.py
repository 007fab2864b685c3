"""What every DP mechanism is made of (:mod:`zoo.dp.mechanisms`).

A mechanism is one frozen config: its privacy settings (noise multiplier, clip norm, expected
batch, the units it counts, how it samples them). :meth:`Mechanism.make` turns it, with a
:class:`Performance` (how the step is computed, never what it releases), into a :class:`Made`:
the sampler, the clipped aggregation, the stateful noise transform and the ``dp_event`` that the
accountant composes (jax_privacy 2.0's ``DPExecutionPlan``, written for zoo's pieces).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from zoo.checks import require_int
from zoo.configs import DPConfig
from zoo.dp.clipping import ClipRequest, accumulated_clip, clipping_method
from zoo.dp.groups import ALL_LAYER, ClipStyle
from zoo.dp.noise import privatize
from zoo.dp.sampling import SAMPLERS

__all__ = [
    "Canaries",
    "Made",
    "Mechanism",
    "NoiseState",
    "GaussianNoise",
    "Performance",
    "clipped_aggregation",
]

_DEFAULTS = DPConfig()


@dataclass(frozen=True)
class Performance:
    """How a DP step is computed: the clipping method (a row of
    :data:`zoo.dp.clipping.CLIPPING`), the clipping microbatch, the JAX PRNG that draws the noise
    (:data:`zoo.dp.noise.NOISE_PRNGS`) and the batch ways the padded batch splits over. None of
    them reaches a mechanism's ``dp_event``: they cannot change epsilon. (The compute precision is
    the run's :class:`zoo.precision.Precision`, handed to the clipping methods; no plan sees it.)"""

    clipping: str = _DEFAULTS.clipping
    microbatch_size: int | None = None
    noise_prng: str = _DEFAULTS.noise_prng
    batch_ways: int = 1

    @classmethod
    def of(cls, dp: DPConfig, microbatch_size: int | None = None, batch_ways: int = 1) -> Performance:
        """The performance choices of a ``[dp]`` section, taking its batch ``microbatch_size``
        examples at a time (``train.microbatch_size``, the one knob), on ``batch_ways`` batch
        shards."""
        return cls(dp.clipping, microbatch_size, dp.noise_prng, batch_ways)

    @property
    def pad_multiple(self) -> int:
        """The padded batch is a multiple of this: it splits into microbatches and shards."""
        import math

        return math.lcm(self.microbatch_size or 1, self.batch_ways)


class NoiseState(NamedTuple):
    """The noise transform's state: its key (raw key data) and the steps drawn so far."""

    key: jax.Array
    count: jax.Array


@dataclass(frozen=True)
class GaussianNoise:
    """The Gaussian mechanism as a stateful transform (optax's ``init``/``update`` shape):
    ``update(clipped_sum, state)`` returns the noisy mean of the sum, divided by the public
    ``expected_batch_size``, and the state of the next step. Step ``t`` draws with
    ``fold_in(key, t)`` (the key :meth:`zoo.train.state.TrainState.step_key` gives), so a
    resumed run that restores the state draws the noise it would have drawn."""

    noise_multiplier: float
    clip_norm: float
    expected_batch_size: float
    prng: str = _DEFAULTS.noise_prng
    partitioned: bool = False

    def init(self, key: jax.Array) -> NoiseState:
        """The state before the first step; ``key``: a typed key or raw key data."""
        if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
            key = jax.random.key_data(key)
        return NoiseState(key, jnp.zeros((), jnp.int32))

    def update(self, clipped_sum: Any, state: NoiseState) -> tuple[Any, NoiseState]:
        step_key = jax.random.fold_in(jax.random.wrap_key_data(state.key), state.count)
        return self.apply(clipped_sum, step_key), NoiseState(state.key, state.count + 1)

    def apply(self, clipped_sum: Any, step_key: jax.Array) -> Any:
        """The noisy mean of ``clipped_sum`` drawn with this step's key (:func:`zoo.dp.noise.privatize`)."""
        return privatize(
            clipped_sum,
            step_key,
            noise_multiplier=self.noise_multiplier,
            l2_clip_norm=self.clip_norm,
            expected_batch_size=self.expected_batch_size,
            prng=self.prng,
            partitioned=self.partitioned,
        )


def clipped_aggregation(clip_norm: float, performance: Performance, style: ClipStyle = ALL_LAYER) -> Callable:
    """``aggregate(clip_model, trainable, frozen, batch) -> (clipped sum, pre-clip norms,
    per-example losses)``: the clipped sum over ``batch`` (its ``mask`` says which rows count)
    by the performance's clipping method, in the clipping ``style`` (:mod:`zoo.dp.groups`),
    accumulated over its microbatches under one scan. The method is looked up in the table when
    the step is traced: one unregistered since is refused then, in one line."""

    def aggregate(clip_model, trainable, frozen, batch):
        clip = clipping_method(performance.clipping).clip
        request = ClipRequest(clip_norm, performance.microbatch_size, batch["mask"], style)
        return accumulated_clip(clip, clip_model, trainable, frozen, batch, request)

    return aggregate


@dataclass(frozen=True)
class Made:
    """A mechanism made: what a run samples, aggregates, noises and accounts with."""

    sampler: Any  # batch_indices(step) -> (indices, mask, realised); sampling_prob; units (or None)
    # clipped_aggregation's: a closure, made from the mechanism's clip norm and the performance
    # settings, so neither its repr nor its identity says anything the plan does not
    aggregate: Callable = dataclasses.field(repr=False, compare=False)
    noise: GaussianNoise
    # steps -> dp_accounting.DpEvent: the mechanism's own (a bound method, equal by identity, so
    # the plan compares the mechanism instead)
    dp_event: Callable[[int], Any] = dataclasses.field(compare=False)


@dataclass(frozen=True)
class Mechanism:
    """A DP mechanism's settings. ``units``: the privacy units the accounting counts (zoo
    audit's canaries included, :meth:`with_canaries`); ``extra_rows``: rows the padding keeps
    room for (black-box canaries). A subclass names itself and its ``unit``, and writes
    :meth:`step_event` (one step, for the accountant) and :meth:`sampler`."""

    noise_multiplier: float | None
    clip_norm: float
    expected_batch_size: float  # what a step draws on average, in records
    units: int
    sampler_name: str = _DEFAULTS.sampler
    extra_rows: int = 0
    # Which parameters share a clip factor (zoo.dp.groups). The sensitivity is clip_norm for
    # every style (the group thresholds are its shares), so the dp_event does not read it.
    clip_style: ClipStyle = ALL_LAYER

    name: ClassVar[str] = "?"
    unit: ClassVar[str] = "record"
    records_per_unit: ClassVar[int] = 1  # a unit's records each drawn on its own (ELS: k)
    pca_noise_multiplier: ClassVar[float | None] = None  # a DP-PCA release first (DPPCA's)

    @property
    def records_per_user(self) -> int | None:
        """The record slots of a user in the batch (``[users, k]``; ULS), or None: a row is
        clipped alone."""
        return None

    @property
    def sampling_prob(self) -> float:
        return self.expected_batch_size / (self.units * self.records_per_unit)

    @property
    def normaliser(self) -> float:
        """The public divisor of the noisy sum: the expected batch, in records."""
        return self.sampling_prob * self.units * self.records_per_unit

    def with_noise(self, noise_multiplier: float) -> Mechanism:
        return dataclasses.replace(self, noise_multiplier=float(noise_multiplier))

    def with_canaries(self, canaries: int, rows: bool = False) -> Mechanism:
        """The mechanism zoo audit runs: ``canaries`` extra units, each in with probability
        1/2 (the accounting counts half of them), and, as batch ``rows`` (black-box), room in
        the padding for all of them. The sampler still draws the real units only."""
        canaries = require_int("canaries", canaries, lo=0, what="an int >= 0")
        return dataclasses.replace(self, units=self.units + canaries // 2, extra_rows=canaries if rows else 0)

    def step_event(self):
        """One step's ``dp_accounting.DpEvent``."""
        raise NotImplementedError

    def dp_event(self, steps: int):
        """``steps`` steps: the step's event self-composed (no event before the first)."""
        import dp_accounting

        if steps == 0:
            return dp_accounting.NoOpDpEvent()
        return dp_accounting.SelfComposedDpEvent(self.step_event(), steps)

    def sampler(self, data, seed: int, truncation_prob: float, pad_multiple: int):
        """The sampler over ``data`` (the number of records, or the users' ``(offsets, rows)``)."""
        raise NotImplementedError

    def user_sampler(self, data, slots: int, seed: int, truncation_prob: float, pad_multiple: int):
        """The sampler that draws users (``data``: their ``(offsets, rows)``), ``slots`` record
        slots each: what a mechanism with users as its unit returns from :meth:`sampler`."""
        return SAMPLERS[self.sampler_name].users.make(
            data,
            slots,
            self.expected_batch_size,
            seed,
            truncation_prob,
            pad_to_multiple=pad_multiple,
            population=self.units,
            extra_rows=self.extra_rows,
        )

    def make(
        self, performance: Performance, *, data=None, seed: int = 0, truncation_prob: float = 0.0
    ) -> Made:
        """The mechanism's pieces for a run over ``data`` whose sampler draws with ``seed``,
        truncating a draw with probability at most ``truncation_prob`` per step; ``data=None``:
        no sampler (the caller hands the step fixed batches)."""
        sampler = (
            None if data is None else self.sampler(data, seed, truncation_prob, performance.pad_multiple)
        )
        noise = GaussianNoise(self.noise_multiplier, self.clip_norm, self.normaliser, performance.noise_prng)
        aggregate = clipped_aggregation(self.clip_norm, performance, self.clip_style)
        return Made(sampler, aggregate, noise, self.dp_event)


@dataclass(frozen=True)
class Canaries:
    """zoo audit's wrapper of a run's mechanism: ``count`` canaries, as batch ``rows``
    (black-box) or not (white-box), added by :meth:`Mechanism.with_canaries`. The run builds
    its plan from the wrapped mechanism; nothing below the mechanism hears of canaries."""

    count: int
    rows: bool = False

    def __call__(self, mechanism):
        return mechanism.with_canaries(self.count, self.rows)
