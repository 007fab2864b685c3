"""zoo.dp.validate: the DP-PCA budget against the [data] section, and the sampler row against
the privacy unit and the accountant, one line per mistake."""

import pytest

from zoo import recipes
from zoo.configs import DPConfig
from zoo.dp.validate import check_choices, check_pca
from zoo.errors import ZooError

ON = DPConfig(enabled=True, epsilon=2.0, pca_epsilon=0.2)


@pytest.mark.parametrize(
    ("dp", "dp_pca", "words"),
    [
        (DPConfig(enabled=True, epsilon=2.0), 60, "needs its share of the budget: set dp.pca_epsilon"),
        (ON, None, "data.dp_pca is not"),
        (DPConfig(enabled=True, epsilon=2.0, pca_epsilon=2.0), 60, "must be below dp.epsilon = 2.0"),
        (DPConfig(enabled=True, epsilon=2.0, pca_epsilon=-1.0), 60, "finite number > 0"),
        (DPConfig(enabled=True, epsilon=2.0, pca_epsilon=float("inf")), 60, "finite number > 0"),
        # the projection is fitted on every record: one user moves it by all of theirs
        (DPConfig(enabled=True, epsilon=2.0, pca_epsilon=0.2, unit="user"), 60, "under dp.unit = 'user'"),
    ],
)
def test_a_dp_pca_budget_that_does_not_fit_is_one_line(dp, dp_pca, words):
    with pytest.raises(ZooError) as error:
        check_pca(dp, dp_pca)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_budget_that_fits_passes_and_without_dp_nothing_is_checked():
    check_pca(ON, 60)
    check_pca(DPConfig(enabled=True, noise_multiplier=1.0, pca_epsilon=0.5), 60)  # epsilon reported
    check_pca(DPConfig(enabled=False, pca_epsilon=-1.0), None)  # unused without DP
    check_pca(DPConfig(enabled=False), 60)  # plain PCA


def test_a_recipe_is_checked_when_it_is_read_and_when_a_value_changes():
    recipe = recipes.load_recipe("mnist-mlp-dp")
    assert recipe.data.dp_pca == 60 and recipe.dp.pca_epsilon is not None
    with pytest.raises(ZooError, match="must be below dp.epsilon"):
        recipes.override(recipe, {"dp": {"epsilon": recipe.dp.pca_epsilon}})
    with pytest.raises(ZooError, match="set dp.pca_epsilon"):
        recipes.override(recipe, {"dp": {"pca_epsilon": "none"}})
    with pytest.raises(ZooError, match="data.dp_pca must be a positive int"):
        recipes.override(recipe, {"data": {"dp_pca": 0}})
    plain = recipes.override(recipe, {"dp": {"enabled": False}})
    assert plain.data.dp_pca == 60  # without DP: plain PCA


@pytest.mark.parametrize(
    ("dp", "words"),
    [
        (DPConfig(enabled=True, epsilon=2.0, sampler="els"), "draws the units user, not dp.unit = 'record'"),
        (
            DPConfig(enabled=True, epsilon=2.0, sampler="els", accountant="rdp"),
            "samplers of records: poisson",
        ),
        (
            DPConfig(enabled=True, epsilon=2.0, unit="user", sampler="els", accountant="rdp"),
            "its accountants: pld",
        ),
    ],
)
def test_a_sampler_row_is_refused_outside_its_units_and_accountants(dp, words):
    with pytest.raises(ZooError) as error:
        check_choices(dp)
    assert words in str(error.value) and "\n" not in str(error.value)
    check_choices(DPConfig(enabled=True, epsilon=2.0, unit="user", sampler="els"))  # its unit, pld
    check_choices(DPConfig(enabled=True, epsilon=2.0, unit="user"))  # ULS: poisson over users
