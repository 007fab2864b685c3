"""Splash attention (zoo.models.splash, the Pallas TPU kernel in interpret mode on a CPU) against
dense attention written out in full: values and gradients, causal or not, with key padding and
grouped KV heads, at a length the kernel's blocks do not divide; what its remat name keeps; and
``attention = "auto"`` resolving to dense on a CPU, as the run's summary says."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from tests.conftest import labels_for, loss_of, random_params
from tests.models.test_attention import assert_model_matches_dense, dense_reference
from tests.numerics import assert_close
from zoo import names, recipes
from zoo.errors import ZooError
from zoo.models import registry, splash
from zoo.models.attention import attention
from zoo.train.summary import attention_ran

B, T, D = 2, 200, 8  # 200 tokens: padded to one 256-token block


def inputs(heads: int, kv_heads: int, seed: int = 0, seq: int = T):
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (B, seq, heads * D))
    k = jax.random.normal(keys[1], (B, seq, kv_heads * D))
    v = jax.random.normal(keys[2], (B, seq, kv_heads * D))
    weights = jax.random.normal(keys[3], (B, seq, heads * D))
    mask = jnp.arange(seq)[None, :] < jnp.array([seq, 131])[:, None]
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


def test_blocks_are_cut_to_the_sequence_and_the_length_padded_to_every_block():
    default = splash.SplashBlocks()
    assert default.for_length(1024) == (1024, default.used())
    assert set(default.used().values()) == {512}  # the measured default (benchmarks/device/RESULTS.md)
    assert default.for_length(200) == (256, dict.fromkeys(splash.FIELDS, 256))
    assert default.for_length(16)[0] == 128
    mixed = splash.SplashBlocks(block_q=256, block_kv=1024, block_kv_compute=512, block_q_dq=384)
    padded, sizes = mixed.for_length(1500)  # blocks of 256, 384, 512 and 1024: padded to 3072
    assert padded == 3072 and (sizes["block_q"], sizes["block_kv"], sizes["block_q_dq"]) == (256, 1024, 384)
    # 300 tokens: every block cut to 384 but block_q (256), the length padded to a whole number of both
    assert mixed.for_length(300) == (768, {**dict.fromkeys(splash.FIELDS, 384), "block_q": 256})
    fused = splash.SplashBlocks(fused_backward=True)
    assert set(fused.for_length(1024)[1]) == set(splash.FORWARD + splash.BACKWARD_DKV)  # no dq kernel


BAD = {  # overrides: the one line (for {kind}Config)
    "splash_block_q=200": (
        {"splash_block_q": 200},
        r"^{kind}Config.splash_block_q must be a positive multiple of 128 .*got 200\.$",
    ),
    "splash_block_kv_dq=0": ({"splash_block_kv_dq": 0}, r"splash_block_kv_dq must be a positive multiple"),
    "a compute block that does not divide its block": (
        {"splash_block_kv_dkv_compute": 384},
        r"^{kind}Config.splash_block_kv_dkv_compute must divide {kind}Config.splash_block_kv_dkv "
        r"\(512\); got 384\. Valid: 128, 256, 512\.$",
    ),
    "splash_fused_backward=1": ({"splash_fused_backward": 1}, r"splash_fused_backward must be true or false"),
}


@pytest.mark.parametrize("case", BAD, ids=list(BAD))
def test_a_bad_splash_setting_is_one_line_naming_it_and_the_valid_ones(case):
    """From a recipe's [model] section (as ``--set model.FIELD=...`` makes it), for both kinds."""
    overrides, message = BAD[case]
    for preset, kind in (("transformer-xs", "Transformer"), ("llama-xs", "Llama")):
        with pytest.raises(ZooError, match=message.replace("{kind}", kind)):
            recipes.parse_recipe({"model": {"preset": preset, **overrides}}, "t").model_config()


TUNED = {  # 300 tokens: blocks of 128, 256 and 384 tokens, padded to 768 (a whole number of each)
    "every block its own size": splash.SplashBlocks(
        block_q=128,
        block_kv=256,
        block_kv_compute=128,
        block_q_dkv=384,
        block_kv_dkv=128,
        block_kv_dkv_compute=128,
        block_q_dq=256,
        block_kv_dq=384,
    ),  # fmt: skip
    "fused backward": splash.SplashBlocks(*[128] * 6, fused_backward=True),
}


@pytest.mark.numerics
@pytest.mark.parametrize("tuned", TUNED, ids=list(TUNED))
def test_tuned_blocks_give_dense_attentions_values_and_gradients(tuned):
    seq = 300
    q, k, v, weights = (a[:1] for a in inputs(2, 1, seq=seq)[:4])  # one row: interpret mode is slow

    def out(fn):
        return lambda q, k, v: (fn(q, k, v) * weights).sum()

    kernel = out(lambda q, k, v: attention(q, k, v, 2, 1, kind="splash", blocks=TUNED[tuned]))
    reference = out(lambda q, k, v: dense_reference(q, k, v, 2, 1, True, None))
    assert_close(kernel(q, k, v), reference(q, k, v), n=seq * seq * D, what="values")
    got = jax.grad(kernel, argnums=(0, 1, 2))(q, k, v)
    want = jax.grad(reference, argnums=(0, 1, 2))(q, k, v)
    for name, a, e in zip("qkv", got, want, strict=True):
        assert_close(a, e, n=seq * D * 2, what=f"d{name}")


@pytest.mark.parametrize("preset", ["transformer-xs", "llama-xs"])
@pytest.mark.parametrize("backend", ["nnx", "eqx"])
def test_a_models_splash_settings_reach_the_kernel(preset, backend, monkeypatch):
    """The config's block sizes and backward form are what the library's ``BlockSizes`` is
    built with, forward and backward (traced only: nothing runs)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    built = []

    class Recorded(sk.BlockSizes):
        def __init__(self, **kw):
            built.append(kw)
            super().__init__(**kw)

    monkeypatch.setattr(sk, "BlockSizes", Recorded)
    tuned = dict(splash_block_q=128, splash_block_kv=256, splash_block_kv_compute=128)
    tuned.update(splash_block_q_dkv=256, splash_block_kv_dkv=256, splash_block_kv_dkv_compute=128)
    tuned.update(splash_fused_backward=True)
    cfg = registry.get_config(preset, attention="splash", max_len=256, **tuned)
    x = cfg.example_input(jax.random.key(1), 1, 256)
    jax.eval_shape(jax.grad(loss_of(cfg, backend)), random_params(cfg), x, labels_for(cfg, x))
    want = {k.removeprefix("splash_"): v for k, v in tuned.items()}
    want["use_fused_bwd_kernel"] = want.pop("fused_backward")
    assert built and all(kw == want for kw in built), built


@pytest.mark.numerics
@pytest.mark.parametrize("preset", ["transformer-xs", "llama-xs"])
def test_a_model_with_splash_attention_gives_the_dense_models_loss_and_gradients(preset):
    assert_model_matches_dense(preset, "splash")


def test_auto_attention_is_dense_on_a_cpu_and_the_summary_says_which_ran():
    assert jax.default_backend() == "cpu"
    cfg = registry.get_config("transformer-xs")
    assert cfg.attention == "auto"
    assert splash.resolve("auto") == "dense"
    assert attention_ran(cfg, 64) == {"attention": "dense", "platform": "cpu"}
    assert attention_ran(registry.get_config("mlp-s")) == {}


def test_the_summary_reports_splashs_blocks_at_the_runs_length_and_its_backward_kernel():
    cfg = registry.get_config(
        "llama-xs", attention="splash", splash_block_kv=1024, splash_fused_backward=True
    )
    ran = attention_ran(cfg, 300)  # every block cut to 384 tokens, no dq kernel
    assert ran["attention"] == "splash" and ran["splash"]["backward"] == "fused"
    assert ran["splash"]["blocks"] == dict.fromkeys(splash.FORWARD + splash.BACKWARD_DKV, 384)
    split = attention_ran(dataclasses.replace(cfg, splash_fused_backward=False))["splash"]
    assert split["backward"] == "dkv and dq kernels"
    assert split["blocks"]["block_kv"] == 1024 and split["blocks"]["block_kv_dq"] == 512
