"""A key/value cache's rows: p heads side by side in each slot's row, as many as fit a TPU
tile's 128 lanes, and how a cached read takes them (:mod:`zoo.models.decode` lays the cache out,
:mod:`zoo.models.attention` reads it). Why rows: ``zoo/models/decode.py``'s docstring."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

LANES = 128  # the width of a TPU tile's rows (and of its vector registers and matrix units)


def row_lanes(platform: str | None = None) -> int:
    """The lanes a cache row fills on ``platform`` (default: JAX's default backend):
    :data:`LANES` on a TPU; 1 elsewhere, one head to a row: a CPU's products over rows of p heads
    do p times the work for the same bytes (a float32 read 1.1 to 1.6 times slower,
    ``benchmarks/generate/RESULTS.md``, "The decode step's bytes")."""
    return LANES if (platform or jax.default_backend()) == "tpu" else 1


def heads_per_row(kv_heads: int, head_dim: int, lanes: int = LANES) -> int:
    """p: how many heads share a slot's row of the cache, the most that divide ``kv_heads``
    and fit ``lanes`` (1 for heads of ``lanes`` or more)."""
    return max(p for p in range(1, kv_heads + 1) if kv_heads % p == 0 and (p == 1 or p * head_dim <= lanes))


class CacheSlice(NamedTuple):
    """One layer's view of a key/value cache, what a block reads besides its new tokens.

    ``k``, ``v``: [B, KV / p, T, p * d], the keys and values of the slots written before, p
    heads side by side in each slot's row (:func:`heads_per_row`; None when nothing
    is written yet: the prefill). ``pad`` [B]: the first slot row b may read (its left padding
    ends there). ``slot``: the slot of the first new token."""

    k: jax.Array | None
    v: jax.Array | None
    pad: jax.Array
    slot: jax.Array


def spread(qh: jax.Array, per_row: int) -> jax.Array:
    """Grouped queries [B, KV, G, S, d] as a cache row of ``per_row`` (p) heads reads them:
    [B, KV/p, p * G, S, p * d], head j * p + h's queries in lanes [h * d, (h + 1) * d) and zeros
    in its row-mates' lanes. One product over a row of p heads then gives each head its own
    scores (the zeros add nothing), so a packed row is contracted whole, as it lies."""
    b, kv, g, s, d = qh.shape
    x = qh.reshape(b, kv // per_row, per_row, g, s, d)
    lanes = [jnp.pad(x[:, :, h], [(0, 0)] * 4 + [(h * d, (per_row - 1 - h) * d)]) for h in range(per_row)]
    return jnp.stack(lanes, 2).reshape(b, kv // per_row, per_row * g, s, per_row * d)


def gathered(part, kv_heads: int, per_row: int):
    """:func:`spread`'s inverse on ``(m, l, acc)``: [B, KV/p, p * G, S(, p * d)] ->
    [B, KV, G, S(, d)], each head's output sliced from its own lanes (its row-mates' lanes hold
    their values weighted by its probabilities, and are dropped)."""
    m, norm, acc = part
    b, rows, pg, s, width = acc.shape
    g, d = pg // per_row, width // per_row
    m, norm = (x.reshape(b, kv_heads, g, s) for x in (m, norm))
    x = acc.reshape(b, rows, per_row, g, s, width)
    own = jnp.stack([x[:, :, h, ..., h * d : (h + 1) * d] for h in range(per_row)], 2)
    return m, norm, own.reshape(b, kv_heads, g, s, d)
