"""zoo.parallel.placement: a step whose optimizer state (and float32 params) live in host memory
equals the on-device step, and leaves them in host memory; the four placements are the only ones
that can be written, and the old spelling (train.offload x train.update_on, --offload and
--update-on) still reads as them, with one line naming the new one. Each check has its planted
bug. (The update on the host: tests/parallel/test_host_step.py.)"""

import collections
import dataclasses
import json
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import export

import zoo
from tests.conftest import labels_for, random_params, reduction_size
from tests.e2e.clikit import refused
from tests.numerics import assert_close
from zoo import recipes
from zoo.configs import STATE_PLACEMENTS
from zoo.dp.plan import fixed_batch_plan
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.models import registry
from zoo.parallel import placement as placements
from zoo.parallel.placement import PLACEMENTS, Placement, placement_named
from zoo.train.engine import Engine, GradientSettings, make_engine
from zoo.train.start import config_start

LLAMA = zoo.get_config(registry.get_kind("llama").small, num_layers=2)
STEPS, ROWS = 3, 4
ADAMW = GradientSettings("nnx", optax.adamw(1e-2))
IN_PROGRAM = ["device", "offload-optimizer", "offload-optimizer+params"]  # one jitted step each
OFFLOADED = IN_PROGRAM[1:]


def batch_of(step: int) -> dict:
    x = zoo.example_batch(LLAMA, ROWS, seed=step, seq_len=8)
    return {"x": x, "y": labels_for(LLAMA, x), "mask": jnp.ones((ROWS,), jnp.float32)}


def train(setting: str, engine_cls=Engine, dp=False, freeze=("blocks.mlp_norm",)):
    """``STEPS`` AdamW steps of a small Llama on placement ``setting`` (a frozen leaf too;
    DP-SGD with ``dp``, its noise from the state's key): the final state, and the memory kind
    of every state leaf after each step."""
    params = random_params(LLAMA, 1)
    plan = resolve_freeze(params, freeze)
    dp_plan = fixed_batch_plan(ROWS, noise_multiplier=1.0, clip_norm=1.0) if dp else None
    start = config_start(LLAMA, params, freeze=plan)
    engine = make_engine(start, GradientSettings("nnx", optax.adamw(1e-2)), PLACEMENTS[setting], dp_plan)
    if engine_cls is not Engine:  # a planted bug: the same engine, one method replaced
        engine = engine_cls(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    kinds = [memory_kinds(state)]
    for step in range(STEPS):
        state, _ = engine.train_step(state, frozen, batch_of(step))
        kinds.append(memory_kinds(state))
    assert engine.train_step._cache_size() == 1  # the state came back as it went in
    return state, kinds


def memory_kinds(state) -> dict[str, set[str]]:
    return {
        field.name: {leaf.sharding.memory_kind for leaf in jax.tree.leaves(getattr(state, field.name))}
        for field in dataclasses.fields(state)
    }


def check_offloaded_step(setting: str, engine_cls=Engine, dp=False) -> None:
    expected, _ = train("device", dp=dp)
    actual, kinds = train(setting, engine_cls, dp)
    n = reduction_size(LLAMA, ROWS) * STEPS
    for field in ("params", "opt_state"):
        for a, e in zip(
            jax.tree.leaves(getattr(actual, field)), jax.tree.leaves(getattr(expected, field)), strict=True
        ):
            assert_close(np.asarray(a), np.asarray(e), n=n, what=field)
    check_kinds(kinds, setting)


def check_kinds(kinds: list[dict], setting: str) -> None:
    """Host memory from the start, and after every step, for the fields ``setting`` offloads."""
    host = set(PLACEMENTS[setting].host_fields)
    for after in kinds:
        assert after == {f: {placements.HOST if f in host else placements.DEVICE} for f in after}, after


@pytest.mark.numerics
@pytest.mark.parametrize(
    "setting, dp", [(s, False) for s in OFFLOADED] + [("offload-optimizer+params", True)]
)
def test_an_offloaded_step_equals_the_on_device_step_and_stays_on_the_host(setting, dp):
    check_offloaded_step(setting, dp=dp)


class StaleMoments(Engine):
    """Planted: the moments updated on the device are never written back; the host keeps the old."""

    def apply_grads(self, state, loss, grads):
        new, metrics = super().apply_grads(state, loss, grads)
        return dataclasses.replace(new, opt_state=state.opt_state), metrics


class UpdateTwice(Engine):
    """Planted: the offloaded update is applied again to what the first one wrote."""

    def apply_grads(self, state, loss, grads):
        new, _ = super().apply_grads(state, loss, grads)
        return super().apply_grads(dataclasses.replace(new, step=state.step), loss, grads)


@pytest.mark.parametrize("plant", [StaleMoments, UpdateTwice])
def test_the_offload_check_catches_stale_moments_and_a_double_update(plant):
    with pytest.raises(AssertionError):
        check_offloaded_step("offload-optimizer", plant)


def never_written_back(self, layout, optimizer, state):
    """Planted: the step's new state stays in device memory."""
    return state


STORE = Placement.store


def one_moment_left(self, layout, optimizer, state):
    """Planted: every leaf goes back to host memory but one leaf of the first moment."""
    stored = STORE(self, layout, optimizer, state)
    leaves, tree = jax.tree.flatten(stored.opt_state)
    index = next(i for i, leaf in enumerate(leaves) if leaf.ndim)  # a moment, not the count
    leaves[index] = jax.tree.leaves(state.opt_state)[index]
    return dataclasses.replace(stored, opt_state=jax.tree.unflatten(tree, leaves))


@pytest.mark.parametrize("plant", [never_written_back, one_moment_left])
def test_the_memory_kind_check_catches_a_moment_left_on_the_device(monkeypatch, plant):
    params = random_params(LLAMA, 1)
    engine = make_engine(config_start(LLAMA, params), ADAMW, PLACEMENTS["offload-optimizer"])
    state, frozen = engine.init_state(params, 0)
    check_kinds([memory_kinds(state)], "offload-optimizer")
    monkeypatch.setattr(Placement, "store", plant)
    # Not donated: on the CPU a donated host leaf that comes back in device memory aborts XLA.
    state, _ = jax.jit(engine.train_step_fn)(state, frozen, batch_of(0))
    with pytest.raises(AssertionError):
        check_kinds([memory_kinds(state)], "offload-optimizer")


def test_the_eval_step_reads_offloaded_params():
    params = random_params(LLAMA, 1)
    engines = [make_engine(config_start(LLAMA, params), ADAMW, PLACEMENTS[s]) for s in IN_PROGRAM]
    out = []
    for engine in engines:
        state, frozen = engine.init_state(params, 0)
        out.append(engine.eval_step(state.params, frozen, batch_of(0))["loss_sum"])
    assert len({float(x) for x in out}) == 1


def test_a_bad_offload_is_one_line_naming_the_valid_ones(capsys, tmp_path):
    with pytest.raises(
        ZooError, match="unknown train.offload 'cpu'.*Valid: none, optimizer, optimizer\\+params"
    ):
        recipes.parse_recipe({"train": {"offload": "cpu"}})
    with pytest.raises(ValueError, match="offload-optimizer\\+params"):
        placement_named("all")
    refused(
        capsys,
        ["train", "digits-mlp", "--offload", "host", "--out", str(tmp_path / "r")],
        "'host'",
        "optimizer",
    )


def placements_in_program(setting: str) -> tuple[collections.Counter, object]:
    """The memory placements in the TPU program of ``setting``'s step, lowered here on the CPU
    (``jax.export``): on a CPU, ``device_put`` inside ``jit`` lowers to nothing (JAX lowers it
    only for TPU and GPU), and only the step's arguments and results carry a memory kind."""
    params = random_params(LLAMA, 1)
    engine = make_engine(config_start(LLAMA, params), ADAMW, PLACEMENTS[setting])
    state, frozen = engine.init_state(params, 0)
    text = export.export(engine.train_step, platforms=["tpu"])(state, frozen, batch_of(0)).mlir_module()
    return collections.Counter(re.findall(r'_xla_buffer_placement = "(\w+)"', text)), state


def check_leaf_by_leaf(setting: str) -> None:
    found, state = placements_in_program(setting)
    params, moments = len(jax.tree.leaves(state.params)), len(jax.tree.leaves(state.opt_state))
    if setting == "offload-optimizer":  # each moment fetched and stored on its own
        assert found == {"device": moments, placements.HOST: moments}, found
    else:  # params fetched twice: for the forward pass, and for the update
        assert found == {"device": moments + 2 * params, placements.HOST: moments + params}, found


@pytest.mark.parametrize("setting", OFFLOADED)
def test_the_tpu_program_moves_each_offloaded_leaf_on_its_own(setting):
    check_leaf_by_leaf(setting)
    assert not placements_in_program("device")[0]


def test_the_placement_check_catches_a_state_never_written_back(monkeypatch):
    monkeypatch.setattr(Placement, "store", never_written_back)
    with pytest.raises(AssertionError):
        check_leaf_by_leaf("offload-optimizer")


# -- the four placements, and the old spelling ----------------------------------------------------
OLD_PAIRS = {  # (train.offload, train.update_on) -> the placement; the other two pairs never ran
    ("none", "device"): "device",
    ("optimizer", "device"): "offload-optimizer",
    ("optimizer+params", "device"): "offload-optimizer+params",
    ("optimizer+params", "host"): "update-on-host",
}


def test_only_the_four_placements_can_be_written():
    assert tuple(PLACEMENTS) == STATE_PLACEMENTS
    for (offload, update_on), name in OLD_PAIRS.items():
        assert placements.from_old_spelling("device", offload, update_on) == name
        assert (PLACEMENTS[name].offload, PLACEMENTS[name].update_on) == (offload, update_on)
    for offload in ("none", "optimizer"):
        with pytest.raises(ValueError, match=f"needs train.offload = 'optimizer\\+params', got '{offload}'"):
            placements.from_old_spelling("device", offload, "host")
    with pytest.raises(ZooError, match="unknown train.placement 'host'.*Valid: device, offload-optimizer"):
        recipes.parse_recipe({"train": {"placement": "host"}})


def test_the_old_keys_read_as_their_placement_with_one_line_naming_it():
    for (offload, update_on), name in OLD_PAIRS.items():
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            recipe = recipes.parse_recipe({"train": {"offload": offload, "update_on": update_on}})
        assert recipe.train.placement == name
        lines = [str(w.message) for w in said if issubclass(w.category, FutureWarning)]
        if name == "device":  # what every run saved before the placement wrote: read silently
            assert lines == []
        else:
            assert len(lines) == 1 and f"train.placement = {name!r}" in lines[0], lines
            assert f"--placement {name}" in lines[0] and "train.offload" in lines[0], lines
    # A key not given keeps its part of the placement already set (the recipe's, or --placement's).
    both = {"placement": "offload-optimizer+params", "update_on": "host"}
    with pytest.warns(
        FutureWarning, match="train.update_on = 'host' is spelled train.placement = 'update-on-host'"
    ):
        assert recipes.parse_recipe({"train": both}).train.placement == "update-on-host"


def test_the_old_flags_run_with_one_line_naming_the_new_one(capsys, tmp_path):
    from zoo.cli import main

    argv = ["train", "digits-mlp", "--steps", "1", "--offload", "optimizer", "--json", "--no-progress"]
    assert main([*argv, "--set", "train.eval_batches=1", "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()
    said = [line for line in err.splitlines() if "offload" in line]  # the run's other notices aside
    assert (
        len(said) == 1 and said[0].startswith("warning: ") and "--placement offload-optimizer" in said[0]
    ), err
    summary = json.loads(out.strip().splitlines()[-1])
    assert (summary["placement"], summary["offload"], summary["update_on"]) == (
        "offload-optimizer",
        "optimizer",
        "device",
    )
