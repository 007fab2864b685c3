"""Logical batches larger than the chip: the clipped sum accumulated over microbatches.

``dp.microbatch_size = m`` cuts the step's padded batch of ``B`` examples (records, or users
under ``dp.unit = "user"``: a user's slots stay together) into ``B / m`` microbatches. One
``jax.lax.scan`` runs the run's clipping method (any row of :data:`zoo.dp.clipping.CLIPPING`)
on each of them and adds its clipped sum to a float32 carry; the per-example norms and losses
come back in the batch's own order. The noise is added once, to the whole sum, by the caller
(:meth:`zoo.train.engine.Engine._dp_grads`) with the logical batch's key and its normaliser, so
the mechanism, the expected batch size and epsilon are those of the logical batch: a
microbatch is a performance setting only.

Microbatch ``i`` holds examples ``i, i + n, i + 2n, ...`` (``n = B / m`` microbatches): a batch
split over a mesh's batch axis in contiguous blocks gives every device its share of every
microbatch. The sum does not depend on which examples share a microbatch.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from zoo.dp.clipping import ClipFn, ClipModel, ClipRequest
from zoo.precision import float32_scope

__all__ = [
    "accumulated_clip",
    "merge_microbatches",
    "microbatch_count",
    "split_microbatches",
    "valid_microbatch_sizes",
]

_SPLIT = ("x", "y", "mask")  # what a clipping method reads of the batch


def valid_microbatch_sizes(batch_size: int) -> list[int]:
    """The microbatch sizes that divide a padded batch of ``batch_size`` examples."""
    return [d for d in range(1, batch_size + 1) if batch_size % d == 0]


def microbatch_count(batch_size: int, microbatch_size: int | None) -> int:
    """How many microbatches of ``microbatch_size`` make the padded batch (1 for ``None``). A
    size that does not divide the batch is a ValueError naming both and the valid sizes (the
    padded batch size is public: this refusal depends on no record)."""
    if microbatch_size is None:
        return 1
    if not isinstance(microbatch_size, int) or microbatch_size < 1 or batch_size % microbatch_size:
        valid = ", ".join(map(str, valid_microbatch_sizes(batch_size)))
        raise ValueError(
            f"dp.microbatch_size {microbatch_size!r} does not divide the padded batch of "
            f"{batch_size} examples; valid microbatch sizes: {valid}"
        )
    return batch_size // microbatch_size


def split_microbatches(tree, n: int):
    """Every leaf ``[B, ...]`` as ``[n, B / n, ...]``: microbatch ``i`` holds rows ``i::n``."""

    def one(a):
        a = jnp.asarray(a)
        return jnp.swapaxes(a.reshape((a.shape[0] // n, n) + a.shape[1:]), 0, 1)

    return jax.tree.map(one, tree)


def merge_microbatches(per_example: jax.Array) -> jax.Array:
    """``[n, m]`` per-microbatch values back in the batch's order ``[n * m]``."""
    return jnp.swapaxes(per_example, 0, 1).reshape(-1)


def accumulated_clip(clip: ClipFn, model: ClipModel, trainable, frozen, batch: dict, request: ClipRequest):
    """``clip``'s ``(clipped sum, norms [B], losses [B])`` of ``batch``, computed
    ``request.microbatch_size`` examples at a time under one ``lax.scan``.

    ``batch`` is the step's (``x``, ``y`` and ``mask``, the keep flags also in
    ``request.example_mask``; under ``dp.unit = "user"`` grouped by
    :func:`zoo.dp.users.group_users`, so an example is a user). Each microbatch is clipped
    with the request's clip norm and its own slice of the mask; the sums add in float32 (at
    least), and the result has the dtypes of ``trainable``. Without a microbatch size, or with
    one that is the whole batch, this is one call of ``clip``.
    """
    b = int(jnp.shape(batch["mask"])[0])
    n = microbatch_count(b, request.microbatch_size)
    whole = dataclasses.replace(request, microbatch_size=None)
    if n == 1:
        return clip(model, trainable, frozen, batch, whole)
    parts = split_microbatches({key: batch[key] for key in _SPLIT}, n)

    def body(carry, part):
        one = dataclasses.replace(whole, example_mask=part["mask"])
        summed, norms, losses = clip(model, trainable, frozen, part, one)
        with float32_scope("f32_clipped_sum"):
            carry = jax.tree.map(lambda c, s: c + s.astype(c.dtype), carry, summed)
        return carry, (norms.astype(jnp.float32), losses.astype(jnp.float32))

    init = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), trainable)
    summed, (norms, losses) = jax.lax.scan(body, init, parts)
    summed = jax.tree.map(lambda s, p: s.astype(p.dtype), summed, trainable)
    return summed, merge_microbatches(norms), merge_microbatches(losses)
