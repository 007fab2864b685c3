"""Decoding with a key/value cache: the cache arrays and one step of the model over them, for
:mod:`zoo.generate` (one prefill and one compiled decode loop).

The model decodes through its own ``__call__`` (:mod:`zoo.models.stack`): the kind writes its
blocks once per backend. What the cache needs to know of a kind, its key/value heads, their
width and the positions it can attend to, is a small :class:`DecodeCache` the kind names when
it registers (``register(..., cache="zoo.models.<kind>.cache:CACHE")``).

The cache holds, for each layer, the keys and values of every slot written so far:
``k``, ``v`` [L, B, kv_heads, T, head_dim] (each head's keys one contiguous [T, head_dim]
matrix: :mod:`zoo.models.attention`). Prompts are left-padded to one length P: row b's prompt
fills slots [P - len_b, P), its pad slots are never read, and every row writes the same slot at
each decode step (one ``dynamic_update_slice`` for all layers). Positions are per row: the
token in slot s of row b sits at position ``s - (P - len_b)``. The cache's dtype is the
compute dtype of the precision policy the model runs under (``zoo.generate``).
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.models.attention import CacheSlice


class Cache(NamedTuple):
    """Keys and values of every layer: [L, B, kv_heads, T, head_dim] each."""

    k: jax.Array
    v: jax.Array


class DecodeCache:
    """What a kind's cache module defines (a subclass, registered as one instance): the shape
    of its cache and the limit of its positions."""

    limit_name = "max_len"  # the config field that bounds prompt + new tokens, in user terms

    def limit(self, cfg) -> int:
        """Positions the model can attend to (prompt plus new tokens)."""
        return cfg.max_len

    def check(self, cfg) -> None:
        """Raise ValueError when ``cfg`` cannot generate (not a language model over token ids)."""
        if not cfg.task_type.tokenized:
            raise ValueError(f"{type(cfg).__name__} is a {cfg.task} model; generation needs a language model")

    def kv_heads(self, cfg) -> int:
        return cfg.num_heads

    def head_dim(self, cfg) -> int:
        return cfg.d_head


def cache_spec(cfg) -> DecodeCache:
    """The registered :class:`DecodeCache` of ``cfg``'s kind (ValueError when it has none)."""
    from zoo.models.registry import kind_of

    kind = kind_of(cfg)
    name = getattr(kind, "cache", None)
    if not name:
        raise ValueError(f"model kind {kind.name!r} registers no decode cache, so it cannot generate")
    module, attr = name.split(":")
    spec = getattr(importlib.import_module(module), attr)
    spec.check(cfg)
    return spec


def init_cache(cfg, batch: int, length: int, dtype) -> Cache:
    """An empty cache of ``length`` slots for ``batch`` sequences."""
    spec = cache_spec(cfg)
    shape = (cfg.num_layers, batch, spec.kv_heads(cfg), length, spec.head_dim(cfg))
    return Cache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype))


def cache_bytes(cfg, length: int, dtype) -> int:
    """Bytes of one sequence's cache of ``length`` slots: 2 * L * T * kv_heads * head_dim *
    itemsize."""
    spec = cache_spec(cfg)
    return 2 * cfg.num_layers * length * spec.kv_heads(cfg) * spec.head_dim(cfg) * jnp.dtype(dtype).itemsize


def forward(cfg, backend: str, params, cache: Cache, tokens, positions, pad, slot, *, prefill: bool):
    """The new tokens through the model's own ``__call__`` with the cache: ``(logits [B, V] of
    the last new token, cache with the new keys and values written)``.

    tokens, positions: [B, S]; they go to slots [slot, slot + S). ``pad`` [B]: the first slot
    each row may read (its left padding ends there). ``prefill``: the cache holds nothing yet,
    so only the new keys are read. ``params`` are in the compute dtype.
    """
    from zoo.models.canonical import from_canonical

    model = from_canonical(cfg, backend, params)
    past = (None, None) if prefill else cache
    logits, (k, v) = model(tokens, positions=positions, cache=CacheSlice(*past, pad, slot))
    batch, seq = tokens.shape
    spec = cache_spec(cfg)
    shape = (cfg.num_layers, batch, seq, spec.kv_heads(cfg), spec.head_dim(cfg))
    at = (0, 0, 0, slot, 0)
    k = jax.lax.dynamic_update_slice(cache.k, jnp.swapaxes(k.reshape(shape), 2, 3).astype(cache.k.dtype), at)
    v = jax.lax.dynamic_update_slice(cache.v, jnp.swapaxes(v.reshape(shape), 2, 3).astype(cache.v.dtype), at)
    return logits[:, 0].astype(jnp.float32), Cache(k, v)
