"""The precision policy (zoo/precision.py): float32 is the identity; under bfloat16 every kind
computes in bf16 and agrees with float32 under the bf16 rule (tests/numerics.py); what stays
float32 (norm statistics, the softmax, the logits, the loss) is float32 in the traced program.
Each check has its planted bug. The engine under the policy: tests/train/test_engine.py."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, random_params, reduction_size
from tests.numerics import assert_close_bf16, bf16_excess
from zoo.configs import TrainConfig
from zoo.errors import ZooError
from zoo.jaxprs import iter_eqns, scope_float_dtypes
from zoo.losses import per_example_loss
from zoo.models import attention, ops, registry
from zoo.precision import FLOAT32, Precision

BF16 = Precision("bfloat16")
MODELS = {kind.name: zoo.get_config(kind.small, num_layers=2) for kind in registry.kinds()}
MODEL_SCOPES = ("f32_norm_statistics", "f32_softmax", "f32_loss")


def inputs(cfg, batch: int = 3):
    x = zoo.example_batch(cfg, batch, seed=2, seq_len=8 if cfg.max_len else None)
    return x, labels_for(cfg, x)


def loss_of(cfg, backend: str, precision):
    apply = zoo.apply_fn(cfg, backend, precision=precision)

    def loss(params, x, y):
        return per_example_loss(apply(params, x), y).mean()

    return loss


# -- the policy object ------------------------------------------------------------------------
def test_float32_is_the_identity():
    def fn(params, x):
        return x

    tree = {"w": jnp.ones((2, 3)), "ids": jnp.arange(3)}
    assert FLOAT32.apply(fn) is fn
    assert FLOAT32.to_compute(tree) is tree and FLOAT32.held(tree) is tree
    assert FLOAT32.to_output(tree) is tree
    cfg = MODELS["transformer"]
    params, (x, _) = random_params(cfg, 1), inputs(cfg)
    plain = jax.make_jaxpr(zoo.apply_fn(cfg, "nnx"))(params, x)
    assert str(jax.make_jaxpr(zoo.apply_fn(cfg, "nnx", precision="float32"))(params, x)) == str(plain)


def test_bfloat16_casts_floats_and_leaves_ids_alone():
    tree = {"w": jnp.ones((2, 3)), "ids": jnp.arange(3), "host": np.ones(4, np.float32)}
    cast = BF16.to_compute(tree)
    assert {k: str(v.dtype) for k, v in cast.items()} == {"w": "bfloat16", "ids": "int32", "host": "bfloat16"}
    assert isinstance(BF16.held(tree)["host"], np.ndarray)  # a host leaf is cast on the host
    assert str(BF16.to_output(cast)["w"].dtype) == "float32"
    assert BF16.compute_dtype == jnp.bfloat16 and BF16.param_dtype == jnp.float32


def test_an_unknown_precision_is_one_line():
    with pytest.raises(ZooError, match=r"unknown precision 'fp16'.*Valid: bfloat16, float32"):
        Precision("fp16")
    with pytest.raises(ZooError, match=r"train.precision 'bf16'.*Did you mean 'bfloat16'"):
        TrainConfig(precision="bf16")


# -- bfloat16 against float32, every kind and backend ---------------------------------------------
@pytest.mark.numerics
@pytest.mark.parametrize("backend", ["nnx", "eqx"])
@pytest.mark.parametrize("kind", list(MODELS))
def test_bf16_loss_and_gradients_match_float32(kind, backend):
    cfg = MODELS[kind]
    params, (x, y) = random_params(cfg, 1), inputs(cfg)
    expected = fast_jit(jax.value_and_grad(loss_of(cfg, backend, "float32")))(params, x, y)
    actual = fast_jit(jax.value_and_grad(loss_of(cfg, backend, "bfloat16")))(params, x, y)
    assert {str(g.dtype) for g in jax.tree.leaves(actual[1])} == {"float32"}  # to the float32 params
    assert_close_bf16(actual, expected, n=reduction_size(cfg, 3), what=f"{kind} {backend}")


def _bf16_statistics(x, eps):
    """Planted: LayerNorm's statistics in the compute dtype (E[x^2] - E[x]^2 in bf16)."""
    mean = x.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x * x).mean(-1, keepdims=True) - mean * mean)
    return (x - mean) * jax.lax.rsqrt(var + eps)


@pytest.mark.numerics
def test_the_bf16_rule_still_catches_norm_statistics_in_bf16(monkeypatch):
    """Negative test for the family above: on a residual stream with a common offset (what
    LayerNorm exists to remove; here 2.0 on the token table), E[x^2] - E[x]^2 in bf16 cancels
    to garbage. The float32 statistics pass the rule on the same params; the planted ones fail."""
    cfg = MODELS["transformer"]
    params, (x, y) = random_params(cfg, 1), inputs(cfg)
    params["embed"]["w"] = params["embed"]["w"] + 2.0
    expected = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "float32")))(params, x, y)
    n = reduction_size(cfg, 3)
    assert_close_bf16(
        fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "bfloat16")))(params, x, y), expected, n=n
    )
    monkeypatch.setattr(ops, "_layer_normalised", _bf16_statistics)
    planted = fast_jit(jax.value_and_grad(loss_of(cfg, "nnx", "bfloat16")))(params, x, y)
    assert bf16_excess(planted, expected, n=n) > 1


# -- what stays float32, read from the traced program --------------------------------------------
def check_float32_parts(cfg, backend="nnx"):
    """The loss and gradient under bfloat16: the model computes in bf16 (its dense layers' dots),
    while everything in the float32 scopes, and the logits, is float32."""
    params, (x, y) = random_params(cfg, 1), inputs(cfg)
    jaxpr = jax.make_jaxpr(jax.grad(loss_of(cfg, backend, BF16)))(params, x, y)
    dots = {str(e.outvars[0].aval.dtype) for e in iter_eqns(jaxpr) if e.primitive.name == "dot_general"}
    assert "bfloat16" in dots, dots
    found = scope_float_dtypes(jaxpr, MODEL_SCOPES)
    expected = {"f32_norm_statistics", "f32_softmax", "f32_loss"} if cfg.max_len else {"f32_loss"}
    assert {s for s, d in found.items() if d} == expected, found
    assert all(d <= {"float32"} for d in found.values()), found
    logits = [e for e in iter_eqns(jaxpr) if e.primitive.name == "name" and e.params["name"] == "logits"]
    assert logits and {str(e.invars[0].aval.dtype) for e in logits} == {"float32"}


CHECKED = {
    "transformer": MODELS["transformer"],  # LayerNorm, dense attention
    "llama": MODELS["llama"],  # RMSNorm, grouped-query attention
    "chunked": zoo.get_config(MODELS["transformer"], attention="chunked", attention_chunk=4),
    "cnn": MODELS["cnn"],  # no norm, no attention: logits and loss
}


@pytest.mark.parametrize("name", list(CHECKED))
def test_norm_statistics_softmax_logits_and_loss_are_float32(name):
    check_float32_parts(CHECKED[name])


def _bf16_softmax(scores, causal):
    """Planted: the softmax's max, exp and sum in the scores' dtype."""
    return jax.nn.softmax(jnp.where(causal, scores, jnp.finfo(scores.dtype).min), axis=-1)


def _bf16_loss(logits, labels):
    """Planted: the loss on logits rounded to the compute dtype, the log-softmax in bf16."""
    logits = logits.astype(jnp.bfloat16)
    return -jnp.take_along_axis(jax.nn.log_softmax(logits), labels[..., None], -1)[..., 0].mean(-1)


@pytest.mark.parametrize(
    "target, name, planted",
    [
        (ops, "_layer_normalised", _bf16_statistics),
        (ops, "_rms_normalised", lambda x, eps: x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + eps)),
        (attention, "_masked_softmax", _bf16_softmax),
        (ops, "LOGITS_DTYPE", None),  # the head's dot in the compute dtype: bf16 logits
    ],
)
def test_the_float32_check_still_catches_each_part_in_bf16(monkeypatch, target, name, planted):
    monkeypatch.setattr(target, name, planted)
    model = "llama" if name == "_rms_normalised" else "transformer"
    with pytest.raises(AssertionError):
        check_float32_parts(CHECKED[model])


def test_the_float32_check_still_catches_a_bf16_loss(monkeypatch):
    def planted(logits, labels):
        with jax.named_scope("f32_loss"):
            return _bf16_loss(logits, labels)

    monkeypatch.setitem(globals(), "per_example_loss", planted)  # what loss_of calls
    with pytest.raises(AssertionError):
        check_float32_parts(CHECKED["cnn"])


def test_trainable_leaves_are_float32_and_frozen_ones_the_compute_dtype_under_every_policy():
    """``master``: float32 under both policies; ``held``: the compute dtype, so a bf16 leaf in a
    float32 run is widened and a float32 leaf in a bf16 run is rounded once."""
    tree = {"w": jnp.ones((2,), jnp.bfloat16), "v": jnp.ones((2,), jnp.float32), "ids": jnp.arange(2)}
    for policy in (FLOAT32, BF16):
        assert {k: str(a.dtype) for k, a in policy.master(tree).items()} == {
            "w": "float32", "v": "float32", "ids": "int32"
        }  # fmt: skip
    assert {k: str(a.dtype) for k, a in FLOAT32.held(tree).items()} == {
        "w": "float32",
        "v": "float32",
        "ids": "int32",
    }
    assert {k: str(a.dtype) for k, a in BF16.held(tree).items()} == {
        "w": "bfloat16",
        "v": "bfloat16",
        "ids": "int32",
    }


# -- the decode softmax: the same scope check, on the prefill and a decode step ----------------
def check_decode_softmax(cfg):
    """The prefill and one decode step of a bf16 model over a bf16 cache (zoo.models.decode):
    the cached reads' softmax is traced inside ``f32_softmax``, and is float32 there."""
    from zoo.models import decode

    params = BF16.to_compute(random_params(cfg, 1))
    cache = decode.init_cache(cfg, 2, 32, jnp.bfloat16)
    tokens, pad = jnp.ones((2, 16), jnp.int32), jnp.array([0, 3])
    positions = jnp.maximum(jnp.arange(16)[None, :] - pad[:, None], 0)
    steps = ((True, tokens, positions, 0), (False, tokens[:, :1], (16 - pad)[:, None], 16))
    for prefill, x, at, slot in steps:

        def step(p, c, x=x, at=at, slot=slot, prefill=prefill):
            return decode.forward(cfg, "nnx", p, c, x, at, pad, slot, prefill=prefill)

        found = scope_float_dtypes(jax.make_jaxpr(step)(params, cache), ("f32_softmax",))["f32_softmax"]
        assert found == {"float32"}, (prefill, found)


@pytest.mark.parametrize("name", ["transformer", "llama", "chunked"])
def test_the_decode_softmax_is_float32_like_trainings(name):
    check_decode_softmax(CHECKED[name])


def test_the_decode_check_still_catches_a_bf16_softmax(monkeypatch):
    def planted(q, k, v, ok, scale=None):  # the scores, max, exp and sum in the compute dtype
        s = attention.masked(jnp.einsum("...gsd,...td->...gst", q, k), ok)
        with jax.named_scope("f32_softmax"):
            m = s.max(-1)
            p = jnp.where(ok, jnp.exp(s - m[..., None]), 0.0).astype(s.dtype)
            norm = p.sum(-1)
        return m, norm, jnp.einsum("...gst,...td->...gsd", p, v)

    monkeypatch.setattr(attention, "_part", planted)
    with pytest.raises(AssertionError):
        check_decode_softmax(CHECKED["transformer"])
