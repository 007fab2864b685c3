"""Attention by ``jax.nn.dot_product_attention``: cuDNN's fused (flash) kernel on an NVIDIA GPU.

``attention = "cudnn"`` is the GPU's counterpart of ``"splash"``: no ``[T, T]`` scores in HBM,
the backward pass in the kernel. On a GPU it calls JAX's ``implementation="cudnn"``, which takes
bf16 or fp16 queries, keys and values (a float32 run is refused by cuDNN, in its own words: use
``--precision bfloat16``) and head sizes cuDNN supports. Elsewhere it runs the same function's
XLA implementation, the kernel's definition, as splash runs interpreted off a TPU: that is how
a CPU tests it against dense attention.

It is not ``"auto"``'s pick on a GPU until a GPU has measured it beside dense attention
(``benchmarks/device/chip_parts.sh first-look`` puts zoo's two steps beside plain JAX's).
Grouped-query attention passes the key heads as they are: the kernel reads each key once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def implementation() -> str | None:
    """``"cudnn"`` on an NVIDIA GPU, else None (JAX's XLA implementation of the same function)."""
    return "cudnn" if jax.default_backend() == "gpu" else None


def cudnn(q, k, v, heads: int, kv_heads: int, *, causal: bool = True, key_mask=None) -> jax.Array:
    """``softmax(q k^T / sqrt(d_head) + mask) v`` by ``jax.nn.dot_product_attention``.

    q: [..., T, H * d]; k, v: [..., T, KV * d]; ``key_mask`` [..., T] (True: a real key) or
    None. -> [..., T, H * d] in q's dtype. Any leading axes (none under a per-example ``vmap``)
    are one batch axis to the kernel."""
    *lead, seq, width = q.shape
    d_head, rows = width // heads, math.prod(lead)

    def split(x, n):  # [..., T, n * d] -> [rows, T, n, d]: the kernel's layout, no transpose
        return x.reshape(rows, seq, n, d_head)

    mask = None
    if key_mask is not None:  # [rows, 1, 1, T]: every head and query row reads the same keys
        mask = jnp.broadcast_to(jnp.asarray(key_mask, bool), (*lead, seq)).reshape(rows, 1, 1, seq)
    out = jax.nn.dot_product_attention(
        split(q, heads),
        split(k, kv_heads),
        split(v, kv_heads),
        mask=mask,
        is_causal=bool(causal),
        implementation=implementation(),
    )
    return out.reshape(*lead, seq, width).astype(q.dtype)
