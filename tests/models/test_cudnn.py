"""``attention = "cudnn"`` (zoo.models.cudnn: ``jax.nn.dot_product_attention``, cuDNN's kernel on
a GPU and its XLA definition on a CPU) against dense attention written out in full: values and
gradients, causal or not, with key padding and grouped KV heads, under a per-example ``vmap``;
a model with it gives the dense model's loss and gradients; the summary says it ran (the
one-line refusal of an unknown kind lists it: test_attention.py)."""

import jax
import jax.numpy as jnp
import pytest

from tests.models.test_attention import assert_model_matches_dense, dense_reference
from tests.numerics import assert_close
from zoo.models import cudnn, registry
from zoo.models.attention import attention
from zoo.train.summary import attention_ran

B, T, D = 2, 37, 8

CASES = {
    "causal, grouped kv heads": dict(heads=4, kv_heads=2, causal=True, padded=False),
    "causal, key padding": dict(heads=2, kv_heads=2, causal=True, padded=True),
    "not causal, key padding, one kv head": dict(heads=4, kv_heads=1, causal=False, padded=True),
}


def inputs(heads: int, kv_heads: int):
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (B, T, heads * D))
    k = jax.random.normal(keys[1], (B, T, kv_heads * D))
    v = jax.random.normal(keys[2], (B, T, kv_heads * D))
    weights = jax.random.normal(keys[3], (B, T, heads * D))
    mask = jnp.arange(T)[None, :] < jnp.array([T, 23])[:, None]
    return q, k, v, weights, mask


@pytest.mark.numerics
@pytest.mark.parametrize("per_example", [False, True], ids=["batch", "vmap"])
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_values_and_gradients_equal_dense_attention(case, per_example):
    heads, kv_heads, causal, padded = (CASES[case][k] for k in ("heads", "kv_heads", "causal", "padded"))
    q, k, v, weights, mask = inputs(heads, kv_heads)
    key_mask = mask if padded else None
    rows = (mask if padded else jnp.ones_like(mask))[..., None]  # real query rows

    def fused(q, k, v, key_mask):
        return attention(q, k, v, heads, kv_heads, kind="cudnn", causal=causal, key_mask=key_mask)

    def reference(q, k, v, key_mask):
        return dense_reference(q, k, v, heads, kv_heads, causal, key_mask)

    def batched(fn):  # per example (no batch axis inside, as the DP vmap method calls it) or whole
        if not per_example:
            return lambda q, k, v: fn(q, k, v, key_mask)
        return lambda q, k, v: jax.vmap(fn)(q, k, v, key_mask if padded else jnp.ones((B, T), bool))

    def loss(fn):
        return lambda q, k, v: (batched(fn)(q, k, v) * weights * rows).sum()

    assert_close(batched(fused)(q, k, v) * rows, batched(reference)(q, k, v) * rows, n=T * D, what="values")
    got = jax.grad(loss(fused), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
    for name, a, e in zip("qkv", got, want, strict=True):
        assert_close(a, e, n=T * D * heads, what=f"d{name}")


@pytest.mark.numerics
@pytest.mark.parametrize("preset", ["transformer-xs", "llama-xs"])
def test_a_model_with_cudnn_attention_gives_the_dense_models_loss_and_gradients(preset):
    assert_model_matches_dense(preset, "cudnn")


def test_the_kernel_is_cudnns_on_a_gpu_only_and_the_summary_names_it():
    assert jax.default_backend() == "cpu" and cudnn.implementation() is None
    cfg = registry.get_config("llama-xs", attention="cudnn")
    assert attention_ran(cfg, 64) == {"attention": "cudnn", "platform": "cpu"}
