"""The stages of a run (zoo.train.stages), each built alone from a recipe, and build_run as
their composition."""

import dataclasses
import warnings

import jax
import numpy as np

from zoo import recipes
from zoo.commands import settings
from zoo.dp.plan import make_plan
from zoo.train import stages
from zoo.train.run import build_run, train_batch
from zoo.train.state import batch_seed, train_key

NOISE_SEED = 7


def pca_recipe(**values):
    """A DP recipe with every stage in play (a DP-PCA projection too), its root key pinned."""
    pca = {"data.dp_pca": 16, "dp.pca_epsilon": 0.5, "dp.noise_seed": NOISE_SEED, "train.steps": 20}
    return settings.with_values(recipes.load_recipe("digits-mlp-dp"), {**pca, **values})


def test_each_stage_builds_alone_and_build_run_composes_them():
    recipe = pca_recipe()
    root = stages.root_key(recipe)
    np.testing.assert_array_equal(root, jax.random.key_data(train_key(NOISE_SEED)))
    task = stages.load_data(recipe)
    start = stages.model_start(recipe, task)
    assert start.cfg.input_projection is not None and start.freeze.trainable_count > 0
    plan = stages.dp_plan(recipe, task, start, recipe.train.steps, root)
    # The plan is make_plan's, its sampler seeded once, here, from the root key.
    seed = batch_seed(jax.random.key_data(train_key(NOISE_SEED)))
    assert plan == make_plan(
        recipe.dp,
        task.num_train,
        recipe.train.steps,
        start.layout,
        seed=seed,
        microbatch_size=recipe.train.microbatch_size,
    )
    fitted = stages.projection(start, task, plan, root)
    path = start.cfg.input_projection
    leaf = lambda params: np.asarray(params[path[0]][path[1]])  # noqa: E731
    assert not np.array_equal(leaf(fitted.params), leaf(start.params))  # fitted, not the init
    noiseless = stages.projection(start, task, None, None)
    assert not np.array_equal(leaf(fitted.params), leaf(noiseless.params))  # DP-PCA's noise is in
    engine = stages.engine(recipe, fitted, plan, recipe.train.steps)
    run = build_run(recipe, choose_remat=False)
    np.testing.assert_array_equal(run.task.data.x_train, task.data.x_train)
    assert run.cfg == start.cfg and run.dp == plan
    jax.tree.map(np.testing.assert_array_equal, run.params, fitted.params)
    for field in ("cfg", "backend", "stack", "freeze", "precision", "dp"):
        assert getattr(run.engine, field) == getattr(engine, field), field


def _warmup_warnings(recipe, plan_steps: int) -> list[str]:
    start = stages.model_start(recipe, stages.load_data(recipe))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        stages.engine(recipe, start, None, plan_steps)
    return [str(w.message) for w in caught if "optim.warmup_steps" in str(w.message)]


def test_the_warmup_warning_of_an_extended_resume_counts_the_steps_it_trains_to():
    """``--resume --steps 12`` of a run planned for 10 (digits-mlp warms up over 20 steps):
    the warning named the 10 planned steps and a ramp to 50%, and warned on ``--steps 30``,
    whose ramp ends at step 20. The schedule keeps its planned horizon (docs/recipes.md,
    "Resume"); the ramp does not depend on it."""
    extended = settings.with_values(recipes.load_recipe("digits-mlp"), {"train.steps": 12})
    (line,) = _warmup_warnings(extended, plan_steps=10)
    assert "longer than the 12 steps the run trains to" in line, line
    assert "keeps the 10 steps it was planned for" in line and "60% of optim.lr" in line, line
    assert _warmup_warnings(settings.with_values(extended, {"train.steps": 30}), plan_steps=10) == []
    (fresh,) = _warmup_warnings(extended, plan_steps=12)  # a fresh run: no other horizon to name
    assert "longer than the 12 steps the run trains to:" in fresh, fresh


def test_without_dp_there_is_no_root_plan_or_noise():
    recipe = settings.with_values(recipes.load_recipe("digits-mlp"), {"train.steps": 20})
    task = stages.load_data(recipe)
    start = stages.model_start(recipe, task)
    assert stages.root_key(recipe) is None
    assert stages.dp_plan(recipe, task, start, 20, None) is None
    assert stages.projection(start, task, None, None) is start  # no data.dp_pca
    assert build_run(recipe, choose_remat=False).root is None


def test_a_run_built_with_a_root_draws_that_roots_batches():
    """Resume builds the run with its checkpoint's root key: the same batches, and another
    root's are other batches (a fresh secret root each build)."""
    recipe = pca_recipe(**{"dp.noise_seed": None, "data.dp_pca": None, "dp.pca_epsilon": None})
    first = build_run(recipe, choose_remat=False)
    again = build_run(recipe, choose_remat=False, root=first.root)
    fresh = build_run(recipe, choose_remat=False)
    assert again.dp.sampler == first.dp.sampler and fresh.dp.sampler != first.dp.sampler
    np.testing.assert_array_equal(train_batch(again, 3)["x"], train_batch(first, 3)["x"])
    assert dataclasses.replace(fresh.dp.sampler, seed=first.dp.sampler.seed) == first.dp.sampler


def test_many_processes_without_a_mesh_are_refused_in_one_line(monkeypatch):
    """Without --mesh a run is placed on jax.devices()[0], process 0's: another process could
    not read its own metrics. The refusal names the fix before anything loads."""
    import pytest

    from zoo.errors import ZooError

    recipe = recipes.load_recipe("digits-mlp")
    assert stages.start_checkpoint(recipe) is None  # one process: no mesh needed
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ZooError, match=r"over 2 processes needs a mesh .* --mesh auto"):
        stages.start_checkpoint(recipe)
    meshed = settings.with_values(recipe, {"mesh.data": "auto"})
    assert stages.start_checkpoint(meshed) is None


def test_the_engine_stage_makes_the_engine_of_the_recipes_parts():
    """make_engine takes four parts, and the engine stage makes each from the recipe's sections:
    the gradient settings from [model] and [train], the placement from train.placement."""
    import inspect

    from zoo.parallel.placement import PLACEMENTS
    from zoo.train.engine import Engine, make_engine

    assert list(inspect.signature(make_engine).parameters) == ["start", "grad", "placement", "dp"]
    assert [f.name for f in dataclasses.fields(Engine)] == [
        "cfg",
        "freeze",
        "layout",
        "grad",
        "placement",
        "dp",
    ]
    values = {"train.steps": 20, "train.placement": "offload-optimizer", "train.microbatch_size": 16}
    values |= {"train.precision": "bfloat16", "train.remat": "full"}
    run = build_run(settings.with_values(recipes.load_recipe("digits-mlp"), values), choose_remat=False)
    grad = run.engine.grad
    assert (grad.backend, grad.remat, grad.precision.name, grad.microbatch_size) == (
        "nnx",
        "full",
        "bfloat16",
        16,
    )
    assert run.engine.placement is PLACEMENTS["offload-optimizer"] and run.engine.dp is None
    assert run.engine.stack == run.freeze.stack_plan("full")
