"""zoo.dp.mechanisms.base: performance choices cannot change what a mechanism spends, and the
noise is a stateful transform that draws each step's noise with that step's key."""

from __future__ import annotations

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.dp.mechanisms.sections import SECTIONS, STEPS, USERS, plan, units
from tests.numerics import assert_close
from zoo.dp.mechanisms import Canaries, GaussianNoise, Performance, mechanism_for
from zoo.dp.noise import NOISE_PRNGS, privatize
from zoo.dp.plan import plan_of

PERFORMANCES = [
    Performance(clipping, microbatch, prng, ways)
    for clipping, microbatch, prng, ways in itertools.product(
        ("vmap", "ghost"), (None, 3), NOISE_PRNGS, (1, 2)
    )
]


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_no_performance_setting_changes_epsilon_or_the_event(name):
    """Every clipping method, microbatch size, noise PRNG and batch split gives the same noise
    multiplier, normaliser, epsilon and dp_event; only the padding follows them. Planted: an
    expected batch rounded up to the padding multiple (so that batches split evenly) changes q,
    and fails."""
    dp = dataclasses.replace(SECTIONS[name], noise_multiplier=None, epsilon=3.0)
    if name == "els":  # its calibration is test_plan's; the event is the same either way
        dp = SECTIONS[name]
    data = USERS if dp.unit == "user" else units(dp)
    plans = [
        plan_of(mechanism_for(dp, units(dp)), perf, dp, STEPS, data=data, seed=3) for perf in PERFORMANCES
    ]
    first = plans[0]
    for made, perf in zip(plans, PERFORMANCES, strict=True):
        assert (made.performance.clipping, made.performance.microbatch_size, made.performance.noise_prng) == (
            perf.clipping,
            perf.microbatch_size,
            perf.noise_prng,
        )
        assert made.sampler.padded_batch_size % perf.pad_multiple == 0
        assert made.mechanism == first.mechanism
        assert made.mechanism.dp_event(STEPS) == first.mechanism.dp_event(STEPS)
        assert (made.noise_multiplier, made.expected_batch_size) == (
            first.noise_multiplier,
            first.expected_batch_size,
        )
        assert made.epsilon == first.epsilon and made.privacy_at(STEPS)["epsilon"] == first.epsilon
    assert len({made.performance.pad_multiple for made in plans}) > 1  # the settings did reach the plan


def test_a_sections_performance_settings_reach_its_plan_and_not_its_epsilon():
    """Through make_plan, the [dp] section's own clipping and PRNG settings, and the microbatch
    (train.microbatch_size, the one knob)."""
    dp = SECTIONS["dpsgd"]
    base = plan(dp)
    for clipping, microbatch, prng in itertools.product(("vmap", "ghost"), (None, 5), NOISE_PRNGS):
        other = plan(dataclasses.replace(dp, clipping=clipping, noise_prng=prng), microbatch_size=microbatch)
        assert other.performance == Performance(clipping, microbatch, prng, 1)
        assert (other.epsilon, other.mechanism) == (base.epsilon, base.mechanism)


def _sum():
    return {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)}


@pytest.mark.numerics
def test_the_noise_transform_draws_step_ts_noise_with_step_ts_key():
    """update() at step t is privatize() with fold_in(key, t), the key TrainState.step_key gives;
    the next update draws new noise. Planted: an update that keeps its count draws the same noise
    every step, and fails."""
    noise = GaussianNoise(1.3, 0.7, 5.0, "philox4x32")
    key = jax.random.key_data(jax.random.key(11))
    state = noise.init(key)
    draws = []
    for step in range(3):
        noisy, state = noise.update(_sum(), state)
        step_key = jax.random.fold_in(jax.random.wrap_key_data(key), step)
        expected = privatize(
            _sum(),
            step_key,
            noise_multiplier=1.3,
            l2_clip_norm=0.7,
            expected_batch_size=5.0,
            prng="philox4x32",
        )
        jax.tree.map(np.testing.assert_array_equal, noisy, expected)  # the same draw, bit for bit
        draws.append(np.asarray(noisy["w"]))
    assert int(state.count) == 3
    assert not np.array_equal(draws[0], draws[1]) and not np.array_equal(draws[1], draws[2])


@pytest.mark.numerics
def test_the_noise_transform_runs_under_jit_and_a_plans_noise_is_its_mechanisms():
    made = plan(SECTIONS["dpsgd"])
    noise = made.made.noise
    assert (noise.noise_multiplier, noise.clip_norm, noise.expected_batch_size) == (
        made.mechanism.noise_multiplier,
        made.mechanism.clip_norm,
        made.mechanism.normaliser,
    )
    state = noise.init(jax.random.key(0))
    jitted, _ = jax.jit(noise.update)(_sum(), state)
    eager, _ = noise.update(_sum(), state)
    assert_close(jitted, eager, n=1)


def test_canaries_wrap_the_mechanism():
    """zoo audit's canaries: half of them counted as units, all of them padded for as rows.
    Planted: every canary counted (410 units) fails."""
    mechanism = mechanism_for(SECTIONS["dpsgd"], 400)
    audited = Canaries(10, rows=True)(mechanism)
    assert audited == mechanism.with_canaries(10, rows=True)
    assert (audited.units, audited.extra_rows) == (405, 10)
    assert mechanism.with_canaries(10).extra_rows == 0
    assert audited.sampling_prob == SECTIONS["dpsgd"].expected_batch_size / 405
