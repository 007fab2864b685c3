"""Every registered remat policy gives the same loss and gradients as no remat, on every
registered model kind (its small config, four layers deep) in both backends."""

import jax
import jax.numpy as jnp
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_close
from zoo import remat
from zoo.errors import ZooError
from zoo.models import registry

# The tests that compare floats from two programs carry the `numerics` marker (not the name
# checks). (Not one xdist group: the cells are most of make test-isa, and that set needs both
# workers more than one reference fixture.)

CUSTOM = "custom:attn_q=device,layer_input=offload,mlp_hidden=remat,mlp_out=device"
MODELS = {kind.name: zoo.get_config(kind.small, num_layers=4) for kind in registry.kinds()}


@pytest.fixture(scope="session")  # built at most once per xdist worker
def reference():
    out = {}
    for kind, cfg in MODELS.items():
        params = random_params(cfg, 1)
        x = zoo.example_batch(cfg, 3, seed=2, seq_len=8 if cfg.max_len else None)
        y = labels_for(cfg, x)
        out[kind] = cfg, params, x, y, fast_jit(jax.value_and_grad(loss_of(cfg, "nnx")))(params, x, y)
    return out


# Every policy on every kind in NNX. In Equinox, the policies that differ in mechanism: what a
# policy does is applied by zoo.scan to the layer function the same way for both backends, so
# what an Equinox cell adds is the backend's numerics (held to NNX's by the parity tests) and
# its names (checked for every preset in both backends, inside remat bodies too).
EQX_POLICIES = ("full", "save-attn", "nested", "offload-minimal", CUSTOM)
# At L=4 `recursive` is one level of 4, i.e. `full`; the deeper test below covers it.
CELLS = [
    *((p, "nnx") for p in [*remat.policy_names(), CUSTOM] if p != "recursive"),
    *((p, "eqx") for p in EQX_POLICIES),
]


@pytest.mark.numerics
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("policy,backend", CELLS)
def test_policy_matches_no_remat(reference, kind, backend, policy):
    cfg, params, x, y, (loss0, grads0) = reference[kind]
    loss, grads = fast_jit(jax.value_and_grad(loss_of(cfg, backend, policy)))(params, x, y)
    assert_close((loss, grads), (loss0, grads0), n=reduction_size(cfg, 3))


@pytest.mark.numerics
@pytest.mark.parametrize("depth", [12])  # 4 x 3: two levels, one of them not a power of 2
def test_recursive_policy_matches_no_remat_on_deeper_stacks(depth):
    cfg = zoo.get_config(registry.get_kind("llama").small, num_layers=depth)
    params = random_params(cfg, 1)
    x = zoo.example_batch(cfg, 2, seed=2, seq_len=8)
    y = labels_for(cfg, x)
    loss0, grads0 = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx")))(params, x, y)
    loss, grads = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "recursive")))(params, x, y)
    assert_close((loss, grads), (loss0, grads0), n=reduction_size(cfg, 2))


@pytest.mark.numerics
def test_the_float_rule_still_catches_a_replay_bug(reference):
    """Negative test for this family: a replay that reads another layer's weights (two layers
    swapped inside the stack) gives gradients that fail the comparison above."""
    cfg, params, x, y, (loss0, grads0) = reference["transformer"]
    step = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "full")))

    def swap(t):
        return {**t, "blocks": jax.tree.map(lambda a: a[jnp.array([1, 0, 2, 3])], t["blocks"])}

    loss, grads = step(swap(params), x, y)
    with pytest.raises(AssertionError):
        assert_close((loss, swap(grads)), (loss0, grads0), n=reduction_size(cfg, 3))


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ZooError, match=r"'ful'.*Did you mean 'full'.*Valid:.*minimal"):
        remat.get_policy("ful")


@pytest.mark.parametrize(
    "spec,match",
    [
        ("custom:", "empty"),
        ("custom:attn_q", "NAME=device"),
        ("custom:atn_q=device", "Did you mean 'attn_q'"),
        ("custom:attn_q=disk", "'disk'.*Valid: device, offload, remat"),
        ("custom:attn_q=device,attn_q=remat", "twice"),
    ],
)
def test_bad_custom_specs(spec, match):
    with pytest.raises(ZooError, match=match):
        remat.get_policy(spec)
