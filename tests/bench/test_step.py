"""The remat benches' train step (zoo.bench.step) is the one `zoo train` builds: the same
lowered program as ``build_run``'s engine for the same recipe, under each remat policy,
precision and backend."""

import jax
import pytest

import zoo
from zoo import recipes
from zoo.bench.step import compile_step, program_digest, step_recipe
from zoo.errors import ZooError
from zoo.train.run import build_run, train_batch

BATCH = 4


def zoo_train_program(
    remat: str, precision: str = "float32", backend: str = "nnx", offload: str = "none", **model
) -> str:
    """The digest of the step ``zoo train`` runs for mlp-s (``model`` overrides) on digits:
    ``build_run``'s engine lowered on the run's first batch."""
    recipe = recipes.parse_recipe(
        {
            "model": {"preset": "mlp-s", "backend": backend, **model},
            "train": {"remat": remat, "precision": precision, "batch_size": BATCH, "offload": offload},
        }
    )
    run = build_run(recipe, choose_remat=False)
    state, frozen = run.engine.init_state(run.params, 0)
    return program_digest(run.engine.train_step.lower(state, frozen, train_batch(run, 0)))


def bench_program(remat: str, precision: str = "float32", backend: str = "nnx", **model) -> str:
    cfg = zoo.get_config("mlp-s", **model)
    x = zoo.example_batch(cfg, BATCH)
    return compile_step(
        cfg, x, zoo.example_labels(cfg, x), backend=backend, remat=remat, precision=precision
    ).program


@pytest.mark.parametrize(
    "remat, precision, backend",
    [
        ("none", "float32", "nnx"),
        ("full", "float32", "nnx"),
        ("full", "bfloat16", "nnx"),
        ("minimal", "float32", "eqx"),
    ],
)
def test_the_bench_step_is_the_one_zoo_train_runs(remat, precision, backend):
    assert bench_program(remat, precision, backend, num_layers=3) == zoo_train_program(
        remat, precision, backend, num_layers=3
    )


def test_the_digest_tells_steps_apart():
    """What the test above relies on: a different policy or precision is a different program
    (mlp-s at 3 layers: a scanned stack for the policy to act on)."""
    digests = {
        bench_program(r, p, num_layers=3)
        for r, p in [("none", "float32"), ("full", "float32"), ("full", "bfloat16")]
    }
    assert len(digests) == 3


def test_a_bad_setting_is_refused_as_zoo_train_refuses_it():
    with pytest.raises(ZooError, match="train.precision"):
        step_recipe(precision="float16")
    with pytest.raises(ZooError, match="backend"):
        step_recipe(backend="torch")


@pytest.mark.parametrize("offload", ["optimizer", "optimizer+params"])
def test_the_bench_step_from_shapes_keeps_an_offloaded_state_in_host_memory(offload):
    """Compiled from shapes alone, the bench's step is the one ``zoo train --offload`` runs:
    the offloaded fields' shapes carry host memory, so its memory analysis does not count
    them as device bytes."""
    cfg = zoo.get_config("mlp-s", num_layers=3)
    x = zoo.example_batch(cfg, BATCH)
    base = recipes.parse_recipe({"train": {"offload": offload}})
    step = compile_step(cfg, x, zoo.example_labels(cfg, x), recipe=base)
    kinds = {x.sharding.memory_kind for x in jax.tree.leaves(step.state.opt_state)}
    assert kinds == {"pinned_host"} and step.engine.placement.offload == offload
    assert step.program == zoo_train_program("none", offload=offload, num_layers=3)
