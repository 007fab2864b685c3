"""zoo.parallel.offload: a step whose optimizer state (and float32 params) live in host memory
equals the on-device step, and leaves them in host memory. Each check has its planted bug."""

import collections
import dataclasses
import re

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
from zoo.configs import OFFLOADS, TrainConfig
from zoo.dp.plan import fixed_batch_plan
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.models import registry
from zoo.parallel import offload
from zoo.train.engine import Engine, make_engine

LLAMA = zoo.get_config(registry.get_kind("llama").small, num_layers=2)
STEPS, ROWS = 3, 4
OFFLOADED = [s for s in OFFLOADS if s != "none"]


def batch_of(step: int) -> dict:
    x = zoo.example_batch(LLAMA, ROWS, seed=step, seq_len=8)
    return {"x": x, "y": labels_for(LLAMA, x), "mask": jnp.ones((ROWS,), jnp.float32)}


def train(setting: str, engine_cls=Engine, dp=False, freeze=("blocks.mlp_norm",)):
    """``STEPS`` AdamW steps of a small Llama with ``setting``'s offload (a frozen leaf too;
    DP-SGD with ``dp``, its noise from the state's key): the final state, and the memory kind
    of every state leaf after each step."""
    params = random_params(LLAMA, 1)
    plan = resolve_freeze(params, freeze)
    dp_plan = fixed_batch_plan(ROWS, noise_multiplier=1.0, clip_norm=1.0) if dp else None
    engine = make_engine(LLAMA, "nnx", plan, optax.adamw(1e-2), dp=dp_plan, offload=setting)
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
    expected, _ = train("none", dp=dp)
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
    host = set(offload.host_fields(setting))
    for after in kinds:
        assert after == {f: {offload.HOST if f in host else offload.DEVICE} for f in after}, after


@pytest.mark.numerics
@pytest.mark.parametrize("setting, dp", [(s, False) for s in OFFLOADED] + [("optimizer+params", True)])
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
        check_offloaded_step("optimizer", plant)


def test_the_memory_kind_check_catches_a_state_never_written_back(monkeypatch):
    monkeypatch.setattr(offload, "store", lambda layout, state, optimizer, setting: state)
    params = random_params(LLAMA, 1)
    engine = make_engine(
        LLAMA, "nnx", resolve_freeze(params, ()), optax.adamw(1e-2), offload="optimizer+params"
    )
    state, frozen = engine.init_state(params, 0)
    check_kinds([memory_kinds(state)], "optimizer+params")
    # Not donated: on the CPU a donated host leaf that comes back in device memory aborts XLA.
    state, _ = jax.jit(engine.train_step_fn)(state, frozen, batch_of(0))
    with pytest.raises(AssertionError):
        check_kinds([memory_kinds(state)], "optimizer+params")


def test_the_eval_step_reads_offloaded_params():
    params = random_params(LLAMA, 1)
    engines = [
        make_engine(LLAMA, "nnx", resolve_freeze(params, ()), optax.adamw(1e-2), offload=s) for s in OFFLOADS
    ]
    out = []
    for engine in engines:
        state, frozen = engine.init_state(params, 0)
        out.append(engine.eval_step(state.params, frozen, batch_of(0))["loss_sum"])
    assert len({float(x) for x in out}) == 1


def test_a_bad_offload_is_one_line_naming_the_valid_ones(capsys, tmp_path):
    with pytest.raises(
        ZooError, match="unknown train.offload 'cpu'.*Valid: none, optimizer, optimizer\\+params"
    ):
        TrainConfig(offload="cpu")
    with pytest.raises(ValueError, match="optimizer\\+params"):
        make_engine(LLAMA, "nnx", resolve_freeze(random_params(LLAMA), ()), optax.sgd(1.0), offload="all")
    refused(
        capsys,
        ["train", "digits-mlp", "--offload", "host", "--out", str(tmp_path / "r")],
        "'host'",
        "optimizer",
    )


def placements(setting: str) -> tuple[collections.Counter, object]:
    """The memory placements in the TPU program of ``setting``'s step, lowered here on the CPU
    (``jax.export``): on a CPU, ``device_put`` inside ``jit`` lowers to nothing (JAX lowers it
    only for TPU and GPU), and only the step's arguments and results carry a memory kind."""
    params = random_params(LLAMA, 1)
    engine = make_engine(LLAMA, "nnx", resolve_freeze(params, ()), optax.adamw(1e-2), offload=setting)
    state, frozen = engine.init_state(params, 0)
    text = export.export(engine.train_step, platforms=["tpu"])(state, frozen, batch_of(0)).mlir_module()
    return collections.Counter(re.findall(r'_xla_buffer_placement = "(\w+)"', text)), state


def check_leaf_by_leaf(setting: str) -> None:
    found, state = placements(setting)
    params, moments = len(jax.tree.leaves(state.params)), len(jax.tree.leaves(state.opt_state))
    if setting == "optimizer":  # each moment fetched and stored on its own
        assert found == {"device": moments, offload.HOST: moments}, found
    else:  # params fetched twice: for the forward pass, and for the update
        assert found == {"device": moments + 2 * params, offload.HOST: moments + params}, found


@pytest.mark.parametrize("setting", OFFLOADED)
def test_the_tpu_program_moves_each_offloaded_leaf_on_its_own(setting):
    check_leaf_by_leaf(setting)
    assert not placements("none")[0]


def test_the_placement_check_catches_a_state_never_written_back(monkeypatch):
    monkeypatch.setattr(offload, "store", lambda layout, state, optimizer, setting: state)
    with pytest.raises(AssertionError):
        check_leaf_by_leaf("optimizer")
