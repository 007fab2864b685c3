"""Philox-4x32-10 for programs that run on a device mesh: JAX's ``philox4x32``, bit for bit,
built from operations every partitioner lowers.

JAX 0.12 computes Philox's 32x32 -> 64-bit products with ``lax.mulhi``, which lowers to
``chlo.mulhi``. Shardy (the default partitioner) cannot convert that op back to StableHLO, so
any program over more than one device that draws philox4x32 numbers fails to compile, whether
the numbers are sharded, replicated or drawn inside ``shard_map``.

This twin takes the high word of each product from four 16 x 16-bit products instead, and
lays out keys and counters exactly as :mod:`jax._src.random.philox4x32` does: the same key
data give the same bits, hence the same ``jax.random.normal`` values (tested on one device
against JAX's own implementation). It is only used where the program is partitioned; on one
device JAX's native lowering is cheaper.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.random import define_prng_impl

__all__ = ["PARTITIONABLE_PHILOX", "mulhi32", "philox4x32"]

_M0, _M1 = np.uint32(0xD2511F53), np.uint32(0xCD9E8D57)  # round multipliers (Random123)
_W0, _W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)  # Weyl key bumps
_ROUNDS = 10
_LOW16 = np.uint32(0xFFFF)
_SIXTEEN = np.uint32(16)


def mulhi32(a: jax.Array, b: np.uint32) -> jax.Array:
    """High 32 bits of the 64-bit product of uint32 ``a`` and the constant ``b``.

    Every partial product of two 16-bit halves fits in 32 bits, and so does the sum of the
    middle terms' low halves with the carry out of the low product.
    """
    a_lo, a_hi = a & _LOW16, a >> _SIXTEEN
    b_lo, b_hi = np.uint32(int(b) & 0xFFFF), np.uint32(int(b) >> 16)
    lo_lo, lo_hi, hi_lo = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo
    middle = (lo_lo >> _SIXTEEN) + (lo_hi & _LOW16) + (hi_lo & _LOW16)
    return a_hi * b_hi + (lo_hi >> _SIXTEEN) + (hi_lo >> _SIXTEEN) + (middle >> _SIXTEEN)


def philox4x32(k0, k1, x0, x1, x2, x3):
    """Ten Philox rounds on the counter ``(x0, x1, x2, x3)`` under the key ``(k0, k1)``."""
    for round_ in range(_ROUNDS):
        if round_:
            k0, k1 = k0 + _W0, k1 + _W1
        lo0, hi0 = x0 * _M0, mulhi32(x0, _M0)
        lo1, hi1 = x2 * _M1, mulhi32(x2, _M1)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
    return x0, x1, x2, x3


def _counters(shape: tuple[int, ...]) -> jax.Array:
    """The flat index of every element as uint32 (JAX's low counter word), built from one
    iota per dimension so the partitioner can split it like the output."""
    size = math.prod(shape)
    if size >= 2**32:
        raise ValueError(f"partitionable philox4x32 draws fewer than 2**32 values; asked for {shape}")
    if not shape:
        return jnp.zeros((), jnp.uint32)
    strides = [math.prod(shape[d + 1 :]) for d in range(len(shape))]
    return sum(
        lax.broadcasted_iota(jnp.uint32, shape, d) * np.uint32(stride) for d, stride in enumerate(strides)
    )


def _seed(seed: jax.Array) -> jax.Array:
    seed = jnp.asarray(seed)
    # As JAX does: a logical shift by 32 leaves 0 for a seed of 32 bits or fewer.
    k0 = lax.shift_right_logical(seed, lax.convert_element_type(32, seed.dtype)).astype(jnp.uint32)
    with jax.numpy_dtype_promotion("standard"):
        k1 = jnp.bitwise_and(seed, np.uint32(0xFFFFFFFF)).astype(jnp.uint32)
    zero = jnp.uint32(0)
    out = philox4x32(zero, zero, k0, k1, zero, zero)
    return jnp.stack([out[0], out[1]])


def _split(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    zeros = jnp.zeros(shape, jnp.uint32)
    out0, out1, _, _ = philox4x32(key[0], key[1], zeros, zeros, zeros, _counters(shape))
    return jnp.stack([out0, out1], axis=len(shape))


def _fold_in(key: jax.Array, data: jax.Array) -> jax.Array:
    zero = jnp.uint32(0)
    out0, out1, _, _ = philox4x32(key[0], key[1], zero, zero, zero, jnp.asarray(data, jnp.uint32))
    return jnp.stack([out0, out1])


def _random_bits(key: jax.Array, bit_width: int, shape: tuple[int, ...]) -> jax.Array:
    zeros = jnp.zeros(shape, jnp.uint32)
    out0, out1, out2, out3 = philox4x32(key[0], key[1], zeros, _counters(shape), zeros, zeros)
    dtype = np.dtype(f"uint{bit_width}")
    if bit_width == 64:
        hi, lo = lax.convert_element_type(out0, dtype), lax.convert_element_type(out1, dtype)
        return lax.shift_left(hi, jnp.asarray(32, dtype)) | lo
    bits = out0 ^ out1 ^ out2 ^ out3
    return bits if bit_width == 32 else lax.convert_element_type(bits, dtype)


PARTITIONABLE_PHILOX = define_prng_impl(
    key_shape=(2,),
    seed=_seed,
    split=_split,
    random_bits=_random_bits,
    fold_in=_fold_in,
    name="philox4x32-partitionable",
    tag="phxp",
)
