"""The clip factor ``min(1, C / norm)``: the one scale every clipping path (``zoo.dp.clipping``,
its groups in ``zoo.dp.groups``) and the audit's gradient canaries clip with. A module of its
own, below both: ``zoo.dp.clipping`` imports the groups, and the groups clip with it."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.precision import float32_scope

__all__ = ["clip_factor"]


def clip_factor(norms: jax.Array, l2_clip_norm: float | jax.Array) -> jax.Array:
    """``min(1, C / norm)`` per example, 1 for a zero norm (no 0/0): the scale that brings a
    gradient of this L2 norm inside the clip bound ``C``. Both clipping paths and the audit's
    gradient canaries (:mod:`zoo.audit`) clip with it."""
    with float32_scope("f32_clip_factors"):
        clip = jnp.asarray(l2_clip_norm, jnp.float32)
        safe = jnp.where(norms > 0, norms, 1.0)
        return jnp.where(norms > clip, clip / safe, 1.0)
