"""The DP plan (zoo.dp.plan.make_plan) under dp.unit = "user": the unit it accounts is a user,
sampled as one unit (ULS) or record by record with at most k per user (ELS)."""

from __future__ import annotations

import dataclasses
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from scipy import stats

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


def user_plan(dp: DPConfig = DP, canaries: int = 0):
    layout = layout_for(get_config("mlp-s"))
    return make_plan(
        dp,
        len(USERS),
        STEPS,
        layout,
        seed=3,
        microbatch_size=None,
        users=group_rows(USERS),
        canaries=canaries,
    )


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
    other = make_plan(DP, len(fewer), STEPS, layout, seed=3, microbatch_size=None, users=group_rows(fewer))
    assert other.sampler.padded_batch_size == plan.sampler.padded_batch_size


def test_a_user_level_plan_without_users_is_refused():
    layout = layout_for(get_config("mlp-s"))
    with pytest.raises(ValueError, match="data.user_column"):
        make_plan(DP, len(USERS), STEPS, layout, seed=3, microbatch_size=None)


def test_the_canaries_of_a_user_level_plan_are_users():
    """zoo audit's canaries under dp.unit = "user" are users: the accounting counts N_users +
    M/2 units (q = E / 65 here; canaries counted among records would give E / 275), and a
    black-box plan pads for the canary users drawn as well, k slots each."""
    layout = layout_for(get_config("mlp-s"))
    m, users = 10, group_rows(USERS)
    plan = make_plan(DP, len(USERS), STEPS, layout, seed=3, microbatch_size=None, users=users, canaries=m)
    assert plan.sampler.sampling_prob == pytest.approx(DP.expected_batch_size / (len(RECORDS_OF) + m // 2))
    assert plan.sampler.num_examples == len(RECORDS_OF)  # the sampler draws the real users only
    rows = make_plan(
        DP, len(USERS), STEPS, layout, seed=3, microbatch_size=None, users=users, canaries=m, canary_rows=True
    )
    assert rows.sampler.padded_users > plan.sampler.padded_users  # Binomial(N_users + M, q) users
    assert rows.sampler.padded_batch_size == rows.sampler.padded_users * DP.records_per_user


# -- ELS: records drawn at q = E / (N_users * k), at most k per user, accounted per user --------
# k = 2 and sigma = 3: a mixture's PLD is built point by point, and these keep it to a second
ELS = dataclasses.replace(DP, sampler="els", expected_batch_size=30, noise_multiplier=3.0, records_per_user=2)


def jax_privacy_user_epsilon(records: int, batch: int, sigma: float, steps: int, k: int, delta: float):
    """jax_privacy 2.0's user-level accountant: ``records`` examples, at most ``k`` per user (on
    zoo's grid for a mixture of Gaussians)."""
    from jax_privacy import accounting as jp

    from zoo.dp.mixture import MIXTURE_PLD_DISCRETIZATION

    params = jp.DpParams(
        noise_multipliers=sigma, num_samples=records, delta=delta, batch_size=batch, examples_per_user=k
    )
    grid = jp.PldAccountantConfig(value_discretization_interval=MIXTURE_PLD_DISCRETIZATION)
    return jp.DpsgdTrainingUserLevelAccountant(grid).compute_epsilon(steps, params)


def test_an_els_plan_spends_jax_privacys_user_level_epsilon_over_users_times_k():
    """ELS's epsilon is jax_privacy's user-level accountant over N_users * k records, k per
    user. A q over the records kept (E / 102, not E / 120) or a step that ignores k (the
    record-level Poisson Gaussian) is far from it, and fails."""
    plan = user_plan(ELS)
    n_users, k = len(RECORDS_OF), ELS.records_per_user
    assert plan.sampler.sampling_prob == ELS.expected_batch_size / (n_users * k)
    assert (plan.unit, plan.mechanism.records_per_unit) == ("user", k)
    assert plan.records_per_user is None  # no [users, k] slots: each record is clipped alone
    assert plan.sampler.algorithm == "ELS" and plan.sampler.users == n_users
    assert plan.expected_batch_size == pytest.approx(ELS.expected_batch_size)  # the normaliser counts records
    expected = jax_privacy_user_epsilon(
        n_users * k, ELS.expected_batch_size, ELS.noise_multiplier, STEPS, k, DP.delta
    )
    privacy = plan.privacy_at(STEPS)
    assert privacy["epsilon"] == pytest.approx(expected, rel=1e-6)
    assert pld_epsilon(plan.sampler.sampling_prob, ELS.noise_multiplier, STEPS, DP.delta) < 0.7 * expected
    # truncation: the larger neighbour holds one more user's k records
    size, q = plan.sampler.padded_batch_size, plan.sampler.sampling_prob
    bound = (1 + math.exp(privacy["epsilon"])) * STEPS * stats.binom.sf(size, (n_users + 1) * k, q)
    assert privacy["delta_truncation"] == pytest.approx(bound, rel=1e-9, abs=1e-300)


def test_a_calibrated_els_plan_spends_its_epsilon_per_user():
    plan = user_plan(dataclasses.replace(ELS, noise_multiplier=None, epsilon=1.0))
    records, k = len(RECORDS_OF) * ELS.records_per_user, ELS.records_per_user
    spent = jax_privacy_user_epsilon(
        records, ELS.expected_batch_size, plan.noise_multiplier, STEPS, k, DP.delta
    )
    assert 0.99 * 1.0 <= spent <= 1.0


def test_an_els_plan_takes_no_canary_users_yet():
    with pytest.raises(ValueError, match="dp.sampler = 'els' has no audit yet"):
        user_plan(dataclasses.replace(ELS, noise_multiplier=50.0), canaries=10)


@pytest.mark.parametrize("canaries", [0, 4])
def test_a_plan_over_no_unit_is_refused_in_the_same_line_at_either_unit(canaries):
    """Issue 60, item 6: a record-level run that keeps no row ended in the ValueError
    ``num_records must be a positive int``, a traceback at the CLI; the user-level one was
    refused in one line. Both now give that line, canaries (zoo audit) or not."""
    from zoo.errors import ZooError

    layout = layout_for(get_config("mlp-s"))
    records = dataclasses.replace(DP, unit="record")
    lines = []
    for dp, users in ((records, None), (DP, group_rows(np.zeros(0, np.int64)))):
        with pytest.raises(ZooError) as refusal:
            make_plan(dp, 0, STEPS, layout, seed=3, microbatch_size=None, users=users, canaries=canaries)
        lines.append(str(refusal.value))
    assert lines[0] == lines[1] and "num_examples=0" in lines[0]


# -- the plan is the made pieces -----------------------------------------------------------------
def check_made_pieces(plan) -> None:
    """What the engine calls is what the mechanism made: the noise's multiplier, clip norm and
    normaliser are the mechanism's, the sampler draws at its q, the event is its own, and the
    aggregation clips at its clip norm."""
    from zoo.dp.mechanisms import GaussianNoise

    m = plan.mechanism
    assert plan.made.noise == GaussianNoise(
        m.noise_multiplier, m.clip_norm, m.normaliser, plan.performance.noise_prng
    ), plan.made.noise
    assert plan.made.dp_event(STEPS) == m.dp_event(STEPS)
    if plan.sampler is not None:
        assert plan.sampler.sampling_prob == m.sampling_prob
    assert (plan.noise_multiplier, plan.clip_norm, plan.expected_batch_size) == (
        m.noise_multiplier,
        m.clip_norm,
        m.normaliser,
    )


def every_plan():
    from tests.dp.mechanisms.sections import SECTIONS, plan
    from zoo.dp.plan import fixed_batch_plan

    made = [plan(dp) for dp in SECTIONS.values()]
    made.append(fixed_batch_plan(8, noise_multiplier=1.5, clip_norm=0.5))
    made.append(fixed_batch_plan(4, unit="user", records_per_user=3))
    return made


def test_a_plans_made_noise_sampler_and_event_are_its_mechanisms():
    for plan in every_plan():
        check_made_pieces(plan)
    fixed = every_plan()[-2]  # a fixed batch of 8 rows: DP-SGD drawing all 8 (q = 1), normaliser 8
    assert (fixed.mechanism.name, fixed.mechanism.sampling_prob, fixed.expected_batch_size) == (
        "dpsgd",
        1.0,
        8.0,
    )
    assert every_plan()[-1].records_per_user == 3 and every_plan()[-1].unit == "user"


def test_the_pieces_check_catches_a_plan_whose_noise_is_not_the_mechanisms(monkeypatch):
    """Planted: the made noise keeps the uncalibrated multiplier (1.0) and the normaliser counts
    the padded rows, as a plan rebuilt from copies could."""
    from zoo.dp.mechanisms import Mechanism

    make = Mechanism.make

    def stale(self, performance, **kwargs):
        made = make(self, performance, **kwargs)
        noise = dataclasses.replace(made.noise, noise_multiplier=1.0)
        return dataclasses.replace(made, noise=noise)

    monkeypatch.setattr(Mechanism, "make", stale)
    with pytest.raises(AssertionError):
        check_made_pieces(every_plan()[0])
