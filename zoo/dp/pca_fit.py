"""DP-PCA: the principal directions of the training features, fitted with the Gaussian mechanism
(Abadi et al. 2016, "Deep Learning with Differential Privacy", section 4).

The mechanism, on feature rows ``a_i`` (the private training records):

1. each row is scaled to L2 norm at most ``bound`` (1 by default):
   ``c_i = a_i min(1, bound / ||a_i||)``; a row that is not finite contributes nothing;
2. ``S = sum_i c_i c_i^T``, the second moment about zero (centring would need the mean, another
   statistic of the records);
3. the release is ``S + Z``, ``Z`` symmetric with its upper triangle (diagonal included) drawn
   i.i.d. ``N(0, (sigma bound^2)^2)``.

Adding or removing one row changes the upper triangle of ``S`` by that of ``c c^T``, whose L2 norm
is at most ``||c c^T||_F = ||c||^2 <= bound^2``: step 3 is the Gaussian mechanism with noise
multiplier ``sigma``, one ``dp_accounting.GaussianDpEvent(sigma)`` (composed with DP-SGD's steps in
:mod:`zoo.dp.accounting`). The projection, the top ``k`` eigenvectors of ``S + Z``, is
post-processing. With ``sigma = 0`` (a run without DP) it is plain PCA of the clipped rows.

Everything here runs once, on the host, before training: NumPy in float64, the noise drawn with
JAX from the run's key (:func:`zoo.dp.noise.noise_key`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from zoo.checks import require_int, require_number
from zoo.dp.noise import noise_key

__all__ = ["PCA_STREAM", "clip_rows", "noisy_second_moment", "private_pca", "second_moment", "top_directions"]

# fold_in constant of the PCA's key under a run's root key. The per-step keys are
# fold_in(root, step) with step < 2**31, so a constant at or above 2**31 never meets them.
PCA_STREAM = 0xD7CA0001
_CHUNK = 8192  # rows per partial sum: float32 products, float64 accumulation


def clip_rows(x: np.ndarray, bound: float = 1.0) -> np.ndarray:
    """``x`` [N, F] with every row scaled to L2 norm at most ``bound``, as float64; rows with a
    non-finite value become zero (they contribute nothing, as a NaN record in DP-SGD)."""
    bound = require_number("bound", bound, positive=True, finite=True)
    x = np.asarray(x, np.float64)
    finite = np.isfinite(x).all(axis=1)
    x = np.where(finite[:, None], x, 0.0)
    norms = np.linalg.norm(x, axis=1)
    scale = np.minimum(1.0, bound / np.maximum(norms, np.finfo(np.float64).tiny))
    return x * scale[:, None]


def second_moment(x: np.ndarray, bound: float = 1.0) -> np.ndarray:
    """``sum_i c_i c_i^T`` [F, F] (float64) of the rows of ``x`` clipped to ``bound``."""
    x = np.asarray(x)
    total = np.zeros((x.shape[1], x.shape[1]), np.float64)
    for start in range(0, x.shape[0], _CHUNK):
        rows = clip_rows(x[start : start + _CHUNK], bound).astype(np.float32)
        total += (rows.T @ rows).astype(np.float64)
    return total


def symmetric_noise(key: jax.Array, size: int, std: float, prng: str | None) -> np.ndarray:
    """``Z`` [size, size] (float64): its upper triangle, diagonal included, i.i.d. ``N(0, std^2)``
    drawn from ``noise_key(key, prng)``, mirrored below the diagonal."""
    draw = np.asarray(jax.random.normal(noise_key(key, prng), (size, size), jnp.float32), np.float64)
    upper = np.triu(draw)
    return std * (upper + np.triu(draw, 1).T)


def noisy_second_moment(
    x: np.ndarray, noise_multiplier: float, key: jax.Array | None, bound: float = 1.0, prng: str | None = None
) -> np.ndarray:
    """The mechanism's release, ``S + Z`` (module docstring); ``key`` may be None only when
    ``noise_multiplier`` is 0."""
    sigma = require_number("noise_multiplier", noise_multiplier, lo=0.0, finite=True)
    moment = second_moment(x, bound)
    if sigma == 0.0:
        return moment
    if key is None:
        raise ValueError("noise_multiplier > 0 needs a key to draw the noise from")
    return moment + symmetric_noise(key, moment.shape[0], sigma * bound**2, prng)


def top_directions(matrix: np.ndarray, k: int) -> np.ndarray:
    """The eigenvectors of the ``k`` largest eigenvalues of the symmetric ``matrix``, as the
    columns of a float32 [F, k]; each column's largest entry in absolute value is positive (an
    eigenvector's sign is arbitrary: this fixes it)."""
    k = require_int("k", k, lo=1, hi=matrix.shape[0], what=f"an int in [1, {matrix.shape[0]}]")
    values, vectors = np.linalg.eigh(np.asarray(matrix, np.float64))
    top = vectors[:, np.argsort(values)[::-1][:k]]
    signs = np.sign(top[np.abs(top).argmax(axis=0), np.arange(k)])
    return (top * np.where(signs == 0, 1.0, signs)).astype(np.float32)


def private_pca(
    x: np.ndarray,
    k: int,
    *,
    noise_multiplier: float,
    key: jax.Array | None,
    bound: float = 1.0,
    prng: str | None = None,
) -> np.ndarray:
    """The [F, k] projection of DP-PCA on the rows of ``x`` [N, F]: the top ``k`` directions of
    the noisy second moment of the rows clipped to ``bound``. ``(noise_multiplier, 1 row)`` is
    what the accountant needs: one ``GaussianDpEvent(noise_multiplier)``. ``prng`` names the
    noise's PRNG (:data:`zoo.dp.noise.NOISE_PRNGS`; None keeps ``key``'s)."""
    return top_directions(noisy_second_moment(x, noise_multiplier, key, bound, prng), k)
