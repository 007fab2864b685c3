"""Losses on logits. Classifiers: logits [B, C], labels [B]. LMs: logits [B, T, V], labels [B, T]."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from zoo.precision import float32_scope


def per_example_loss(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean cross-entropy per example: [B] (averaged over tokens for LMs), in float32 whatever
    the logits' dtype."""
    with float32_scope("f32_loss"):
        losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
        return losses.reshape(losses.shape[0], -1).mean(axis=1)


def masked_mean(values: jax.Array, mask: jax.Array | None) -> jax.Array:
    """Mean over examples where mask is 1. An all-zero mask gives 0, not NaN, and a NaN in a
    masked-out slot does not leak into the mean (0 * NaN would be NaN)."""
    if mask is None:
        return values.mean()
    return jnp.where(mask > 0, values * mask, 0.0).sum() / jnp.maximum(mask.sum(), 1.0)


def accuracy_per_example(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Fraction of correct argmax predictions per example: [B]."""
    hits = (logits.argmax(-1) == labels).astype(jnp.float32)
    return hits.reshape(hits.shape[0], -1).mean(axis=1)
