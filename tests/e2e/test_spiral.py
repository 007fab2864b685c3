"""The capstone: the three-arm spiral dataset, the spiral-mlp recipe, and ``zoo eval --hardest``."""

import json

import jax
import numpy as np
import pytest

import zoo
from zoo import recipes
from zoo.cli import main
from zoo.data import DatasetError, dataset_kinds, load_dataset, register_builtin
from zoo.data.forms.spiral import make_spiral
from zoo.losses import per_example_loss
from zoo.train import checkpoint
from zoo.train.loop import train_recipe


def test_spiral_is_three_noisy_arms_from_the_origin():
    ds = load_dataset("spiral", task="classify", seed=0, eval_fraction=0.2)
    assert (ds.x_train.shape, ds.x_eval.shape, ds.num_classes) == ((1440, 2), (360, 2), 3)
    x = np.concatenate([ds.x_train, ds.x_eval])
    y = np.concatenate([ds.y_train, ds.y_eval])
    assert np.bincount(y).tolist() == [600, 600, 600]
    radius = np.linalg.norm(x, axis=1)
    assert radius.max() <= 1.0 and radius.min() < 0.01
    # Independent reference: arm j's angle is 4j + 4r plus N(0, 0.15^2) noise.
    angle = np.arctan2(x[:, 0], x[:, 1])
    residual = np.angle(np.exp(1j * (angle - 4.0 * y - 4.0 * radius)))
    assert 0.12 < residual.std() < 0.18
    # Drawn from a fixed key: the same points every time.
    again = load_dataset("spiral", task="classify", seed=0, eval_fraction=0.2)
    assert np.array_equal(again.x_train, ds.x_train)
    xs, ys = make_spiral(jax.random.key(0), 5)
    assert xs.shape == (15, 2) and ys.tolist() == [0] * 5 + [1] * 5 + [2] * 5


def test_spiral_is_a_registered_builtin():
    assert "spiral" in dataset_kinds()
    with pytest.raises(DatasetError, match="supports only task='classify'"):
        load_dataset("spiral", task="lm")
    with pytest.raises(DatasetError, match="Did you mean 'spiral'"):
        load_dataset("spirals", task="classify")
    with pytest.raises(ValueError, match="taken"):
        register_builtin("spiral", "classify", lambda: None, description="a second spiral")


@pytest.fixture(scope="session")  # built at most once per xdist worker
def spiral_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("spiral")
    summary = train_recipe(recipes.load_recipe("spiral-mlp"), out, show_progress=False)
    return out, summary


@pytest.mark.xdist_group("spiral-run")  # spiral_run is built once, on one worker
def test_spiral_mlp_recipe_reaches_95_percent_compiling_its_step_once(spiral_run):
    _, summary = spiral_run
    assert summary["compile_count"] == 1
    assert summary["eval_accuracy"] >= 0.95


@pytest.mark.xdist_group("spiral-run")  # spiral_run is built once, on one worker
def test_hardest_lists_the_highest_eval_losses_near_the_origin(spiral_run, capsys):
    out, _ = spiral_run
    assert main(["eval", str(out), "--hardest", "5", "--json"]) == 0
    hard = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["hardest"]
    # Independent reference: every eval example's loss, from the saved params.
    ckpt = checkpoint.load_checkpoint(out)
    ds = load_dataset("spiral", task="classify", seed=ckpt.recipe.train.seed, eval_fraction=0.2)
    logits = zoo.apply_fn(ckpt.model_config, "nnx")(ckpt.params, ds.x_eval)
    losses = np.asarray(per_example_loss(logits, ds.y_eval))
    expected = np.argsort(-losses, kind="stable")[:5]
    assert [row["index"] for row in hard] == expected.tolist()
    np.testing.assert_allclose([row["loss"] for row in hard], losses[expected], rtol=1e-4, atol=1e-6)
    assert [row["label"] for row in hard] == ds.y_eval[expected].tolist()
    # The seed's error analysis: the hardest points sit where the three arms meet.
    assert max(np.linalg.norm(row["x"]) for row in hard) < 0.05


@pytest.mark.xdist_group("spiral-run")  # spiral_run is built once, on one worker
def test_hardest_must_be_positive(spiral_run, capsys):
    out, _ = spiral_run
    with pytest.raises(SystemExit):
        main(["eval", str(out), "--hardest", "0"])
    assert "positive number of examples" in capsys.readouterr().err


class _Echo:
    """An engine stand-in whose model returns its input as the logits."""

    class freeze:  # noqa: N801
        @staticmethod
        def merge(trainable, frozen):
            return trainable

    @staticmethod
    def logits(params, x):
        return x

    @staticmethod
    def eval_params(trainable):  # the params as a read-only pass takes them: as they are
        return trainable


def test_hardest_ranks_by_loss_counts_only_unmasked_rows_and_puts_nan_first():
    from types import SimpleNamespace

    from zoo.train.hardest import hardest

    good, bad = [4.0, 0.0, 0.0], [0.0, 4.0, 0.0]  # label 0 is right for `good`, wrong for `bad`
    batches = [
        {"x": np.array([good, bad], np.float32), "y": np.array([0, 0]), "mask": np.array([1.0, 1.0])},
        {
            "x": np.array([[np.nan] * 3, bad, good], np.float32),
            "y": np.array([0, 1, 0]),
            "mask": np.array([1.0, 1.0, 0.0]),
        },
    ]
    rows = hardest(_Echo, SimpleNamespace(params={}), {}, batches, 3)
    assert [r["index"] for r in rows] == [2, 1, 0]  # NaN first; the masked slot is not an example
    assert np.isnan(rows[0]["loss"]) and rows[1]["predicted"] == 1 and rows[1]["label"] == 0
    assert rows[2]["loss"] < rows[1]["loss"]
