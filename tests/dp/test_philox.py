"""zoo.dp.philox: JAX's philox4x32, bit for bit, without ``lax.mulhi`` (which Shardy cannot
partition in JAX 0.12), so DP noise from the default sampler compiles on a device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.numerics import assert_close
from zoo.dp import add_gaussian_noise
from zoo.dp.noise import noise_key
from zoo.dp.philox import PARTITIONABLE_PHILOX, mulhi32

JAX_PHILOX = "philox4x32"


def data(key):
    return np.asarray(jax.random.key_data(key))


@pytest.mark.parametrize("b", [0xD2511F53, 0xCD9E8D57, 0xFFFFFFFF, 0x10000, 1, 0])
def test_mulhi32_is_the_high_word_of_the_64_bit_product(b):
    a = np.random.default_rng(b).integers(0, 2**32, 50_000, dtype=np.uint64)
    a[:4] = [0, 1, 0xFFFF, 0xFFFFFFFF]
    expected = ((a * np.uint64(b)) >> np.uint64(32)).astype(np.uint32)
    got = jax.jit(mulhi32, static_argnums=1)(a.astype(np.uint32), np.uint32(b))
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("seed", [0, 1, 7, -3, 2**31 - 1])
def test_seed_split_and_fold_in_match_jax(seed):
    ours, theirs = jax.random.key(seed, impl=PARTITIONABLE_PHILOX), jax.random.key(seed, impl=JAX_PHILOX)
    np.testing.assert_array_equal(data(ours), data(theirs))
    np.testing.assert_array_equal(
        data(jax.random.split(ours, (3, 5))), data(jax.random.split(theirs, (3, 5)))
    )
    np.testing.assert_array_equal(data(jax.random.fold_in(ours, 99)), data(jax.random.fold_in(theirs, 99)))


@pytest.mark.parametrize("shape", [(), (3,), (7, 5), (4, 3, 2), (129, 65)])
def test_the_same_key_data_give_the_same_numbers(shape):
    raw = data(jax.random.key(5, impl=JAX_PHILOX))
    ours, theirs = (jax.random.wrap_key_data(raw, impl=impl) for impl in (PARTITIONABLE_PHILOX, JAX_PHILOX))
    for dtype in (jnp.uint8, jnp.uint16, jnp.uint32):
        np.testing.assert_array_equal(
            np.asarray(jax.random.bits(ours, shape, dtype)), np.asarray(jax.random.bits(theirs, shape, dtype))
        )
    assert_close(jax.random.normal(ours, shape), jax.random.normal(theirs, shape), n=1)


@pytest.mark.parametrize("partitioned", [False, True])
def test_philox_noise_is_jax_philox_noise(partitioned):
    tree = {"a": jnp.zeros((300, 20)), "b": jnp.zeros((7,))}
    key = jax.random.key(3)
    noisy = jax.jit(
        lambda t, k: add_gaussian_noise(
            t, k, noise_multiplier=1.0, l2_clip_norm=1.0, prng=JAX_PHILOX, partitioned=partitioned
        )
    )(tree, key)
    stream = noise_key(key, JAX_PHILOX)
    assert str(jax.random.key_impl(stream)) == JAX_PHILOX
    keys = jax.random.split(stream, 2)  # JAX's own philox: one key per leaf, in leaf order
    expected = {"a": jax.random.normal(keys[0], (300, 20)), "b": jax.random.normal(keys[1], (7,))}
    assert_close(noisy, expected, n=1)
