"""The DP plan (zoo.dp.plan.make_plan) under dp.unit = "user": the unit it samples, pads and
accounts is a user."""

from __future__ import annotations

import dataclasses

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from zoo.configs import DPConfig
from zoo.data.users import group_rows
from zoo.dp.plan import make_plan
from zoo.models.registry import get_config
from zoo.parallel import layout_for

RECORDS_OF = [1, 9, 2, 2, 14, 3, 1, 5, 7, 1] * 6  # 60 users, skewed, 270 records
USERS = np.repeat(np.arange(len(RECORDS_OF)), RECORDS_OF)
DP = DPConfig(
    enabled=True,
    noise_multiplier=1.3,
    expected_batch_size=12,
    clipping="vmap",
    unit="user",
    records_per_user=3,
    delta=1e-4,
)
STEPS = 40


def user_plan(dp: DPConfig = DP):
    layout = layout_for(get_config("mlp-s"))
    return make_plan(dp, len(USERS), STEPS, layout, seed=3, users=group_rows(USERS))


def pld_epsilon(q: float, sigma: float, steps: int, delta: float) -> float:
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    accountant = PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, steps))
    return accountant.get_epsilon(delta)


def test_user_level_epsilon_is_the_poisson_subsampled_gaussian_over_users():
    """The epsilon of a user-level plan is dp_accounting's Poisson-subsampled Gaussian at
    q = E / N_users. A q computed over records (E / 270, not E / 60) gives a smaller epsilon
    and fails both assertions."""
    plan = user_plan()
    n_users = len(RECORDS_OF)
    assert plan.sampler.sampling_prob == DP.expected_batch_size / n_users
    assert plan.sampler.num_examples == n_users and plan.records_per_user == DP.records_per_user
    expected = pld_epsilon(DP.expected_batch_size / n_users, DP.noise_multiplier, STEPS, DP.delta)
    assert plan.privacy_at(STEPS)["epsilon"] == pytest.approx(expected, rel=1e-6)
    over_records = pld_epsilon(DP.expected_batch_size / len(USERS), DP.noise_multiplier, STEPS, DP.delta)
    assert over_records < 0.5 * expected  # the planted q is far off: the comparison can fail


def test_a_calibrated_user_level_plan_spends_its_epsilon_over_users():
    dp = dataclasses.replace(DP, noise_multiplier=None, epsilon=4.0)
    plan = user_plan(dp)
    q = dp.expected_batch_size / len(RECORDS_OF)
    assert pld_epsilon(q, plan.noise_multiplier, STEPS, dp.delta) == pytest.approx(4.0, rel=1e-3)
    # the noisy sum is divided by the expected number of users, not of records
    assert plan.expected_batch_size == pytest.approx(dp.expected_batch_size)


def test_the_padding_of_a_user_level_batch_follows_the_users_and_k_only():
    """[users, k] slots: P padded users (from N_users, q and delta) times the declared k, never
    the largest user's count (14 here)."""
    plan = user_plan()
    assert plan.sampler.padded_batch_size == plan.sampler.padded_users * DP.records_per_user
    fewer = np.repeat(np.arange(len(RECORDS_OF)), np.minimum(RECORDS_OF, 2))  # no user above 2
    layout = layout_for(get_config("mlp-s"))
    other = make_plan(DP, len(fewer), STEPS, layout, seed=3, users=group_rows(fewer))
    assert other.sampler.padded_batch_size == plan.sampler.padded_batch_size


def test_a_user_level_plan_without_users_is_refused():
    layout = layout_for(get_config("mlp-s"))
    with pytest.raises(ValueError, match="data.user_column"):
        make_plan(DP, len(USERS), STEPS, layout, seed=3)


def test_the_canaries_of_a_user_level_plan_are_users():
    """zoo audit's canaries under dp.unit = "user" are users: the accounting counts N_users +
    M/2 units (q = E / 65 here; canaries counted among records would give E / 275), and a
    black-box plan pads for the canary users drawn as well, k slots each."""
    layout = layout_for(get_config("mlp-s"))
    m, users = 10, group_rows(USERS)
    plan = make_plan(DP, len(USERS), STEPS, layout, seed=3, users=users, canaries=m)
    assert plan.sampler.sampling_prob == pytest.approx(DP.expected_batch_size / (len(RECORDS_OF) + m // 2))
    assert plan.sampler.num_examples == len(RECORDS_OF)  # the sampler draws the real users only
    rows = make_plan(DP, len(USERS), STEPS, layout, seed=3, users=users, canaries=m, canary_rows=True)
    assert rows.sampler.padded_users > plan.sampler.padded_users  # Binomial(N_users + M, q) users
    assert rows.sampler.padded_batch_size == rows.sampler.padded_users * DP.records_per_user
