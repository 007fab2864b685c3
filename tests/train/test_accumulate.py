"""Gradient accumulation of a non-private step (zoo.microbatch through the engine's
``mean_loss_and_grad``, ``train.microbatch_size``):
the step over k microbatches equals the one-batch step (loss, gradient and the updated state,
padding rows included) under the float rule, with planted bugs that the comparison catches; and
the settings are checked at the recipe's edge."""

import jax
import jax.numpy as jnp
import optax
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, random_params
from tests.e2e.clikit import refused
from tests.numerics import assert_close
from zoo import microbatch, recipes
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.losses import masked_mean
from zoo.models import registry
from zoo.train.engine import GradientSettings, make_engine, mean_loss_and_grad
from zoo.train.start import config_start

CFG = zoo.get_config(registry.get_kind("transformer").small, num_layers=2)
ROWS = 8


def _batch() -> dict:
    x = zoo.example_batch(CFG, ROWS, seed=3, seq_len=8)
    mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)  # padding rows in two microbatches
    return {"x": x, "y": labels_for(CFG, x), "mask": mask}


def _step(microbatch_size):
    params = random_params(CFG, seed=1)
    freeze = resolve_freeze(params, ())
    grad = GradientSettings("nnx", optax.adamw(1e-2), microbatch_size=microbatch_size)
    engine = make_engine(config_start(CFG, params, freeze=freeze), grad)
    state, frozen = engine.init_state(params, 0)
    return fast_jit(engine.train_step_fn)(state, frozen, _batch())


@pytest.fixture(scope="module")
def one_batch_step():
    """The reference: the one-batch step, built once for the microbatch sizes below."""
    return _step(None)


@pytest.mark.numerics
@pytest.mark.parametrize("microbatch_size", [1, 2, 4])
def test_accumulated_step_equals_the_one_batch_step(one_batch_step, microbatch_size):
    whole_state, whole = one_batch_step
    state, metrics = _step(microbatch_size)
    n = ROWS * 8  # the largest reduction: the batch's tokens
    assert_close(metrics["loss"], whole["loss"], n=n, what="loss")
    assert_close(metrics["grad_norm"], whole["grad_norm"], n=n, what="gradient norm")
    assert_close(state.params, whole_state.params, n=n, what="updated params")
    assert_close(state.opt_state, whole_state.opt_state, n=n, what="AdamW moments")


def _losses(params, x, y):
    return jnp.sum((x * params["w"]) ** 2, axis=-1) + 0.0 * y


def _reference(params, batch):
    return jax.value_and_grad(lambda p: masked_mean(_losses(p, batch["x"], batch["y"]), batch["mask"]))(
        params
    )


TOY = {
    "x": jnp.arange(24.0).reshape(6, 4) / 10,
    "y": jnp.zeros((6,)),
    "mask": jnp.array([1.0, 0, 1, 1, 0, 1]),
}


@pytest.mark.numerics
def test_toy_accumulation_equals_plain_grad():
    params = {"w": jnp.linspace(0.5, 1.5, 4)}
    loss, grads = mean_loss_and_grad(_losses, params, TOY, 2)
    ref_loss, ref_grads = _reference(params, TOY)
    assert_close(loss, ref_loss, n=6 * 4, what="loss")
    assert_close(grads, ref_grads, n=6 * 4, what="grad")


@pytest.mark.parametrize("plant", ["the carry keeps the last microbatch", "one microbatch dropped"])
def test_the_comparison_catches_planted_bugs(monkeypatch, plant):
    """A carry overwritten instead of added to, and a scan that skips a microbatch, both give
    another gradient: the float-rule comparison above fails on them."""
    params = {"w": jnp.linspace(0.5, 1.5, 4)}
    if plant == "the carry keeps the last microbatch":
        real_scan = jax.lax.scan

        def scan(body, init, xs):
            return real_scan(lambda c, x: body(jax.tree.map(jnp.zeros_like, c), x), init, xs)

        monkeypatch.setattr(jax.lax, "scan", scan)
    else:
        real_split = microbatch.split
        monkeypatch.setattr(
            microbatch, "split", lambda t, n: jax.tree.map(lambda a: a[:-1], real_split(t, n))
        )
    _, grads = mean_loss_and_grad(_losses, params, TOY, 2)
    _, ref_grads = _reference(params, TOY)
    with pytest.raises(AssertionError):
        assert_close(grads, ref_grads, n=6 * 4, what="grad")


def test_a_microbatch_that_does_not_divide_the_batch_is_one_line_naming_the_valid_sizes():
    with pytest.raises(
        ZooError,
        match=r"train.microbatch_size must be a positive int that divides the batch of 8 rows, got 3; "
        r"valid microbatch sizes: 1, 2, 4, 8",
    ):
        recipes.parse_recipe({"train": {"batch_size": 8, "microbatch_size": 3}})
    with pytest.raises(ZooError, match=r"got 0; valid microbatch sizes: 1, 2, 4, 8"):
        recipes.parse_recipe({"train": {"batch_size": 8, "microbatch_size": 0}})
    with pytest.raises(ValueError, match="valid microbatch sizes: 1, 2, 3, 6"):
        mean_loss_and_grad(_losses, {"w": jnp.ones(4)}, TOY, 4)


def test_one_knob_under_dp_too_and_the_old_dp_key_is_one_line_naming_it(capsys, tmp_path):
    """train.microbatch_size is every step's: under DP it is the clipping's (the padded Poisson
    batch is padded to a multiple of it, so train.batch_size need not divide by it); the old
    dp.microbatch_size, in a recipe or by --set, is refused in one line naming the new key."""
    dp = {"enabled": True, "noise_multiplier": 1.0}
    recipe = recipes.parse_recipe({"train": {"batch_size": 8, "microbatch_size": 3}, "dp": dp})
    assert recipe.train.microbatch_size == 3
    with pytest.raises(
        ZooError, match=r"train.microbatch_size must be a positive int that divides the batch, got 0$"
    ):
        recipes.parse_recipe({"train": {"microbatch_size": 0}, "dp": dp})
    for doc in ({"dp": {**dp, "microbatch_size": 4}}, {"dp": {"microbatch_size": 4}}):
        with pytest.raises(ZooError, match=r"^dp.microbatch_size = 4 is now train.microbatch_size") as error:
            recipes.parse_recipe(doc)
        assert "\n" not in str(error.value)
    argv = ["train", "digits-mlp-dp", "--set", "dp.microbatch_size=0", "--out", str(tmp_path / "r")]
    refused(
        capsys, argv, "dp.microbatch_size = 0 is now train.microbatch_size", "--set train.microbatch_size=K"
    )
