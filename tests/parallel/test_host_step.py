"""zoo.parallel.host_step (placement = "update-on-host"): a step whose optimizer update runs on
the host, beside the float32 params and moments, equals the one-program step on the device, and
keeps the state on the host. Each check has its planted bug."""

import dataclasses
import weakref

import jax
import numpy as np
import optax
import pytest

from tests.conftest import random_params, reduction_size
from tests.e2e.clikit import refused
from tests.numerics import assert_close
from tests.parallel.test_placement import LLAMA, ROWS, STEPS, batch_of
from zoo import recipes
from zoo.dp.plan import fixed_batch_plan
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.parallel import host_step, layout_for
from zoo.parallel import placement as placements
from zoo.parallel.host_step import HostStep, SerialHostStep
from zoo.parallel.mesh import MeshSpec
from zoo.parallel.placement import PLACEMENTS, placement_named
from zoo.precision import Precision
from zoo.train.engine import GradientSettings, evaluate, make_engine
from zoo.train.hardest import hardest
from zoo.train.start import config_start

ON_HOST = PLACEMENTS["update-on-host"]


def train(update_on: str, dp=False, precision="float32", plant=None, microbatch_size=None):
    """``STEPS`` AdamW steps of a small Llama (a frozen leaf too; DP-SGD with ``dp``), the
    update on ``update_on``: the final state, the devices of its leaves after each step, the
    losses, and the engine. ``plant`` wraps the host step's update of a leaf (a planted bug)."""
    params = random_params(LLAMA, 1)
    plan = resolve_freeze(params, ("blocks.mlp_norm",))
    dp_plan = fixed_batch_plan(ROWS, noise_multiplier=1.0, clip_norm=1.0) if dp else None
    grad = GradientSettings(
        "nnx", optax.adamw(1e-2), precision=Precision(precision), microbatch_size=microbatch_size
    )
    placement = ON_HOST if update_on == "host" else PLACEMENTS["device"]
    engine = make_engine(config_start(LLAMA, params, freeze=plan), grad, placement, dp_plan)
    # The pipeline itself (zoo train takes the whole-tree SerialHostStep, equal to it bit for bit:
    # test_host_pipeline.py).
    step = HostStep(engine) if update_on == "host" else engine.train_step
    if plant is not None:
        compile_leaf = step.leaf_updates().compile
        step.leaf_updates().compile = lambda *a: plant(compile_leaf(*a))
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    where, losses, compiles = [devices_of(state)], [], []
    for i in range(STEPS):
        state, metrics = step(state, frozen, batch_of(i))
        where.append(devices_of(state))
        losses.append(float(metrics["loss"]))
        compiles.append(getattr(step, "cache_sizes", dict)())
    return state, where, losses, engine, compiles


def devices_of(state) -> set:
    return {leaf.devices().pop() for leaf in jax.tree.leaves(state)}


def check_host_step(dp=False, precision="float32", plant=None, microbatch_size=None) -> None:
    expected, _, expected_losses, _, _ = train("device", dp, precision, microbatch_size=microbatch_size)
    actual, where, losses, engine, compiles = train("host", dp, precision, plant, microbatch_size)
    n = reduction_size(LLAMA, ROWS) * STEPS
    assert_close(np.array(losses), np.array(expected_losses), n=n, what="losses")
    for field in ("params", "opt_state", "step"):
        for a, e in zip(
            jax.tree.leaves(getattr(actual, field)), jax.tree.leaves(getattr(expected, field)), strict=True
        ):
            assert_close(np.asarray(a), np.asarray(e), n=n, what=field)
    host = placements.host_device(engine.layout)
    assert all(after == {host} for after in where), where  # the state never leaves the host
    if len(jax.devices("cpu")) > 1:  # two devices (tests/e2e/parallel): the host is not the compute one
        assert host != placements.compute_device(engine.layout), host
    # Every step's arguments came back alike: the gradient compiled once, and the host's
    # programs once per leaf shape, at the first step (the later steps compiled nothing).
    assert compiles[0] == compiles[-1] and compiles[0]["grads"] == 1, compiles


@pytest.mark.numerics
@pytest.mark.parametrize(
    "dp, precision, microbatch_size",
    [(False, "float32", None), (False, "bfloat16", 2), (True, "bfloat16", None)],
)
def test_the_host_update_equals_the_device_step_and_keeps_the_state_on_the_host(
    dp, precision, microbatch_size
):
    check_host_step(dp, precision, microbatch_size=microbatch_size)


@pytest.mark.parametrize("delay", [0, 1])
def test_a_leaf_is_cut_under_its_budget_after_the_step_let_go_of_the_params_behind(delay, monkeypatch):
    """The device holds the gradient and the in-flight leaves' pieces, not two gradients: each
    leaf's gradient is cut into its pieces in its own task, while it holds its bytes of the
    budget. And the exact step has let go of the params it computed at (every reference:
    ``_ahead`` and its locals) by then, so the new params go up beside the gradient only."""
    params = random_params(LLAMA, 1)
    engine = make_engine(config_start(LLAMA, params), GradientSettings("nnx", optax.adamw(1e-2)), ON_HOST)
    step = HostStep(engine, update_delay=delay, chunk_bytes=1000)  # most leaves in 2+ pieces
    behind, seen = [], []  # weak references to the device params a call computes at
    cut = host_step.pieces

    def recorded(x, edges):
        seen[-1].append((step.budget.held, step._ahead is None, [r() is None for r in behind]))
        return cut(x, edges)

    monkeypatch.setattr(host_step, "pieces", recorded)
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    for i in range(3):
        seen.append([])
        state, _ = step(state, frozen, batch_of(i))
        behind = [weakref.ref(a) for a in step._ahead]
    leaves = len(jax.tree.leaves(state.params))
    assert [len(calls) for calls in seen] == [leaves] * 3, seen  # one cut a leaf a call
    assert all(held > 0 for calls in seen for held, _, _ in calls), seen
    if not delay:
        assert all(let_go and all(dead) for calls in seen[1:] for _, let_go, dead in calls), seen


def stale_moments(program):
    """Planted: the moments the host computes for a leaf are dropped; the old ones stay."""

    def planted(p, moments, shared, norm, grads):
        old = tuple(m.copy() for m in moments)
        new, _, s, up, twin = program(p, moments, shared, norm, grads)
        return new, old, s, up, twin

    return planted


def update_twice(program):
    """Planted: a leaf's update is applied again to what the first one wrote."""

    def planted(p, moments, shared, norm, grads):
        new, m, _, _, _ = program(p, moments, shared, norm, grads)
        return program(new, m, shared, norm, grads)

    return planted


@pytest.mark.parametrize("plant", [stale_moments, update_twice])
def test_the_host_update_check_catches_stale_moments_and_a_double_update(plant):
    with pytest.raises(AssertionError):
        check_host_step(plant=plant)


def read_only_passes(precision: str = "float32") -> list[tuple]:
    """For the update on the device and on the host, with a frozen leaf: the eval loss and
    ``zoo eval --hardest``'s rows, which read the trainable params beside the frozen ones."""
    params = random_params(LLAMA, 1)
    seen = []
    for placement in ("device", "update-on-host"):
        start = config_start(LLAMA, params, patterns=("blocks.mlp_norm",))
        grad = GradientSettings("nnx", optax.adamw(1e-2), precision=Precision(precision))
        engine = make_engine(start, grad, PLACEMENTS[placement])
        state, frozen = engine.init_state(params, 0)
        batch = engine.place_batch(batch_of(0))
        seen.append(
            (
                evaluate(engine, state, frozen, [batch])["eval_loss"],
                hardest(engine, state, frozen, [batch], 2),
            )
        )
    return seen


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_the_read_only_passes_read_the_host_params(precision):
    """The eval step and --hardest see the masters' values (bf16: the compute-dtype copy the
    model casts them to anyway)."""
    device, host = read_only_passes(precision)
    assert device == host


def test_a_bad_update_on_is_one_line_naming_the_valid_ones(capsys, tmp_path):
    with pytest.raises(ZooError, match="unknown train.update_on 'cpu'.*Valid: device, host"):
        recipes.parse_recipe({"train": {"update_on": "cpu"}})
    with pytest.raises(ZooError, match="needs train.offload = 'optimizer\\+params', got 'optimizer'"):
        recipes.parse_recipe({"train": {"update_on": "host", "offload": "optimizer"}})
    with pytest.raises(ZooError, match="--remat auto"):
        recipes.parse_recipe({"train": {"placement": "update-on-host", "remat": "auto"}})
    with pytest.raises(ValueError, match="is not one of device, "):
        placement_named("cpu")
    refused(
        capsys,
        ["train", "digits-mlp", "--update-on", "host", "--out", str(tmp_path / "r")],
        "optimizer+params",
        "'none'",
    )
    argv = ["train", "digits-mlp", "--placement", "update-on-host", "--mesh", "fsdp=2"]
    refused(capsys, [*argv, "--out", str(tmp_path / "m")], "runs on one device", "fsdp=2")


def test_a_mesh_is_refused_in_one_line():
    layout = layout_for(LLAMA, MeshSpec(data=1))
    assert layout.is_single  # one device: accepted
    ON_HOST.check(layout=layout)
    many = dataclasses.replace(layout, spec=MeshSpec(data=2))
    with pytest.raises(ValueError, match="runs on one device; this layout has"):
        ON_HOST.check(layout=many)


def test_the_run_takes_the_whole_tree_step():
    """The placement's step is the serial one: the pipeline ran a chip machine's host memory out
    and is the bench's (zoo.parallel.placement.Placement.step says why)."""
    engine = make_engine(
        config_start(LLAMA, random_params(LLAMA, 1)), GradientSettings("nnx", optax.adamw(1e-2)), ON_HOST
    )
    assert type(engine.train_step) is SerialHostStep
