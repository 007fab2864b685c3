"""Math shared by both backends: attention and activations. Pure functions on arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

ACTIVATIONS = {"gelu": jax.nn.gelu, "tanh": jnp.tanh, "relu": jax.nn.relu}


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, num_heads: int) -> jax.Array:
    """softmax(q k^T / sqrt(d_head) + causal mask) v, per head.

    q, k, v: [..., T, D] with D = num_heads * d_head. Returns [..., T, D].
    """
    *lead, seq, width = q.shape
    d_head = width // num_heads

    def heads(x):  # [..., T, D] -> [..., H, T, d_head]
        return jnp.swapaxes(x.reshape(*lead, seq, num_heads, d_head), -3, -2)

    scores = heads(q) @ jnp.swapaxes(heads(k), -1, -2) / jnp.sqrt(d_head).astype(q.dtype)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    context = jax.nn.softmax(scores, axis=-1) @ heads(v)
    return jnp.swapaxes(context, -3, -2).reshape(*lead, seq, width)
