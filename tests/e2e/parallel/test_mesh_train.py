"""Training on 8 devices equals training on one: every registered kind on data, fsdp and
data x fsdp x tensor meshes, both backends, remat and offload, frozen layers and DP-SGD."""

import functools

import jax
import pytest

import zoo
from tests.conftest import reduction_size
from tests.e2e.parallel.meshrun import BATCH, train_steps
from tests.numerics import assert_bitwise_equal, assert_close, assert_close_bf16
from zoo.dp.plan import fixed_batch_plan
from zoo.models import registry

KINDS = {kind.name: kind.small for kind in registry.kinds()}
MESH3 = "data=2,fsdp=2,tensor=2"
# Each kind on the mesh that needs its rules most; the transformer on fsdp and on all three
# axes. Pure data parallelism: the DP test (mlp, data=8) and two processes (test_mesh_cli.py).
CASES = [("transformer", "fsdp=8"), ("transformer", MESH3), ("mlp", "fsdp=8")]


@functools.cache
def one_device(kind: str, freeze: tuple = (), dp=None):
    """The reference: the same steps on one device (NNX, no remat)."""
    return train_steps(KINDS[kind], "data=1", freeze=freeze, dp=dp)


def assert_same_run(run, ref, cfg, what):
    n = reduction_size(cfg, BATCH)
    assert_close(run["losses"], ref["losses"], n=n, what=f"{what} losses")
    assert_close(run["params"], ref["params"], n=n, what=f"{what} params")
    assert run["compiles"] == 1, f"{what}: the step compiled {run['compiles']} times"


@pytest.mark.numerics
@pytest.mark.parametrize(("kind", "mesh"), CASES)
def test_a_mesh_trains_like_one_device(kind, mesh):
    run = train_steps(KINDS[kind], mesh)
    assert_same_run(run, one_device(kind), KINDS[kind], f"{kind} on {mesh}")
    layout = run["engine"].layout
    placed = jax.tree_util.tree_map(lambda a: a.sharding, run["state"].params)
    assert placed == layout.params(run["state"].params)  # the step hands back the layout it got


@pytest.mark.numerics
def test_eqx_llama_with_offload_on_a_mesh():
    run = train_steps(KINDS["llama"], MESH3, backend="eqx", remat="offload-minimal")
    assert_same_run(
        run, one_device("llama"), KINDS["llama"], "eqx llama, offload-minimal, on data x fsdp x tensor"
    )


@pytest.mark.numerics
def test_frozen_layers_shard_get_no_state_and_stay_bitwise():
    freeze = ("embed", "blocks[0:1]")
    run = train_steps(KINDS["llama"], "fsdp=8", freeze=freeze, remat="full")
    ref = one_device("llama", freeze=freeze)
    assert_same_run(run, ref, KINDS["llama"], "frozen llama on fsdp=8, remat full")
    engine = run["engine"]
    assert "embed" not in run["state"].params  # no gradient, no optimizer state
    assert run["frozen"]["embed"]["w"].sharding == engine.layout.params(run["frozen"])["embed"]["w"]
    assert not run["frozen"]["embed"]["w"].sharding.is_fully_replicated
    initial = train_steps(KINDS["llama"], "data=1", steps=0, freeze=freeze)["params"]
    assert_bitwise_equal(run["params"]["embed"], initial["embed"])
    assert_bitwise_equal(
        jax.tree_util.tree_map(lambda a: a[:1], run["params"]["blocks"]),
        jax.tree_util.tree_map(lambda a: a[:1], initial["blocks"]),
    )


@pytest.mark.numerics
@pytest.mark.parametrize(
    ("kind", "mesh", "clipping", "prng"),
    [("mlp", "data=8", "vmap", "philox4x32"), ("transformer", MESH3, "ghost", "threefry2x32")],
)
def test_dp_sgd_on_a_mesh_gives_the_one_device_params(kind, mesh, clipping, prng):
    # Noise from the same key stream as on one device: a mesh run without it, or with noise of
    # its own, would miss the one-device params by the noise's size (~lr), not by rounding.
    dp = fixed_batch_plan(BATCH, noise_multiplier=1.0, clip_norm=1.0, clipping=clipping, noise_prng=prng)
    run = train_steps(KINDS[kind], mesh, dp=dp)
    assert_same_run(run, one_device(kind, dp=dp), KINDS[kind], f"DP {clipping} on {mesh}")


@pytest.mark.numerics
def test_bf16_dp_with_a_frozen_layer_on_a_mesh_trains_like_float32_on_one_device():
    """The precision policy on data x fsdp x tensor, with ghost DP-SGD and a frozen token table:
    the frozen leaf is held in bf16 and sharded, the step compiles once, and losses and params
    agree with float32 on one device under the bf16 rule (tests/numerics.py)."""
    dp = fixed_batch_plan(
        BATCH, noise_multiplier=1.0, clip_norm=1.0, clipping="ghost", noise_prng="threefry2x32"
    )
    freeze, cfg = ("embed",), KINDS["transformer"]
    run = train_steps(cfg, MESH3, freeze=freeze, dp=dp, precision="bfloat16")
    ref = one_device("transformer", freeze=freeze, dp=dp)
    n = reduction_size(cfg, BATCH)
    assert_close_bf16(run["losses"], ref["losses"], n=n, what="bf16 losses")
    assert_close_bf16(run["params"], ref["params"], n=n, what="bf16 params")
    assert run["compiles"] == 1
    embed = run["frozen"]["embed"]["w"]
    assert str(embed.dtype) == "bfloat16" and not embed.sharding.is_fully_replicated
    assert {str(a.dtype) for a in jax.tree_util.tree_leaves(run["state"].params)} == {"float32"}


@pytest.mark.parametrize("name", ["transformer-s", "llama-s"])
def test_fsdp_holds_an_eighth_of_params_and_optimizer_state(name):
    from tests.e2e.parallel.meshrun import engine_for

    cfg = zoo.get_config(name)
    totals = {}
    for mesh in ["data=1", "fsdp=8"]:
        engine, params = engine_for(cfg, mesh)
        state, _ = engine.init_state(params, seed=0)
        first = jax.devices()[0]  # on both meshes
        totals[mesh] = sum(
            shard.data.nbytes
            for leaf in jax.tree.leaves((state.params, state.opt_state))
            for shard in leaf.addressable_shards
            if shard.device == first
        )
    assert totals["fsdp=8"] <= totals["data=1"] / 8 * 1.05, totals


@pytest.mark.parametrize("name", ["transformer-s", "llama-s"])
def test_tensor_parallel_halves_a_blocks_temp(name):
    """Attention scores and MLP hidden split over tensor=2: the block's compiled temp per
    device is at most 0.6 of one device's (B=16, T=128, forward and backward of one layer)."""
    from zoo.bench.scale import block_temp
    from zoo.parallel import layout_for, parse_mesh

    cfg = zoo.get_config(name)
    temps = {
        mesh: block_temp(cfg, "nnx", layout_for(cfg, parse_mesh(mesh), jax.devices()[:devices]), 16, 128)
        for mesh, devices in [("data=1", 1), ("tensor=2", 2)]
    }
    assert temps["tensor=2"] <= 0.6 * temps["data=1"], temps
