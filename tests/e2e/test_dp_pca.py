"""``data.dp_pca`` end to end: the projection fitted once, frozen in the checkpoint, applied by
``zoo eval`` and carried through ``zoo export``; under DP its cost composed with DP-SGD's in
the summary, recomputed here with dp_accounting from the summary's own fields."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from tests.e2e.clikit import refused
from tests.numerics import assert_bitwise_equal
from zoo import recipes
from zoo.cli import main
from zoo.dp.pca_fit import PCA_STREAM, private_pca
from zoo.train import checkpoint
from zoo.train.state import train_key
from zoo.train.task import load_task

pytestmark = pytest.mark.xdist_group("dp-pca")
K = 8
QUICK = [
    "--steps",
    "3",
    "--no-progress",
    "--json",
    "--set",
    "train.eval_batches=2",
    "--set",
    f"data.dp_pca={K}",
]
DP = ["--set", "dp.epsilon=none", "--set", "dp.noise_multiplier=3.0", "--set", "dp.pca_epsilon=0.5"]
DP += ["--set", "dp.noise_seed=5"]


def train(capsys, argv) -> dict:
    capsys.readouterr()
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def evaluate(capsys, run) -> dict:
    capsys.readouterr()
    assert main(["eval", str(run), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def training_features(recipe_name: str, private: bool) -> np.ndarray:
    recipe = recipes.load_recipe(recipe_name)
    return load_task(recipe.data, task="classify", seed=recipe.train.seed, private=private).data.x_train


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A run without DP (plain PCA) and one with DP (DP-PCA), both of digits."""
    root = tmp_path_factory.mktemp("pca")
    for name, extra in (("digits-mlp", []), ("digits-mlp-dp", DP)):
        assert main(["train", name, *QUICK, *extra, "--out", str(root / name)]) == 0
    return root


def test_without_dp_the_projection_is_plain_pca_of_the_training_rows_and_is_not_trained(runs, capsys):
    saved = checkpoint.load_checkpoint(runs / "digits-mlp")
    fitted = private_pca(training_features("digits-mlp", private=False), K, noise_multiplier=0.0, key=None)
    assert_bitwise_equal(np.asarray(saved.params["pca"]["w"]), fitted)  # the same function, the same rows
    assert saved.model_config.d_pca == K and saved.model_config.input_projection == ("pca", "w")
    summary = json.loads((runs / "digits-mlp" / "summary.json").read_text())
    assert summary["frozen_params"] == 64 * K and "epsilon" not in summary
    assert evaluate(capsys, runs / "digits-mlp")["eval_accuracy"] == summary["eval_accuracy"]


def test_under_dp_the_projection_is_dp_pca_with_a_key_of_its_own(runs):
    saved = checkpoint.load_checkpoint(runs / "digits-mlp-dp")
    summary = json.loads((runs / "digits-mlp-dp" / "summary.json").read_text())
    key = jax.random.fold_in(train_key(5), PCA_STREAM)  # dp.noise_seed = 5 pins the root key
    x = training_features("digits-mlp-dp", private=True)
    fitted = private_pca(x, K, noise_multiplier=summary["pca_noise_multiplier"], key=key, prng="philox4x32")
    assert_bitwise_equal(np.asarray(saved.params["pca"]["w"]), fitted)
    plain = private_pca(x, K, noise_multiplier=0.0, key=None)
    assert not np.allclose(fitted, plain, atol=1e-3)  # the noise is there


def test_the_summary_epsilon_is_dp_accountings_composition_of_its_own_fields(runs, capsys):
    import dp_accounting
    from dp_accounting.pld import PLDAccountant

    s = json.loads((runs / "digits-mlp-dp" / "summary.json").read_text())
    gaussian = dp_accounting.GaussianDpEvent
    step = dp_accounting.PoissonSampledDpEvent(s["sampling_prob"], gaussian(s["noise_multiplier"]))
    sgd = dp_accounting.SelfComposedDpEvent(step, s["steps"])
    delta = s["delta_accountant"]
    composed = PLDAccountant().compose(
        dp_accounting.ComposedDpEvent([gaussian(s["pca_noise_multiplier"]), sgd])
    )
    assert s["epsilon"] == pytest.approx(composed.get_epsilon(delta), rel=1e-9)
    assert s["epsilon_sgd"] == pytest.approx(PLDAccountant().compose(sgd).get_epsilon(delta), rel=1e-9)
    pca_alone = PLDAccountant().compose(gaussian(s["pca_noise_multiplier"])).get_epsilon(delta)
    assert (
        s["epsilon_pca"] == pytest.approx(pca_alone, rel=1e-9) and s["epsilon_pca"] <= s["pca_epsilon"] == 0.5
    )
    assert "train_loss" not in s  # under DP the batches' loss is not released
    again = evaluate(capsys, runs / "digits-mlp-dp")  # zoo eval: the same guarantee, parts included
    for key in ("epsilon", "epsilon_pca", "epsilon_sgd", "delta", "eval_accuracy"):
        assert again[key] == s[key], key


def test_a_lora_run_and_its_export_keep_the_projection(runs, capsys, tmp_path):
    base = runs / "digits-mlp"
    lora = ["train", "digits-mlp", "--init-from", str(base), "--lora", "rank=2,targets=head"]
    tuned = train(capsys, [*lora, "--steps", "2", "--no-progress", "--json", "--out", str(tmp_path / "lora")])
    capsys.readouterr()
    assert main(["export", str(tmp_path / "lora"), "--merge", "--out", str(tmp_path / "merged")]) == 0
    merged = checkpoint.load_checkpoint(tmp_path / "merged")
    start = checkpoint.load_checkpoint(base)
    assert_bitwise_equal(np.asarray(merged.params["pca"]["w"]), np.asarray(start.params["pca"]["w"]))
    assert merged.model_config.d_pca == K
    assert evaluate(capsys, tmp_path / "merged")["eval_accuracy"] == tuned["eval_accuracy"]


def test_a_projection_that_cannot_apply_is_one_line(runs, capsys, tmp_path):
    transformer = ["train", "digits-transformer", "--steps", "1", "--set", "data.dp_pca=4"]
    refused(
        capsys, [*transformer, "--out", str(tmp_path / "t")], "data.dp_pca = 4", "no fixed input projection"
    )
    start = ["train", "digits-mlp", "--init-from", str(runs / "digits-mlp"), "--steps", "1"]
    refused(
        capsys, [*start, "--set", "data.dp_pca=5", "--out", str(tmp_path / "s")], "a projection of width 8"
    )
    refused(capsys, ["train", "digits-mlp", "--set", "data.dp_pca=65", "--out", str(tmp_path / "w")], "d_pca")
