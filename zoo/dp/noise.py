"""Gaussian mechanism on a clipped gradient sum.

With per-example clip bound ``C`` the clipped sum has L2 sensitivity ``C``
under add/remove-one neighbouring, so adding ``N(0, (sigma * C)^2)`` to every
coordinate is the (Poisson-subsampled) Gaussian mechanism that
:mod:`zoo.dp.accounting` accounts for with noise multiplier ``sigma``.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from zoo.checks import is_number
from zoo.configs import DEFAULT_NOISE_PRNG
from zoo.dp.philox import PARTITIONABLE_PHILOX
from zoo.errors import choice_error
from zoo.precision import float32_scope

PyTree = Any

__all__ = [
    "AUTO",
    "DEFAULT_NOISE_PRNG",
    "FASTEST",
    "NOISE_PRNGS",
    "NOISE_PRNG_CHOICES",
    "add_gaussian_noise",
    "noise_key",
    "privatize",
    "resolve_noise_prng",
]

# JAX's samplers with keys of at least 64 bits.  Philox-4x32-10 (the generator behind
# PyTorch's CUDA sampler, also in cuRAND) is the fastest of the counter-based ones on a CPU: JAX
# lowers threefry2x32 with a rolled loop there, and the noise is most of what a ghost DP step
# on mlp-s adds to the non-private step (docs/dp-mechanisms.md, "The noise sampler").
# ``rbg`` draws with XLA's RngBitGenerator (JAX: "fastest on TPU"), and derives keys (split,
# fold_in) with threefry2x32 on each half of its 128-bit key; its bits differ between CPU, GPU
# and TPU, and JAX does not promise them across compiler versions, so it is for the speed of a
# chip, not for numbers shared across machines. Its 128 key bits are XLA's generator state,
# of which at least 64 are the generator's key (the rest its starting counter): two of a run's
# per-step, per-leaf keys meet with probability below n^2 / 2^65, as for philox4x32.
# philox2x32 is left out: its 32-bit key makes two of a long run's per-step, per-leaf noise
# keys likely to collide (about 1 in 3 for 6 leaves x 10k steps), and equal keys mean equal
# noise. ``unsafe_rbg`` is left out too: its key derivation is XLA's generator itself, which
# nobody has tested as a hash (JAX's docs).
NOISE_PRNGS = ("philox4x32", "threefry2x32", "threefry4x32", "rbg")
AUTO = "auto"  # the fastest sampler measured on the platform (FASTEST)
NOISE_PRNG_CHOICES = (AUTO, *NOISE_PRNGS)  # what ``dp.noise_prng`` may say
# The fastest sampler measured per platform (``benchmarks/dp/noise.py``; ``chip_normals`` times
# 124M normals by each on a chip); any other platform draws with philox4x32, the CPU's fastest.
FASTEST = {"cpu": "philox4x32", "tpu": "rbg"}
NOISE_STREAM = 0x6E6F6973  # fold_in constant that separates the noise from other uses of a key


def resolve_noise_prng(prng: str | None, platform: str | None = None) -> str | None:
    """The sampler ``prng`` names: itself, or for ``"auto"`` the fastest measured on
    ``platform`` (default: JAX's default backend; :data:`FASTEST`). A run's summary reports it.
    A CPU's is philox4x32, so ``"auto"`` draws on a CPU exactly what philox4x32 draws."""
    if prng != AUTO:
        return prng
    return FASTEST.get(platform or jax.default_backend(), "philox4x32")


def _noise_std(noise_multiplier, l2_clip_norm):
    if is_number(noise_multiplier) and not noise_multiplier >= 0:
        raise ValueError(f"noise_multiplier must be >= 0; got {noise_multiplier!r}.")
    if is_number(l2_clip_norm) and not l2_clip_norm > 0:
        raise ValueError(f"l2_clip_norm must be > 0; got {l2_clip_norm!r}.")
    if is_number(noise_multiplier) and noise_multiplier == 0:
        return 0.0  # avoid 0 * inf = NaN when clipping is disabled
    if is_number(l2_clip_norm) and l2_clip_norm == float("inf"):
        raise ValueError(
            f"cannot add noise with noise_multiplier={noise_multiplier!r} to an "
            "unclipped sum (l2_clip_norm=inf): the sensitivity is unbounded."
        )
    return noise_multiplier * l2_clip_norm


def noise_key(key: jax.Array, prng: str | None = DEFAULT_NOISE_PRNG) -> jax.Array:
    """The key the noise is drawn with: its own stream of ``key`` (typed, or raw key data of
    JAX's default implementation), as a key of JAX's ``prng`` implementation (``"auto"``:
    :func:`resolve_noise_prng`'s).

    The stream is ``fold_in(key, NOISE_STREAM)``, so the noise never shares bits with another
    use of ``key``. For another implementation its key data are bits drawn from that stream.
    ``prng=None`` keeps ``key``'s implementation. The same ``key`` always gives the same key.
    """
    if prng is not None and prng not in NOISE_PRNG_CHOICES:
        raise choice_error("noise_prng", prng, NOISE_PRNG_CHOICES)
    prng = resolve_noise_prng(prng)
    if not jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    stream = jax.random.fold_in(key, NOISE_STREAM)
    if prng is None or str(jax.random.key_impl(stream)) == prng:
        return stream
    data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0, impl=prng)))
    return jax.random.wrap_key_data(jax.random.bits(stream, data.shape, data.dtype), impl=prng)


def _sampling_key(key: jax.Array, partitioned: bool) -> jax.Array:
    """``key`` itself, or in a partitioned program a philox4x32 key's data under
    :mod:`zoo.dp.philox`'s twin: the same numbers, in a program Shardy can lower. On one
    device JAX's own lowering (``lax.mulhi``) is faster (benchmarks/dp/noise.py)."""
    if partitioned and str(jax.random.key_impl(key)) == "philox4x32":
        return jax.random.wrap_key_data(jax.random.key_data(key), impl=PARTITIONABLE_PHILOX)
    return key


def add_gaussian_noise(
    grad_sum: PyTree,
    key: jax.Array,
    *,
    noise_multiplier: float | jax.Array,
    l2_clip_norm: float | jax.Array,
    prng: str | None = DEFAULT_NOISE_PRNG,
    partitioned: bool = False,
) -> PyTree:
    """Return ``grad_sum + N(0, (noise_multiplier * l2_clip_norm)^2)`` per coordinate.

    Every leaf gets its own key from ``jax.random.split(noise_key(key, prng), num_leaves)``,
    so leaves receive independent noise.  Noise is drawn in at least float32 and
    the result is cast back to each leaf's dtype.  The same key always yields
    the same noise; the caller must use a fresh key every step.  ``prng`` names the
    sampler (:data:`NOISE_PRNG_CHOICES`; see :func:`noise_key`). ``partitioned=True`` (a program
    over more than one device) draws philox4x32 numbers with a twin of JAX's implementation
    that gives the same bits and also compiles on a mesh.

    Under ``jit`` the noise of a leaf is drawn only after the whole sum is computed and the
    previous leaf's noise is added, so the sampler's scratch buffers (several times the
    leaf's size for threefry on CPU) reuse the memory of the dead activations instead of
    adding to the forward/backward peak.
    """
    std = _noise_std(noise_multiplier, l2_clip_norm)
    leaves, treedef = jax.tree.flatten(grad_sum)
    if not leaves:
        return grad_sum
    keys = jax.random.split(_sampling_key(noise_key(key, prng), partitioned), len(leaves))
    leaves, keys = jax.lax.optimization_barrier((leaves, keys))
    noisy = []
    for leaf, leaf_key in zip(leaves, keys, strict=True):
        if noisy:  # one leaf's sampler scratch at a time
            noisy[-1], leaf_key = jax.lax.optimization_barrier((noisy[-1], leaf_key))
        leaf = jnp.asarray(leaf)
        dtype = jnp.promote_types(leaf.dtype, jnp.float32)
        z = jax.random.normal(leaf_key, leaf.shape, dtype=dtype)
        noisy.append((leaf.astype(dtype) + jnp.asarray(std, dtype) * z).astype(leaf.dtype))
    return jax.tree.unflatten(treedef, noisy)


def privatize(
    grad_sum: PyTree,
    key: jax.Array,
    *,
    noise_multiplier: float | jax.Array,
    l2_clip_norm: float | jax.Array,
    expected_batch_size: int | float,
    prng: str | None = DEFAULT_NOISE_PRNG,
    partitioned: bool = False,
) -> PyTree:
    """Noisy clipped-gradient mean: ``add_gaussian_noise(...) / expected_batch_size``.

    The divisor is the EXPECTED Poisson batch size ``q * N``, a public constant,
    not the realised batch size: dividing by the realised size would make the
    normaliser depend on private data (and on whether one example is present).
    """
    if is_number(expected_batch_size) and not expected_batch_size > 0:
        raise ValueError(f"expected_batch_size must be > 0; got {expected_batch_size!r}.")
    with float32_scope("f32_noise"):
        noisy = add_gaussian_noise(
            grad_sum,
            key,
            noise_multiplier=noise_multiplier,
            l2_clip_norm=l2_clip_norm,
            prng=prng,
            partitioned=partitioned,
        )
        return jax.tree.map(
            lambda x: (x / jnp.asarray(expected_batch_size, jnp.promote_types(x.dtype, jnp.float32))).astype(
                x.dtype
            ),
            noisy,
        )
