"""DP mechanisms are tables: a clipping method registered by name is seen by the engine, the
recipe validation and ``zoo bench dp`` with nothing else to edit; unregistered, it is gone
from all of them."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zoo
from tests.numerics import assert_close
from zoo import dp, recipes
from zoo.bench import dp_rows
from zoo.commands import settings
from zoo.dp.plan import fixed_batch_plan
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.models import canonical, registry
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.start import config_start

TOY = "toy-half"


def _half_clip(model, trainable, frozen, batch, request):
    """vmap clipping at half the clip norm: a method whose result tells it ran."""
    half = dataclasses.replace(request, clip_norm=request.clip_norm / 2)
    return dp.clipped_grad_sum(
        model.example_loss, trainable, batch["x"], batch["y"], request=half, frozen=frozen
    )


@pytest.fixture
def toy_method():
    method = dp.ClippingMethod(TOY, "vmap at half the clip norm", _half_clip)
    dp.register_clipping(method)
    try:
        yield method
    finally:
        dp.unregister_clipping(TOY)


def _engine(clipping: str):
    cfg = registry.get_kind("mlp").small
    params = canonical.init_params(cfg, 0)
    freeze = resolve_freeze(params, ())
    plan = fixed_batch_plan(8, noise_multiplier=1.0, clip_norm=1.0, clipping=clipping)
    engine = make_engine(
        config_start(cfg, params, freeze=freeze), GradientSettings("nnx", optax.sgd(0.1)), dp=plan
    )
    return engine, params


@pytest.mark.numerics
def test_the_engine_clips_with_a_registered_method(toy_method):
    engine, params = _engine(TOY)
    state, frozen = engine.init_state(params, 0)
    x = zoo.example_batch(engine.cfg, 8)
    batch = {"x": x, "y": zoo.example_labels(engine.cfg, x), "mask": jnp.ones((8,))}
    grad_sum, norms, _ = jax.jit(engine.clipped_sum)(state, frozen, batch)

    def one_example(trainable, frozen, xi, yi):
        return engine.example_losses(trainable, frozen, xi[None], yi[None])[0][0]

    def reference(trainable, frozen):
        return dp.clipped_grad_sum(
            one_example, trainable, x, batch["y"], request=dp.ClipRequest(0.5), frozen=frozen
        )[:2]

    want, want_norms = jax.jit(reference)(state.params, frozen)
    assert_close(grad_sum, want, n=8, what="toy clipped sum")
    assert_close(norms, want_norms, n=8, what="pre-clip norms")
    assert float(norms.max()) > 0.5  # so the toy's clip differs from vmap's at 1.0 here


def test_validation_warnings_and_the_bench_read_the_table(toy_method):
    recipe = recipes.load_recipe("digits-mlp-dp")
    toy = settings.with_values(recipe, {"dp.clipping": TOY})
    assert toy.dp.clipping == TOY
    assert TOY in str(pytest.raises(ZooError, settings.with_values, recipe, {"dp.clipping": "nope"}).value)
    assert f"zoo {TOY}" in dp_rows.methods()
    assert f"zoo {TOY}" in dp_rows.default_methods()


def test_under_users_only_the_methods_that_clip_users_are_taken(toy_method):
    """Both built-in methods clip a user's mean gradient as one (zoo.dp.users, and
    zoo.dp.ghost.units); a method that does not is refused, naming those that do."""
    recipe = recipes.load_recipe("digits-mlp-dp")
    users = {"data.dataset": "csv:/nonexistent/users.csv", "data.user_column": "user", "dp.unit": "user"}
    for name in ("vmap", "ghost"):
        assert settings.with_values(recipe, {**users, "dp.clipping": name}).dp.clipping == name
    with pytest.raises(
        ZooError, match=rf"dp.clipping = '{TOY}' under dp.unit = 'user'.*: vmap, ghost \(or dp.sampler = els"
    ):
        settings.with_values(recipe, {**users, "dp.clipping": TOY})


def test_an_unregistered_method_is_gone_everywhere(toy_method):
    dp.unregister_clipping(TOY)
    try:
        with pytest.raises(ZooError, match=rf"unknown clipping '{TOY}'.*Valid: ghost, vmap\."):
            settings.with_values(recipes.load_recipe("digits-mlp-dp"), {"dp.clipping": TOY})
        assert f"zoo {TOY}" not in dp_rows.methods()
        engine, params = _engine(TOY)
        state, frozen = engine.init_state(params, 0)
        x = zoo.example_batch(engine.cfg, 2)
        batch = {"x": x, "y": zoo.example_labels(engine.cfg, x), "mask": np.ones((2,))}
        with pytest.raises(ZooError, match="unknown clipping"):
            engine.clipped_sum(state, frozen, batch)
    finally:
        dp.register_clipping(toy_method)  # the fixture unregisters it


def test_the_built_in_rows():
    assert dp.clipping_names()[:2] == ["vmap", "ghost"]
    assert list(dp.SAMPLERS) == ["poisson", "els"]
    with pytest.raises(ValueError, match="already registered"):
        dp.register_clipping(dp.clipping_method("vmap"))
