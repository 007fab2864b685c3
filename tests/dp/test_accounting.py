"""Tests for zoo.dp accounting (dp_accounting PLD / RDP) and DPConfig validation."""

import dataclasses
import functools
import math
import re

import pytest

from zoo.dp import (
    DPConfig,
    calibrate_noise_multiplier,
    epsilon_spent,
    max_steps_within_budget,
    resolve_noise_multiplier,
    validate,
)

DELTA = 1e-5
COARSE = 1e-3  # PLD discretisation for speed in tests; still a valid upper bound.


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibrate_round_trip(accountant):
    target, q, steps = 2.0, 0.02, 100
    sigma = calibrate_noise_multiplier(
        epsilon=target,
        delta=DELTA,
        sampling_prob=q,
        steps=steps,
        accountant=accountant,
        pld_discretization=COARSE,
    )
    assert 0.3 < sigma < 5
    eps = epsilon_spent(
        noise_multiplier=sigma,
        delta=DELTA,
        sampling_prob=q,
        steps=steps,
        accountant=accountant,
        pld_discretization=COARSE,
    )
    assert 0.99 * target <= eps <= target * (1 + 1e-9)
    # A slightly smaller sigma must exceed the budget (calibration is tight).
    eps_less = epsilon_spent(
        noise_multiplier=0.97 * sigma,
        delta=DELTA,
        sampling_prob=q,
        steps=steps,
        accountant=accountant,
        pld_discretization=COARSE,
    )
    assert eps_less > target


def test_calibration_searches_a_coarse_grid_and_meets_the_budget_on_the_fine_one():
    # The search runs on SEARCH_PLD_DISCRETIZATION; the sigma must still spend at most the
    # target on the default grid, and be the sigma dp_accounting finds there to 1e-3.
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from zoo.dp.accounting import DEFAULT_PLD_DISCRETIZATION, SEARCH_PLD_DISCRETIZATION

    assert SEARCH_PLD_DISCRETIZATION > DEFAULT_PLD_DISCRETIZATION
    target, q, steps = 0.5, 0.02, 100  # a large sigma: the quick PLDs
    sigma = calibrate_noise_multiplier(epsilon=target, delta=DELTA, sampling_prob=q, steps=steps)
    fine = epsilon_spent(noise_multiplier=sigma, delta=DELTA, sampling_prob=q, steps=steps)
    assert 0.99 * target <= fine <= target

    def event(s):
        step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(s))
        return dp_accounting.SelfComposedDpEvent(step, steps)

    # The fine-grid search runs in [0.9 sigma, sigma]: it fails unless its optimum is there.
    reference = dp_accounting.calibrate_dp_mechanism(
        lambda: PLDAccountant(value_discretization_interval=DEFAULT_PLD_DISCRETIZATION),
        event,
        target,
        DELTA,
        bracket_interval=dp_accounting.ExplicitBracketInterval(0.9 * sigma, sigma),
    )
    assert reference <= sigma <= reference * (1 + 1e-3)


def test_a_coarse_sigma_that_fails_the_fine_grid_is_searched_again_there(monkeypatch):
    from zoo.dp import accounting
    from zoo.dp.mechanisms import accountant as account

    search = account._search
    grids = []

    def too_small_on_the_coarse_grid(mechanism, epsilon, delta, steps, accountant, grid, lower=0.0):
        grids.append(grid)
        sigma = search(mechanism, epsilon, delta, steps, accountant, grid, lower)
        return 0.99 * sigma if grid == accounting.SEARCH_PLD_DISCRETIZATION else sigma

    monkeypatch.setattr(account, "_search", too_small_on_the_coarse_grid)
    account.calibrate.cache_clear()  # searched afresh, not read from the cache
    kw = dict(delta=DELTA, sampling_prob=0.02, steps=100)
    sigma = accounting.calibrate_noise_multiplier(epsilon=0.5, **kw)
    account.calibrate.cache_clear()
    assert grids == [accounting.SEARCH_PLD_DISCRETIZATION, accounting.DEFAULT_PLD_DISCRETIZATION]
    fine = epsilon_spent(noise_multiplier=sigma, **kw)
    assert 0.99 * 0.5 <= fine <= 0.5


def test_pld_default_discretisation_and_rdp_is_looser():
    kw = dict(noise_multiplier=1.0, delta=DELTA, sampling_prob=0.01, steps=1000)
    pld = epsilon_spent(**kw)  # dp_accounting's default PLD discretisation
    rdp = epsilon_spent(**kw, accountant="rdp")
    assert 1.0 < pld < 3.0
    assert rdp >= 0.99 * pld
    assert rdp < 2 * pld  # same mechanism: looser, not wildly different


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_epsilon_increases_with_steps_and_decreases_with_noise(accountant):
    kw = dict(delta=DELTA, sampling_prob=0.01, accountant=accountant, pld_discretization=COARSE)
    by_steps = [epsilon_spent(noise_multiplier=1.0, steps=s, **kw) for s in (10, 100, 1000)]
    assert by_steps[0] < by_steps[1] < by_steps[2]
    by_sigma = [epsilon_spent(noise_multiplier=s, steps=100, **kw) for s in (0.8, 1.0, 1.5)]
    assert by_sigma[0] > by_sigma[1] > by_sigma[2]
    assert epsilon_spent(noise_multiplier=1.0, steps=0, **kw) == 0.0
    assert epsilon_spent(noise_multiplier=0.0, steps=5, **kw) == math.inf


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_max_steps_within_budget(accountant):
    kw = dict(
        noise_multiplier=1.0,
        delta=DELTA,
        sampling_prob=0.01,
        accountant=accountant,
        pld_discretization=COARSE,
    )
    steps = max_steps_within_budget(epsilon=2.0, upper=2000, **kw)
    assert 0 < steps < 2000
    assert epsilon_spent(steps=steps, **kw) <= 2.0 < epsilon_spent(steps=steps + 1, **kw)
    # Budget large enough for `upper` steps -> upper; too small for one step -> 0.
    assert max_steps_within_budget(epsilon=50.0, upper=100, **kw) == 100
    assert max_steps_within_budget(epsilon=1e-4, upper=100, **kw) == 0


def test_resolve_noise_multiplier():
    cfg = DPConfig(enabled=True, epsilon=3.0, expected_batch_size=100, accountant="rdp")
    sigma, eps = resolve_noise_multiplier(cfg, num_examples=10_000, steps=200)
    assert eps <= 3.0 and eps > 2.9
    cfg2 = dataclasses.replace(cfg, epsilon=None, noise_multiplier=sigma)
    assert resolve_noise_multiplier(cfg2, 10_000, 200) == pytest.approx((sigma, eps))


def test_function_argument_errors():
    with pytest.raises(ValueError, match=re.escape("epsilon=-1.0")):
        calibrate_noise_multiplier(epsilon=-1.0, delta=DELTA, sampling_prob=0.1, steps=10)
    with pytest.raises(ValueError, match=re.escape("sampling_prob=1.5")):
        epsilon_spent(noise_multiplier=1.0, delta=DELTA, sampling_prob=1.5, steps=10)
    with pytest.raises(ValueError, match=r"'gdp'.*pld, rdp"):
        epsilon_spent(noise_multiplier=1.0, delta=DELTA, sampling_prob=0.1, steps=10, accountant="gdp")


GOOD = DPConfig(enabled=True, epsilon=2.0, delta=1e-5, expected_batch_size=64)
N = 10_000


def test_valid_configs_pass():
    validate(GOOD, N)
    validate(dataclasses.replace(GOOD, clipping="ghost", accountant="rdp"), N)
    validate(dataclasses.replace(GOOD, epsilon=None, noise_multiplier=1.1), N)
    # Disabled configs are not checked (DP fields unused).
    validate(DPConfig(enabled=False, sampler="shuffle", epsilon=-1.0), N)


@pytest.mark.parametrize(
    "changes, needles",
    [
        (dict(delta=1e-3), ["delta=0.001", "1/10000"]),
        (dict(delta=0.0), ["delta=0.0"]),
        (dict(epsilon=0.0), ["epsilon=0.0"]),
        (dict(epsilon=-3.5), ["epsilon=-3.5"]),
        (dict(clip_norm=0.0), ["clip_norm=0.0"]),
        (dict(clip_norm=-2.5), ["clip_norm=-2.5"]),
        (dict(clip_norm=float("inf")), ["clip_norm=inf"]),
        (dict(expected_batch_size=20_000), ["20000/10000", "2"]),
        (dict(expected_batch_size=0), ["expected_batch_size=0"]),
        (dict(sampler="shuffle"), ["'shuffle'", "poisson"]),
        (dict(noise_multiplier=1.0), ["epsilon=2.0", "noise_multiplier=1.0"]),
        (dict(epsilon=None), ["epsilon=None", "noise_multiplier=None"]),
        (dict(epsilon=None, noise_multiplier=0.0), ["noise_multiplier=0.0"]),
        (dict(accountant="gdp"), ["'gdp'", "pld, rdp"]),
        (dict(clipping="per_layer"), ["'per_layer'", "ghost, vmap"]),
        (
            dict(noise_prng="philox8x32"),
            ["'philox8x32'", "auto, philox4x32, rbg, threefry2x32, threefry4x32"],
        ),
        (dict(noise_seed=-1), ["noise_seed=-1", "2**32"]),
        (dict(noise_seed=2**32), ["noise_seed=4294967296", "2**32"]),
        (dict(noise_seed=1.5), ["noise_seed=1.5"]),
        (dict(noise_seed=True), ["noise_seed=True"]),
    ],
)
def test_validation_errors_name_the_value(changes, needles):
    cfg = dataclasses.replace(GOOD, **changes)
    with pytest.raises(ValueError) as err:
        validate(cfg, N)
    for needle in needles:
        assert needle in str(err.value), (needle, str(err.value))


def test_validation_num_examples():
    with pytest.raises(ValueError, match="num_examples=0"):
        validate(GOOD, 0)


# -- DP-PCA composed with DP-SGD ----------------------------------------------------------------
def composed_reference(pca_sigma, sigma, q, steps, accountant):
    """The run's epsilon built here from dp_accounting's events: one Gaussian release (the
    projection), then ``steps`` Poisson-subsampled Gaussian steps."""
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    event = dp_accounting.ComposedDpEvent(
        [dp_accounting.GaussianDpEvent(pca_sigma), dp_accounting.SelfComposedDpEvent(step, steps)]
    )
    accountant = PLDAccountant() if accountant == "pld" else RdpAccountant()
    return accountant.compose(event).get_epsilon(DELTA)


def check_composed(accountant):
    from zoo.dp.mechanisms import accountant as account

    account.epsilon.cache_clear()
    for pca_sigma, sigma, q, steps in ((8.0, 1.2, 0.01, 300), (3.0, 0.9, 0.05, 50)):
        got = epsilon_spent(
            noise_multiplier=sigma, delta=DELTA, sampling_prob=q, steps=steps, accountant=accountant,
            pca_noise_multiplier=pca_sigma,
        )  # fmt: skip
        assert got == pytest.approx(composed_reference(pca_sigma, sigma, q, steps, accountant), rel=1e-9)
        alone = epsilon_spent(
            noise_multiplier=sigma, delta=DELTA, sampling_prob=q, steps=steps, accountant=accountant
        )
        assert got > alone  # the projection costs something


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_the_composed_epsilon_is_dp_accountings_composition(accountant):
    check_composed(accountant)


def test_the_composition_check_still_catches_a_dropped_projection(monkeypatch):
    from zoo.dp.mechanisms import DPPCA
    from zoo.dp.mechanisms import accountant as account

    monkeypatch.setattr(DPPCA, "dp_event", lambda self, steps: self.inner.dp_event(steps))
    with pytest.raises(AssertionError):
        check_composed("rdp")
    account.epsilon.cache_clear()


def test_the_projections_noise_meets_its_share_and_sgd_is_calibrated_for_the_rest():
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    from zoo.dp.accounting import calibrate_gaussian

    pca_sigma = calibrate_gaussian(epsilon=0.2, delta=DELTA)
    alone = PLDAccountant().compose(dp_accounting.GaussianDpEvent(pca_sigma)).get_epsilon(DELTA)
    assert 0.2 * (1 - 1e-3) <= alone <= 0.2  # meets its share, and only just
    cfg = DPConfig(enabled=True, epsilon=2.0, delta=DELTA, expected_batch_size=512, pca_epsilon=0.2)
    sigma, eps = resolve_noise_multiplier(cfg, 60000, 500, pca_noise_multiplier=pca_sigma)
    assert eps == pytest.approx(composed_reference(pca_sigma, sigma, 512 / 60000, 500, "pld"), rel=1e-9)
    assert 2.0 * (1 - 1e-2) <= eps <= 2.0
    plain, _ = resolve_noise_multiplier(dataclasses.replace(cfg, pca_epsilon=None), 60000, 500)
    assert sigma > plain  # the projection's share leaves DP-SGD less


def test_the_summary_parts_are_each_mechanism_alone():
    from zoo.dp.accounting import guaranteed_privacy
    from zoo.dp.sampling import PoissonSampler

    sampler = PoissonSampler.for_expected_batch(5000, 100, 0, 1e-12)
    got = guaranteed_privacy(sampler, noise_multiplier=1.0, delta=DELTA, steps=100, pca_noise_multiplier=6.0)
    q = sampler.sampling_prob
    assert got["epsilon"] == pytest.approx(composed_reference(6.0, 1.0, q, 100, "pld"), rel=1e-9)
    assert got["epsilon_sgd"] == pytest.approx(
        epsilon_spent(noise_multiplier=1.0, delta=DELTA, sampling_prob=q, steps=100)
    )
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    gaussian = PLDAccountant().compose(dp_accounting.GaussianDpEvent(6.0)).get_epsilon(DELTA)
    assert got["epsilon_pca"] == pytest.approx(gaussian, rel=1e-9)
    assert (
        max(got["epsilon_pca"], got["epsilon_sgd"]) < got["epsilon"] < got["epsilon_pca"] + got["epsilon_sgd"]
    )
    assert "epsilon_pca" not in guaranteed_privacy(sampler, noise_multiplier=1.0, delta=DELTA, steps=100)


# -- a unit of k records, each drawn on its own (ELS): jax_privacy's user-level accountant ------
@functools.lru_cache
def jax_privacy_user_epsilon(records: int, batch: int, sigma: float, steps: int, k: int) -> float:
    """jax_privacy 2.0's DpsgdTrainingUserLevelAccountant: ``records`` examples, ``k`` per user,
    each Poisson-sampled at ``batch / records``, on zoo's grid for a mixture."""
    from jax_privacy import accounting as jp

    from zoo.dp.mixture import MIXTURE_PLD_DISCRETIZATION

    params = jp.DpParams(
        noise_multipliers=sigma, num_samples=records, delta=DELTA, batch_size=batch, examples_per_user=k
    )
    grid = jp.PldAccountantConfig(value_discretization_interval=MIXTURE_PLD_DISCRETIZATION)
    return jp.DpsgdTrainingUserLevelAccountant(grid).compute_epsilon(steps, params)


USER_LEVEL = [(600, 30, 3.0, 200, 3), (300, 30, 4.0, 40, 2)]  # records, E, sigma, steps, k


def check_user_level(records: int, batch: int, sigma: float, steps: int, k: int) -> None:
    got = epsilon_spent(
        noise_multiplier=sigma, delta=DELTA, sampling_prob=batch / records, steps=steps, records_per_unit=k
    )
    assert got == pytest.approx(jax_privacy_user_epsilon(records, batch, sigma, steps, k), rel=1e-6)


@pytest.mark.parametrize(("records", "batch", "sigma", "steps", "k"), USER_LEVEL)
def test_a_unit_of_k_records_spends_jax_privacys_user_level_epsilon(records, batch, sigma, steps, k):
    check_user_level(records, batch, sigma, steps, k)


def test_the_user_level_check_catches_a_step_that_ignores_k(monkeypatch):
    """Planted: each step the Poisson-subsampled Gaussian of one record, whatever k."""
    from zoo.dp.mechanisms import DPSGD, ELS
    from zoo.dp.mechanisms import accountant as account

    monkeypatch.setattr(ELS, "step_event", DPSGD.step_event)
    account.epsilon.cache_clear()
    try:
        with pytest.raises(AssertionError):
            check_user_level(*USER_LEVEL[0])
    finally:
        account.epsilon.cache_clear()


def test_a_unit_of_k_records_is_accounted_by_pld_only():
    with pytest.raises(ValueError, match="accounted by 'pld' only"):
        epsilon_spent(
            noise_multiplier=1.0,
            delta=DELTA,
            sampling_prob=0.1,
            steps=5,
            records_per_unit=3,
            accountant="rdp",
        )
