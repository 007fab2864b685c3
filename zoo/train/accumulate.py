"""Gradient accumulation for a non-private step: ``[train] microbatch_size``.

A step of ``train.batch_size`` rows takes them ``microbatch_size`` at a time under one
``jax.lax.scan``: each microbatch's forward and backward, its gradient added to a float32
carry, then one optimizer update for the whole batch. Only one microbatch's activations are
alive at once, and what a step pays once (the optimizer update, and under ``[train] offload``
the moments' trips to and from host memory) is shared by all the microbatches.

The result is the whole batch's: the carry sums ``grad(sum_i m_i L_i) / sum_i m_i`` over the
microbatches (``m`` the padding mask, the denominator the whole batch's), which is the gradient
of :func:`zoo.losses.masked_mean` over the batch, summed in another order. Microbatch ``i``
holds rows ``i, i + n, ...`` (:func:`zoo.dp.microbatch.split_microbatches`, as DP's). A DP run
accumulates its clipped sums instead (``dp.microbatch_size``).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from zoo.dp.microbatch import split_microbatches, valid_microbatch_sizes
from zoo.losses import masked_mean

__all__ = ["accumulated_value_and_grad"]

_SPLIT = ("x", "y", "mask")


def _add(acc: jax.Array, grad: jax.Array) -> jax.Array:
    return acc + grad.astype(acc.dtype)


def accumulated_value_and_grad(
    example_losses: Callable, trainable: dict, batch: dict, microbatch_size: int | None
) -> tuple[jax.Array, dict]:
    """``(masked mean loss, its gradient)`` over ``batch`` (``x``, ``y``, ``mask``), where
    ``example_losses(trainable, x, y)`` gives the per-example losses. ``microbatch_size``
    ``None`` (or the whole batch) is one ``value_and_grad``; otherwise it must divide the batch
    (a ValueError lists the sizes that do)."""
    rows = batch["mask"].shape[0]
    if microbatch_size is not None and (microbatch_size < 1 or rows % microbatch_size):
        valid = ", ".join(map(str, valid_microbatch_sizes(rows)))
        raise ValueError(
            f"train.microbatch_size {microbatch_size!r} does not divide the batch of {rows} rows; "
            f"valid microbatch sizes: {valid}"
        )
    n = 1 if microbatch_size is None else rows // microbatch_size
    if n == 1:

        def whole(params):
            return masked_mean(example_losses(params, batch["x"], batch["y"]), batch["mask"])

        return jax.value_and_grad(whole)(trainable)
    total = jnp.maximum(batch["mask"].sum(), 1.0)

    def part(params, micro):
        losses = example_losses(params, micro["x"], micro["y"])
        return jnp.where(micro["mask"] > 0, losses * micro["mask"], 0.0).sum() / total

    def body(carry, micro):
        loss, grads = jax.value_and_grad(part)(trainable, micro)
        acc_loss, acc = carry
        return (acc_loss + loss, jax.tree.map(_add, acc, grads)), None

    zeros = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.promote_types(p.dtype, jnp.float32)), trainable)
    micro = split_microbatches({k: batch[k] for k in _SPLIT}, n)
    (loss, grads), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zeros), micro)
    grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trainable)
    return loss, grads
