"""``zoo audit``'s summary: what the bound is compared with, and what the claim is made of."""

import dp_accounting
import pytest
from dp_accounting.pld import PLDAccountant

from zoo import recipes
from zoo.audit.report import audit
from zoo.commands import settings


def dp_pca_recipe():
    values = {"train.steps": 10, "data.dp_pca": 16, "dp.pca_epsilon": 1.0}
    return settings.with_values(recipes.load_recipe("digits-mlp-dp"), values)


def pld_epsilon(events, delta: float) -> float:
    accountant = PLDAccountant()
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(delta)


def test_a_dp_pca_audit_compares_its_bound_with_the_sgd_steps_epsilon(tmp_path):
    """The canaries pass through DP-SGD's steps only, never through the DP-PCA fit: the claim
    they test is DP-SGD's epsilon, with the projection's and the composed one reported beside."""
    recipe = dp_pca_recipe()
    summary = audit(recipe, tmp_path, canaries=100, plot=False)
    q, sigma, steps, delta = (
        summary["sampling_prob"],
        summary["noise_multiplier"],
        recipe.train.steps,
        recipe.dp.delta,
    )
    sgd = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    assert summary["projection_fitted"] is True
    assert summary["epsilon_claimed"] == pytest.approx(pld_epsilon([sgd], delta), rel=1e-6)
    assert summary["epsilon_sgd"] == summary["epsilon_claimed"]
    assert summary["epsilon_pca"] == pytest.approx(recipe.dp.pca_epsilon, rel=1e-3)
    assert summary["epsilon_run"] == pytest.approx(recipe.dp.epsilon, rel=1e-3)  # calibrated: composed
    assert summary["epsilon_claimed"] < summary["epsilon_run"]


def test_without_a_projection_the_claim_is_the_runs_epsilon(tmp_path):
    recipe = settings.with_values(recipes.load_recipe("digits-mlp-dp"), {"train.steps": 10})
    summary = audit(recipe, tmp_path, canaries=100, plot=False)
    assert summary["projection_fitted"] is False and summary["epsilon_pca"] is None
    assert summary["epsilon_claimed"] == summary["epsilon_sgd"] == summary["epsilon_run"]
