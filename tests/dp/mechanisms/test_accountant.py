"""zoo.dp.mechanisms.accountant: every mechanism's epsilon, the accountant over its own
dp_event, is the one the oracle computes from the numbers (tests/dp/oracle.py: the code before
mechanisms were objects), and so is the noise multiplier calibrated to a budget."""

from __future__ import annotations

import dataclasses

import pytest

from tests.dp.mechanisms.sections import SECTIONS, STEPS, plan, units
from tests.dp.oracle import guaranteed_privacy, pca_noise_multiplier, resolve_noise_multiplier


def todays(dp, steps: int = STEPS, canaries: int = 0) -> tuple[float, float]:
    """``(noise multiplier, epsilon)`` as the oracle computes them from the numbers."""
    per_unit = dp.records_per_user if dp.sampler == "els" else 1
    return resolve_noise_multiplier(dp, units(dp) + canaries // 2, steps, pca_noise_multiplier(dp), per_unit)


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_mechanisms_epsilon_is_todays(name):
    """The planted bugs this catches: a step event over q = E / N without the canaries counted,
    ELS's mixture over k - 1 draws, or a DP-PCA event that drops the projection's release."""
    dp = SECTIONS[name]
    made = plan(dp, canaries=0 if name == "els" else 8)
    sigma, epsilon = todays(dp, canaries=0 if name == "els" else 8)
    assert made.mechanism.name == name
    assert (made.noise_multiplier, made.epsilon) == (sigma, epsilon)
    later = todays(dp, steps=2 * STEPS, canaries=0 if name == "els" else 8)[1]
    assert made.epsilon_at(2 * STEPS) == later
    per_unit = dp.records_per_user if name == "els" else 1
    expected = guaranteed_privacy(
        made.sampler.units,
        noise_multiplier=sigma,
        delta=dp.delta,
        steps=STEPS,
        accountant=dp.accountant,
        pca=pca_noise_multiplier(dp),
        per_unit=per_unit,
    )
    assert made.privacy_at(STEPS) == expected


@pytest.mark.parametrize("name", ["dpsgd", "uls", "dp-pca"])
def test_a_calibrated_mechanisms_noise_is_todays(name):
    """The noise multiplier searched over the mechanism's event is the one searched over the
    numbers. (ELS's calibration is test_plan's, against jax_privacy.)"""
    dp = dataclasses.replace(SECTIONS[name], noise_multiplier=None, epsilon=3.0)
    made = plan(dp)
    assert (made.noise_multiplier, made.epsilon) == todays(dp)
    assert made.epsilon <= 3.0


def test_the_rdp_accountant_composes_the_same_event():
    dp = dataclasses.replace(SECTIONS["dp-pca"], accountant="rdp", noise_multiplier=None, epsilon=3.0)
    assert (plan(dp).noise_multiplier, plan(dp).epsilon) == todays(dp)


def test_els_with_one_record_a_user_is_the_plain_poisson_gaussian():
    """k = 1: each user is one record, drawn with probability q: the step's event is the
    Poisson-sampled Gaussian (on its finer grid), and the epsilon is today's for that."""
    dp = dataclasses.replace(SECTIONS["els"], records_per_user=1)
    made = plan(dp)
    assert type(made.mechanism.step_event()).__name__ == "PoissonSampledDpEvent"
    assert (made.noise_multiplier, made.epsilon) == todays(dp)


def test_the_epsilon_of_the_calibrated_noise_is_not_composed_again(monkeypatch):
    """A DP run reports the epsilon of the noise :func:`calibrate` found: the event calibrate
    checked on the fine grid, kept, not composed a second time (about half a second of every
    digits-mlp-dp run's start). The planted bug this catches: ``event_epsilon`` not kept."""
    from zoo.dp.mechanisms import accountant

    dp = dataclasses.replace(SECTIONS["dpsgd"], noise_multiplier=None, epsilon=2.5)
    made = plan(dp)
    composed = []
    real = accountant.make_accountant
    monkeypatch.setattr(accountant, "make_accountant", lambda *a: composed.append(a) or real(*a))
    event = made.mechanism.dp_event(STEPS)
    assert accountant.event_epsilon(event, dp.delta, dp.accountant) == made.epsilon <= 2.5
    assert composed == []
