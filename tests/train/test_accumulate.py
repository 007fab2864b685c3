"""Gradient accumulation of a non-private step (zoo.train.accumulate, ``train.microbatch_size``):
the step over k microbatches equals the one-batch step (loss, gradient and the updated state,
padding rows included) under the float rule, with planted bugs that the comparison catches; and
the settings are checked at the recipe's edge."""

import jax
import jax.numpy as jnp
import optax
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, random_params
from tests.numerics import assert_close
from zoo import recipes
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.losses import masked_mean
from zoo.models import registry
from zoo.train import accumulate
from zoo.train.engine import make_engine

CFG = zoo.get_config(registry.get_kind("transformer").small, num_layers=2)
ROWS = 8


def _batch() -> dict:
    x = zoo.example_batch(CFG, ROWS, seed=3, seq_len=8)
    mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)  # padding rows in two microbatches
    return {"x": x, "y": labels_for(CFG, x), "mask": mask}


def _step(microbatch_size):
    params = random_params(CFG, seed=1)
    freeze = resolve_freeze(params, ())
    engine = make_engine(CFG, "nnx", freeze, optax.adamw(1e-2), microbatch_size=microbatch_size)
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
    loss, grads = accumulate.accumulated_value_and_grad(_losses, params, TOY, 2)
    ref_loss, ref_grads = _reference(params, TOY)
    assert_close(loss, ref_loss, n=6 * 4, what="loss")
    assert_close(grads, ref_grads, n=6 * 4, what="grad")


@pytest.mark.parametrize("plant", ["the carry keeps the last microbatch", "one microbatch dropped"])
def test_the_comparison_catches_planted_bugs(monkeypatch, plant):
    """A carry overwritten instead of added to, and a scan that skips a microbatch, both give
    another gradient: the float-rule comparison above fails on them."""
    params = {"w": jnp.linspace(0.5, 1.5, 4)}
    if plant == "the carry keeps the last microbatch":
        monkeypatch.setattr(accumulate, "_add", lambda acc, grad: grad.astype(acc.dtype))
    else:
        real_split = accumulate.split_microbatches
        monkeypatch.setattr(
            accumulate, "split_microbatches", lambda t, n: jax.tree.map(lambda a: a[:-1], real_split(t, n))
        )
    _, grads = accumulate.accumulated_value_and_grad(_losses, params, TOY, 2)
    _, ref_grads = _reference(params, TOY)
    with pytest.raises(AssertionError):
        assert_close(grads, ref_grads, n=6 * 4, what="grad")


def test_a_microbatch_that_does_not_divide_the_batch_is_one_line_naming_the_valid_sizes():
    with pytest.raises(
        ZooError,
        match=r"train.microbatch_size 3 does not divide train.batch_size 8; valid microbatch sizes: 1, 2, 4, 8",
    ):
        recipes.parse_recipe({"train": {"batch_size": 8, "microbatch_size": 3}})
    with pytest.raises(ZooError, match=r"got 0; valid microbatch sizes: 1, 2, 4, 8"):
        recipes.parse_recipe({"train": {"batch_size": 8, "microbatch_size": 0}})
    with pytest.raises(ValueError, match="valid microbatch sizes: 1, 2, 3, 6"):
        accumulate.accumulated_value_and_grad(_losses, {"w": jnp.ones(4)}, TOY, 4)


def test_under_dp_the_train_microbatch_is_refused_naming_dp_microbatch_size():
    with pytest.raises(ZooError, match="under DP set dp.microbatch_size"):
        recipes.parse_recipe(
            {
                "train": {"batch_size": 8, "microbatch_size": 4},
                "dp": {"enabled": True, "noise_multiplier": 1.0},
            }
        )
