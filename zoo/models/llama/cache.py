"""Llama's decode cache: rotary q and k turned at each token's absolute position, grouped-query
heads (the cache holds ``num_kv_heads`` key/value heads, not ``num_heads``). Same ops, same
order as the block's forward (``nnx.py``, ``eqx.py``); ``zoo.models.decode`` runs it over the
cache."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from zoo.models import ops
from zoo.models.decode import DecodeCache


def rotary_at(x: jax.Array, positions: jax.Array, num_heads: int, theta: float, freq=None) -> jax.Array:
    """:func:`zoo.models.ops.rotary` at explicit ``positions`` [B, S] (not 0..T-1): the pair
    (i, i + d_head/2) of each head turns by ``position * freq[i]``."""
    *lead, seq, width = x.shape
    d_head = width // num_heads
    half = d_head // 2
    if freq is None:
        freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2 / d_head)
    freq = jnp.asarray(freq, jnp.float32)
    angle = positions.astype(jnp.float32)[..., None] * freq  # [B, S, half]
    cos, sin = jnp.cos(angle)[..., None, :], jnp.sin(angle)[..., None, :]  # [B, S, 1, half]
    xh = x.reshape(*lead, seq, num_heads, d_head)
    a, b = xh[..., :half], xh[..., half:]
    turned = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return turned.reshape(*lead, seq, width).astype(x.dtype)


class LlamaCache(DecodeCache):
    limit_name = "max_len (max_position_embeddings)"  # rotary: the positions it was made for

    def kv_heads(self, cfg) -> int:
        return cfg.num_kv_heads

    def head_dim(self, cfg) -> int:
        return cfg.d_head

    def embed(self, cfg, model, tokens, positions):
        return ops.embed(model.embed, tokens)

    def block(self, cfg, block, h, positions, attend):
        attn, freq = block.attn, cfg.rope_freq()
        x = ops.rms_norm(block.attn_norm, h)
        q, k, v = ops.dense(attn.q, x), ops.dense(attn.k, x), ops.dense(attn.v, x)
        q = rotary_at(q, positions, cfg.num_heads, cfg.rope_theta, freq)
        k = rotary_at(k, positions, cfg.num_kv_heads, cfg.rope_theta, freq)
        h = h + ops.dense(attn.o, attend(q, k, v))
        return h + ops.token_chunks(block.mlp_branch, h, cfg.mlp_chunk), k, v

    def head(self, cfg, model, h):
        h = ops.rms_norm(model.norm_f, h)
        return ops.unembed(model.embed, h) if model.head is None else ops.head(model.head, h)


CACHE = LlamaCache()
