"""Tests for zoo.dp.add_gaussian_noise / privatize."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.dp import add_gaussian_noise, privatize
from zoo.dp.noise import (
    AUTO,
    DEFAULT_NOISE_PRNG,
    FASTEST,
    NOISE_PRNGS,
    NOISE_STREAM,
    noise_key,
    resolve_noise_prng,
)
from zoo.errors import ZooError

# `numerics` (re-run under narrower ISAs) marks float sampling and its statistics; the key-bit
# and bad-input checks compute no floats.
SIGMA, CLIP = 1.3, 0.7


def clean_tree():
    rng = np.random.default_rng(0)
    return {
        "a": jnp.asarray(rng.standard_normal((300, 200)), jnp.float32),
        "nested": {"b": jnp.ones((40_000,), jnp.float32)},
    }


def standardized(noisy, clean):
    return np.concatenate(
        [
            ((np.asarray(n, np.float64) - np.asarray(c, np.float64)) / (SIGMA * CLIP)).ravel()
            for n, c in zip(jax.tree.leaves(noisy), jax.tree.leaves(clean), strict=True)
        ]
    )


@pytest.mark.numerics
@pytest.mark.parametrize("prng", [*NOISE_PRNGS, None])
def test_noise_is_standard_normal_at_scale_sigma_c(prng):
    clean = clean_tree()
    noisy = add_gaussian_noise(
        clean, jax.random.PRNGKey(0), noise_multiplier=SIGMA, l2_clip_norm=CLIP, prng=prng
    )
    assert jax.tree.structure(noisy) == jax.tree.structure(clean)
    z = standardized(noisy, clean)
    n = z.size
    assert n == 100_000
    assert abs(z.mean()) < 5 / np.sqrt(n)
    assert abs(z.std() - 1) < 0.02
    # Each leaf separately as well (catches a wrong scale on one leaf only).
    for leaf_n, leaf_c in zip(jax.tree.leaves(noisy), jax.tree.leaves(clean), strict=True):
        zl = standardized(leaf_n, leaf_c)
        assert abs(zl.std() - 1) < 0.03


@pytest.mark.numerics
def test_keys_control_the_noise():
    zeros = {"a": jnp.zeros((1000,)), "b": jnp.zeros((1000,))}
    kw = dict(noise_multiplier=1.0, l2_clip_norm=1.0)
    n1 = add_gaussian_noise(zeros, jax.random.PRNGKey(1), **kw)
    n1_again = add_gaussian_noise(zeros, jax.random.PRNGKey(1), **kw)
    n2 = add_gaussian_noise(zeros, jax.random.PRNGKey(2), **kw)
    np.testing.assert_array_equal(np.asarray(n1["a"]), np.asarray(n1_again["a"]))
    np.testing.assert_array_equal(np.asarray(n1["b"]), np.asarray(n1_again["b"]))
    assert not np.allclose(np.asarray(n1["a"]), np.asarray(n2["a"]))
    # Leaves of the same shape get independent noise (separate split keys).
    assert not np.allclose(np.asarray(n1["a"]), np.asarray(n1["b"]))
    assert abs(np.corrcoef(np.asarray(n1["a"]), np.asarray(n1["b"]))[0, 1]) < 0.15


@pytest.mark.numerics
def test_privatize_divides_by_expected_batch_size():
    clean = {"w": jnp.arange(6.0).reshape(2, 3)}
    key = jax.random.PRNGKey(3)
    noisy = add_gaussian_noise(clean, key, noise_multiplier=SIGMA, l2_clip_norm=CLIP)
    mean = privatize(clean, key, noise_multiplier=SIGMA, l2_clip_norm=CLIP, expected_batch_size=64)
    assert_close(mean, {"w": np.asarray(noisy["w"]) / 64}, n=1)
    # Negative test for this family: a missing 1/B is caught by the same comparison.
    with pytest.raises(AssertionError):
        assert_close(noisy, {"w": np.asarray(noisy["w"]) / 64}, n=1, what="1/B missing")


def test_zero_noise_and_unbounded_sensitivity():
    clean = {"w": jnp.ones((3,))}
    out = add_gaussian_noise(clean, jax.random.PRNGKey(0), noise_multiplier=0.0, l2_clip_norm=float("inf"))
    np.testing.assert_array_equal(np.asarray(out["w"]), 1.0)
    with pytest.raises(ValueError, match="inf"):
        add_gaussian_noise(clean, jax.random.PRNGKey(0), noise_multiplier=1.0, l2_clip_norm=float("inf"))
    with pytest.raises(ValueError, match="-0.5"):
        add_gaussian_noise(clean, jax.random.PRNGKey(0), noise_multiplier=-0.5, l2_clip_norm=1.0)
    with pytest.raises(ValueError, match="expected_batch_size"):
        privatize(clean, jax.random.PRNGKey(0), noise_multiplier=1.0, l2_clip_norm=1.0, expected_batch_size=0)


@pytest.mark.numerics
def test_works_under_jit_with_bf16_leaves():
    clean = {"w": jnp.zeros((4096,), jnp.bfloat16)}
    fn = jax.jit(lambda g, k, s: privatize(g, k, noise_multiplier=s, l2_clip_norm=1.0, expected_batch_size=2))
    out = fn(clean, jax.random.PRNGKey(5), 2.0)
    assert out["w"].dtype == jnp.bfloat16
    assert abs(float(np.std(np.asarray(out["w"], np.float32))) - 1.0) < 0.1  # sigma*C/2 = 1


@pytest.mark.numerics
def test_noise_is_split_key_normal_per_leaf_under_jit():
    """The scheduling barriers in add_gaussian_noise do not change the values: leaf i gets
    std * normal(split(key, n)[i])."""
    clean = clean_tree()
    key = jax.random.PRNGKey(7)
    noisy = jax.jit(lambda g, k: add_gaussian_noise(g, k, noise_multiplier=SIGMA, l2_clip_norm=CLIP))(
        clean, key
    )
    keys = jax.random.split(noise_key(key), 2)
    for k, n, c in zip(keys, jax.tree.leaves(noisy), jax.tree.leaves(clean), strict=True):
        expected = np.asarray(c) + SIGMA * CLIP * np.asarray(jax.random.normal(k, c.shape))
        assert_close(n, expected, n=1)


@pytest.mark.numerics
def test_noise_prng_picks_the_sampler():
    zeros = {"w": jnp.zeros((2000,))}
    kw = dict(noise_multiplier=1.0, l2_clip_norm=1.0)
    key = jax.random.key(11)
    draws = {prng: np.asarray(add_gaussian_noise(zeros, key, prng=prng, **kw)["w"]) for prng in NOISE_PRNGS}
    for a in NOISE_PRNGS:  # every sampler gives its own noise from the same key
        for b in NOISE_PRNGS:
            if a < b:
                assert abs(np.corrcoef(draws[a], draws[b])[0, 1]) < 0.1
    # prng=None draws with the key's own implementation (threefry2x32 here), from its noise stream.
    own = np.asarray(add_gaussian_noise(zeros, key, prng=None, **kw)["w"])
    stream = jax.random.fold_in(key, NOISE_STREAM)
    assert_close(own, jax.random.normal(jax.random.split(stream, 1)[0], (2000,)), n=1)
    assert str(jax.random.key_impl(noise_key(key))) == resolve_noise_prng(DEFAULT_NOISE_PRNG)
    philox = jax.random.key(11, impl="philox4x32")  # already the right kind: only the stream
    np.testing.assert_array_equal(
        jax.random.key_data(noise_key(philox)), jax.random.key_data(jax.random.fold_in(philox, NOISE_STREAM))
    )


@pytest.mark.parametrize("prng", [*NOISE_PRNGS, None])
def test_raw_and_typed_keys_give_the_same_noise(prng):
    typed = jax.random.key(5)
    raw = jax.random.key_data(typed)
    np.testing.assert_array_equal(
        jax.random.key_data(noise_key(raw, prng)), jax.random.key_data(noise_key(typed, prng))
    )


@pytest.mark.parametrize("prng", [*NOISE_PRNGS, None])
def test_noise_key_shares_no_bits_with_other_uses_of_the_key(prng):
    """Whoever else derives from the step key (bits, fold_in, split) must not see the noise key."""
    key = jax.random.key(3)
    leaf_keys = jax.random.split(noise_key(key, prng), 8)  # what add_gaussian_noise draws with
    noise = np.concatenate(
        [
            np.asarray(jax.random.key_data(noise_key(key, prng))).ravel(),
            np.asarray(jax.random.key_data(leaf_keys)).ravel(),
        ]
    )
    others = [jax.random.bits(key, (8,), jnp.uint32), jax.random.key_data(jax.random.split(key, 4))]
    others += [jax.random.key_data(jax.random.fold_in(key, i)) for i in range(64)]
    seen = set(np.concatenate([np.asarray(o).ravel() for o in others]).tolist())
    assert not seen.intersection(noise.tolist())


def test_every_noise_prng_has_a_key_of_at_least_64_bits():
    """Noise keys are drawn per step and per leaf: with 32-bit keys two of them would likely
    collide in a long run, and equal keys give equal noise."""
    for prng in NOISE_PRNGS:
        data = jax.random.key_data(jax.random.key(0, impl=prng))
        assert data.size * data.dtype.itemsize * 8 >= 64, prng


def test_unknown_noise_prng_names_the_valid_ones():
    with pytest.raises(ZooError, match=r"'philox2x32'.*auto, philox4x32, rbg, threefry2x32, threefry4x32"):
        add_gaussian_noise(
            {"w": jnp.zeros(3)}, jax.random.key(0), noise_multiplier=1.0, l2_clip_norm=1.0, prng="philox2x32"
        )


@pytest.mark.numerics
def test_auto_draws_on_a_cpu_exactly_what_philox4x32_draws():
    """``dp.noise_prng = "auto"`` (the default) is the fastest sampler measured on the platform:
    philox4x32 on a CPU, so a CPU run's noise is bit for bit what it was before ``auto``."""
    assert DEFAULT_NOISE_PRNG == AUTO and jax.default_backend() == "cpu"
    assert resolve_noise_prng(AUTO) == "philox4x32" == FASTEST["cpu"]
    tree = {"w": jnp.zeros((3000,)), "b": jnp.zeros((7,))}
    kw = dict(noise_multiplier=SIGMA, l2_clip_norm=CLIP)
    key = jax.random.key(4)
    auto = add_gaussian_noise(tree, key, prng=AUTO, **kw)
    philox = add_gaussian_noise(tree, key, prng="philox4x32", **kw)
    for a, p in zip(jax.tree.leaves(auto), jax.tree.leaves(philox), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(p))


def test_auto_names_a_sampler_per_platform():
    assert resolve_noise_prng(AUTO, "tpu") == "rbg"  # JAX's "fastest on TPU"; benchmarks/dp/noise.py
    assert resolve_noise_prng(AUTO, "some-new-chip") == "philox4x32"
    assert resolve_noise_prng("threefry2x32", "tpu") == "threefry2x32" and resolve_noise_prng(None) is None
    assert set(FASTEST.values()) <= set(NOISE_PRNGS)
