"""Both backends: same names, same logits and gradients from the same canonical weights.

Cases come from the registry: every registered kind (its ``small`` config) and every preset,
so a new kind or preset is tested without touching this file."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo import names
from zoo.commands.models import preset_rows
from zoo.errors import ZooError
from zoo.jaxprs import checkpoint_names, count_eqns
from zoo.models import canonical, registry

KINDS = {kind.name: kind.small for kind in registry.kinds()}
# Every kind's small config, plus variants that exercise other code paths of a kind.
SIZES = [
    *[pytest.param(cfg, {}, id=name) for name, cfg in KINDS.items()],
    pytest.param("mlp-m", {"num_layers": 3}, id="mlp-m-3"),
    pytest.param("mlp-s", {"num_layers": 0, "d_pca": 5}, id="mlp-projected-no-stack"),
    pytest.param(
        "transformer-xs",
        {"num_layers": 3, "d_model": 32, "num_heads": 2, "d_ff": 48, "max_len": 12},
        id="transformer-3-heads-2",
    ),
    pytest.param("transformer-digits", {}, id="transformer-digits"),  # feature rows, pooled head
    pytest.param(
        "llama-xs",
        {"num_layers": 3, "d_model": 32, "num_heads": 4, "num_kv_heads": 1, "d_ff": 48, "max_len": 12},
        id="llama-3-one-kv-head",
    ),
]
# A kind's names do not depend on its width: a preset too big to hold random weights for in a
# test (llama-1b's 1.2 B parameters) is traced through its kind's smaller presets.
HELD_PRESETS = [
    n for n, c in zoo.PRESETS.items() if sum(map(np.prod, canonical.canonical_shapes(c).values())) < 10**8
]
LOGICAL_AXES = {"layers", "input", "embed", "mlp", "heads", "kv_heads", "vocab", "positions", "classes"}


@pytest.mark.parametrize("preset", HELD_PRESETS)
def test_both_backends_tag_the_names_their_kind_declares(preset):
    cfg = zoo.get_config(preset)
    x = zoo.example_batch(cfg, 2, seq_len=8)
    found = {}
    params = random_params(cfg)
    for backend in zoo.BACKENDS:
        model = zoo.from_canonical(cfg, backend, params)
        found[backend] = checkpoint_names(lambda x, model=model: model(x), x)  # traced, not run
    assert found["nnx"] == found["eqx"] == set(cfg.activation_names)
    assert set(cfg.activation_names) <= set(names.ALL)


@pytest.mark.parametrize("preset", list(zoo.PRESETS))
def test_every_leaf_has_logical_axes_of_its_rank(preset):
    cfg = zoo.get_config(preset)
    for path, shape in canonical.canonical_shapes(cfg).items():
        axes = cfg.logical_axes(tuple(path.split(".")), len(shape))
        assert len(axes) == len(shape) and set(axes) <= LOGICAL_AXES, (path, axes)
        assert (axes[0] == "layers") == path.startswith("blocks."), (path, axes)


def test_models_json_lists_every_preset_with_its_kind():
    rows = {r["name"]: r for r in preset_rows()}
    assert set(rows) == set(zoo.PRESETS)
    assert (
        {r["kind"] for r in rows.values()}
        == {kind.name for kind in registry.kinds()}
        >= {"mlp", "transformer", "llama"}
    )


@pytest.mark.numerics
@pytest.mark.parametrize("preset,overrides", SIZES)
def test_converted_weights_give_same_logits_and_grads(preset, overrides):
    cfg = zoo.get_config(preset, **overrides)
    params = random_params(cfg, seed=3)  # gains and biases away from ones and zeros
    x = zoo.example_batch(cfg, 3, seed=4)
    y = labels_for(cfg, x)
    nnx_model = zoo.from_canonical(cfg, "nnx", params)
    eqx_params = zoo.to_canonical(zoo.from_canonical(cfg, "eqx", zoo.to_canonical(nnx_model)))
    logits = {b: fast_jit(zoo.apply_fn(cfg, b))(p, x) for b, p in (("nnx", params), ("eqx", eqx_params))}
    n = reduction_size(cfg, 3)
    assert_close(logits["nnx"], logits["eqx"], n=n, what="logits")
    grads = {b: fast_jit(jax.grad(loss_of(cfg, b)))(params, x, y) for b in zoo.BACKENDS}
    assert_close(grads["nnx"], grads["eqx"], n=n, what="grads")


def swap_first_two_layers(tree):
    """The bug a weight converter makes when it maps layer i to the wrong row."""
    return {
        **tree,
        "blocks": jax.tree.map(lambda a: a[jnp.array([1, 0, *range(2, a.shape[0])])], tree["blocks"]),
    }


@pytest.mark.numerics
def test_the_float_rule_still_catches_a_parity_bug():
    """Negative test for this family: converted weights with two layers swapped give logits and
    gradients that fail the comparison the parity test makes."""
    cfg = zoo.get_config("transformer-xs", num_layers=3, d_model=32, num_heads=2, d_ff=48, max_len=12)
    params = random_params(cfg, seed=3)
    x = zoo.example_batch(cfg, 3, seed=4)
    y = labels_for(cfg, x)
    n = reduction_size(cfg, 3)
    apply = {b: fast_jit(zoo.apply_fn(cfg, b)) for b in zoo.BACKENDS}
    assert_close(apply["eqx"](params, x), apply["nnx"](params, x), n=n)
    with pytest.raises(AssertionError):
        assert_close(apply["eqx"](swap_first_two_layers(params), x), apply["nnx"](params, x), n=n)
    grad = {b: fast_jit(jax.grad(loss_of(cfg, b))) for b in zoo.BACKENDS}
    swapped = swap_first_two_layers(grad["eqx"](swap_first_two_layers(params), x, y))
    with pytest.raises(AssertionError):
        assert_close(swapped, grad["nnx"](params, x, y), n=n)


@pytest.mark.parametrize("backend", ["nnx", "eqx"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_canonical_round_trip_is_exact(kind, backend):
    cfg = KINDS[kind]
    params = random_params(cfg, seed=5)
    again = zoo.to_canonical(zoo.from_canonical(cfg, backend, params))
    assert_bitwise_equal(again, params)


@pytest.mark.parametrize("kind", list(KINDS))
def test_same_seed_same_initial_weights_in_both_backends(kind):
    cfg = KINDS[kind]
    a = zoo.to_canonical(zoo.load_model(cfg, "nnx", seed=7))
    b = zoo.to_canonical(zoo.load_model(cfg, "eqx", seed=7))
    c = zoo.to_canonical(zoo.load_model(cfg, "eqx", seed=8))
    assert_bitwise_equal(a, b)
    assert not np.array_equal(a["head"]["w"], c["head"]["w"])


def test_canonical_shapes_match_the_documented_layout():
    cfg = zoo.get_config("transformer-s")
    shapes = canonical.canonical_shapes(cfg)
    L, D, F, V, T = cfg.num_layers, cfg.d_model, cfg.d_ff, cfg.vocab_size, cfg.max_len
    assert shapes["embed.w"] == (V, D) and shapes["pos.w"] == (T, D)
    assert shapes["blocks.attn.q.w"] == (L, D, D)
    assert shapes["blocks.mlp.up.w"] == (L, D, F) and shapes["blocks.mlp.down.w"] == (L, F, D)
    assert shapes["head.w"] == (D, V) and shapes["ln_f.scale"] == (D,)
    params = zoo.to_canonical(zoo.load_model("transformer-s", "eqx"))
    assert {r.path: r.shape for r in zoo.param_table(params)} == shapes


@pytest.mark.parametrize("backend", ["nnx", "eqx"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_train_step_jaxpr_does_not_grow_with_depth(kind, backend):
    counts = []
    for depth in (2, 32):
        cfg = zoo.get_config(KINDS[kind], num_layers=depth)
        params = jax.eval_shape(functools.partial(canonical.init_params, cfg, 0))
        x = zoo.example_batch(cfg, 2, seq_len=8)
        step = jax.value_and_grad(loss_of(cfg, backend))
        counts.append(count_eqns(step, params, x, labels_for(cfg, x)))
    assert counts[0] == counts[1]


def test_param_table_counts_match_model():
    model = zoo.load_model("mlp-s", "nnx")
    rows = zoo.param_table(model)
    assert {r.path for r in rows} == {
        "in_proj.w",
        "in_proj.b",
        "blocks.dense.w",
        "blocks.dense.b",
        "head.w",
        "head.b",
    }
    assert sum(r.count for r in rows) == 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10


def test_errors_name_the_value_and_suggest():
    with pytest.raises(ZooError, match=r"'mlp-x'.*Did you mean.*mlp-s"):
        zoo.load_model("mlp-x")
    with pytest.raises(ZooError, match=r"'flax'.*Valid: eqx, nnx"):
        zoo.load_model("mlp-s", backend="flax")
    with pytest.raises(ZooError, match=r"'num_layer'.*num_layers"):
        zoo.load_model("mlp-s", num_layer=3)
    with pytest.raises(ZooError, match="num_heads"):
        zoo.get_config("transformer-xs", num_heads=5)
    params = canonical.init_params(zoo.get_config("mlp-s"))
    with pytest.raises(ZooError, match=r"head.w: got \(128, 10\), want \(256, 10\)"):
        zoo.from_canonical("mlp-m", "nnx", {**params, "blocks": params["blocks"]})


def test_overrides_reach_the_model():
    model = zoo.load_model("transformer-xs", "eqx", num_layers=3, d_model=32, vocab_size=50)
    shapes = {r.path: r.shape for r in zoo.param_table(model)}
    assert shapes["blocks.attn.q.w"] == (3, 32, 32) and shapes["embed.w"] == (50, 32)
