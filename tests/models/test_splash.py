"""Splash attention (zoo.models.splash, the Pallas TPU kernel in interpret mode on a CPU) against
dense attention written out in full: values and gradients, causal or not, with key padding and
grouped KV heads, at a length the kernel's blocks do not divide; what its remat name keeps; and
``attention = "auto"`` resolving to dense on a CPU, as the run's summary says."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import labels_for, loss_of, random_params
from tests.models.test_attention import dense_reference
from tests.numerics import assert_close
from zoo import names
from zoo.models import registry, splash
from zoo.models.attention import attention
from zoo.train.summary import attention_ran

B, T, D = 2, 200, 8  # 200 tokens: padded to one 256-token block


def inputs(heads: int, kv_heads: int, seed: int = 0):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (B, T, heads * D))
    k = jax.random.normal(keys[1], (B, T, kv_heads * D))
    v = jax.random.normal(keys[2], (B, T, kv_heads * D))
    weights = jax.random.normal(keys[3], (B, T, heads * D))
    mask = jnp.arange(T)[None, :] < jnp.array([T, 131])[:, None]
    return q, k, v, weights, mask


CASES = {
    "causal, grouped kv heads": dict(heads=4, kv_heads=2, causal=True, padded=False),
    "causal, key padding": dict(heads=2, kv_heads=2, causal=True, padded=True),
    "not causal, key padding, one kv head": dict(heads=4, kv_heads=1, causal=False, padded=True),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_values_and_gradients_equal_dense_attention(case):
    heads, kv_heads, causal, padded = (CASES[case][k] for k in ("heads", "kv_heads", "causal", "padded"))
    q, k, v, weights, mask = inputs(heads, kv_heads)
    key_mask = mask if padded else None
    rows = (mask if padded else jnp.ones_like(mask))[..., None]  # real query rows

    def loss(fn):
        def of(q, k, v):
            return (fn(q, k, v) * weights * rows).sum()

        return of

    def kernel(q, k, v):
        return attention(q, k, v, heads, kv_heads, kind="splash", causal=causal, key_mask=key_mask)

    def reference(q, k, v):
        return dense_reference(q, k, v, heads, kv_heads, causal, key_mask)

    assert_close(kernel(q, k, v) * rows, reference(q, k, v) * rows, n=T * D, what="values")
    got = jax.grad(loss(kernel), argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(loss(reference), argnums=(0, 1, 2))(q, k, v)
    for name, a, e in zip("qkv", got, want, strict=True):
        assert_close(a, e, n=T * D * heads, what=f"d{name}")


def _kernel_residuals(policy) -> list[tuple[int, ...]]:
    """The shapes of what the backward pass keeps of a checkpointed splash call's kernel
    (``jax.ad_checkpoint``'s saved residuals: an output of the kernel's forward)."""
    from jax._src.ad_checkpoint import saved_residuals

    q, k, v, weights, _ = inputs(2, 2)
    attend = jax.checkpoint(lambda q, k, v: attention(q, k, v, 2, 2, kind="splash"), policy=policy)
    saved = saved_residuals(lambda q: (attend(q, k, v) * weights).sum(), q)
    return sorted(tuple(aval.shape) for aval, what in saved if "_splash_attention" in what)


def test_the_kernels_residuals_carry_the_attn_context_name():
    """Saving ``attn_context`` keeps the kernel's output [B, KV, G, T', d] and log-sum-exp
    [B, KV, G, T']: the backward pass does not run the forward kernel again. Saving nothing
    keeps neither, and the backward pass recomputes them."""
    save = jax.checkpoint_policies.save_only_these_names(names.ATTN_CONTEXT)
    assert _kernel_residuals(save) == [(B, 2, 1, 256), (B, 2, 1, 256, D)]
    assert _kernel_residuals(jax.checkpoint_policies.nothing_saveable) == []


def test_block_sizes_are_multiples_of_the_kernels_lanes_and_capped_by_the_sequence():
    assert splash.block_for(1024) == splash.BLOCK
    assert splash.block_for(200) == 256
    assert splash.block_for(16) == 128
    with pytest.raises(ValueError, match="multiple of 128"):
        splash.block_for(1024, 200)


@pytest.mark.numerics
@pytest.mark.parametrize("preset", ["transformer-xs", "llama-xs"])
def test_a_model_with_splash_attention_gives_the_dense_models_loss_and_gradients(preset):
    dense_cfg = registry.get_config(preset, attention="dense")
    cfg = dataclasses.replace(dense_cfg, attention="splash")
    params = random_params(dense_cfg)
    x = dense_cfg.example_input(jax.random.key(1), 2, 24)
    y = labels_for(dense_cfg, x)
    got = jax.value_and_grad(loss_of(cfg, "nnx"))(params, x, y)
    want = jax.value_and_grad(loss_of(dense_cfg, "nnx"))(params, x, y)
    assert_close(got[0], want[0], n=24 * dense_cfg.d_model, what="loss")
    assert_close(got[1], want[1], n=2 * 24 * dense_cfg.d_model, what="gradients")


def test_auto_attention_is_dense_on_a_cpu_and_the_summary_says_which_ran():
    assert jax.default_backend() == "cpu"
    cfg = registry.get_config("transformer-xs")
    assert cfg.attention == "auto"
    assert splash.resolve("auto") == "dense"
    assert attention_ran(cfg) == {"attention": "dense", "platform": "cpu"}
    assert attention_ran(dataclasses.replace(cfg, attention="splash"))["attention"] == "splash"
    assert attention_ran(registry.get_config("mlp-s")) == {}
