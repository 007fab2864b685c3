"""The per-example products of the norm rules (:mod:`zoo.dp.ghost.rules`): in which dtype they
read their operands, where they accumulate, and how a materialised op forms its per-example
gradients a chunk of examples at a time.

Precision is a policy (:mod:`zoo.precision`): the per-example work of a bf16 step reads bf16
operands (the compute dtype); its products, the norms, the clip factors and the clipped sum
accumulate in float32; what a rule keeps for the clipped sum stays in the compute dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sq(x, axes):
    return jnp.sum(jnp.square(x), axis=axes)


def keep(x, use):
    """Zero whole examples (leading axis) that must not enter the sum, NaNs included."""
    return jnp.where(use.reshape((-1,) + (1,) * (x.ndim - 1)), x, jnp.zeros((), x.dtype))


def by_unit(tree, records: int):
    """Arrays ``[U * records, ...]`` as ``[U, records, ...]``: the rows of a unit together."""
    return jax.tree_util.tree_map(lambda a: a.reshape((a.shape[0] // records, records) + a.shape[1:]), tree)


def per_position(a, d, weights, use):
    """``(a, d)`` [B, T, .] as rows [B * T, .], with each example's weight and flag repeated
    over its positions: ``sum_b w_b sum_t a_bt d_bt^T`` is one matmul over the rows. (XLA on
    CPU copies a transposed ``[d_in, B * T]`` operand to contract ``bti,bto->io``, which took
    more time than the matmul itself for a user's ``k`` records.)"""
    if a.ndim == 2:
        return a, d, weights, use
    positions = a.shape[1]
    a, d = a.reshape(-1, a.shape[-1]), d.reshape(-1, d.shape[-1])
    return a, d, jnp.repeat(weights, positions), jnp.repeat(use, positions)


def compute_dtype(a, d):
    """The dtype an op's per-example work reads its operands in: the narrower of the two, which
    is the step's compute dtype (a bf16 step's dense input is bf16; its logits and their output
    gradient are float32, and are read in bf16 as the non-private backward's MXU reads them).
    Products accumulate in float32 (:func:`dot`)."""
    return min((jnp.dtype(a.dtype), jnp.dtype(d.dtype)), key=lambda t: jnp.finfo(t).bits)


def dot(spec: str, x, y):
    """``einsum(spec, x, y)`` on operands of :func:`compute_dtype`, accumulated and returned in
    float32: the per-example work of a bf16 step runs at bf16's speed, and its products are
    summed as a non-private backward's weight gradient is."""
    dtype = compute_dtype(x, y)
    return jnp.einsum(spec, x.astype(dtype), y.astype(dtype), preferred_element_type=jnp.float32)


def wide(x):
    """``x`` in float32, for a sum that accumulates there (a kept piece of the compute dtype)."""
    return x.astype(jnp.float32)


# The float32 per-example gradients of one chunk of examples that a materialised dense op forms
# before rounding them to the compute dtype: the op runs its examples in chunks of at most this
# many bytes (at least one example), so a wide op (a head of 50k rows) never has the float32
# gradients of the whole batch at once, whatever XLA fuses.
MATERIALISE_CHUNK_BYTES = 64 << 20


def examples_per_chunk(batch: int, floats: int) -> int:
    """The largest divisor of ``batch`` whose examples' ``floats`` float32 values fit in
    :data:`MATERIALISE_CHUNK_BYTES` (at least 1)."""
    most = max(1, MATERIALISE_CHUNK_BYTES // (4 * floats))
    return max(n for n in range(1, min(most, batch) + 1) if batch % n == 0)


def materialised(a, d):
    """``(g, sq)``: the per-example gradients ``a_i^T d_i`` [B, d_in, d_out] in ``a``'s dtype,
    accumulated in float32, and the squared norms [B] of exactly those values (the clipped sum
    adds what was clipped), in chunks of examples (:func:`examples_per_chunk`)."""

    def each(a, d):
        g = dot("bti,bto->bio", a, d).astype(a.dtype)
        return g, sq(wide(g), (1, 2))

    batch = a.shape[0]
    chunk = examples_per_chunk(batch, a.shape[-1] * d.shape[-1])
    if chunk == batch:
        return each(a, d)
    g, norms = jax.lax.map(lambda ad: each(*ad), by_unit((a, d), chunk))
    return g.reshape(batch, *g.shape[2:]), norms.reshape(batch)


def weighted_product(a, d, weights, use):
    """``sum_i weights_i a_i^T d_i`` [d_in, d_out] float32, one matmul over all positions of
    the kept examples. The operands stay in their (compute) dtype: the examples left out are
    zeroed and ``d`` scaled by its example's weight in float32, then read in the compute dtype
    again, as the non-private backward reads its output gradient; the products accumulate in
    float32."""
    dtype = a.dtype  # (widened first: XLA fuses the round trip, no float32 copy is made)
    a, d, row_weights, row_use = per_position(wide(a), wide(d), weights, use)
    a = keep(a, row_use).astype(dtype)
    d = (keep(d, row_use) * row_weights[:, None]).astype(dtype)
    return jnp.einsum("ri,ro->io", a, d, preferred_element_type=jnp.float32)
