"""Decoding with a key/value cache: the cache arrays and one step of the model over them, for
:mod:`zoo.generate` (one prefill and one compiled decode loop).

The model decodes through its own ``__call__`` (:mod:`zoo.models.stack`): the kind writes its
blocks once per backend. What the cache needs to know of a kind, its key/value heads, their
width and the positions it can attend to, is a small :class:`DecodeCache` the kind names when
it registers (``register(..., cache="zoo.models.<kind>.cache:CACHE")``).

The cache holds, for each layer, the keys and values of every slot written so far:
``k``, ``v`` [L, B, kv_heads / p, T, p * head_dim], p heads side by side in each slot's row
(:func:`heads_per_row`; p = 1 except on a TPU, :func:`row_lanes`). Prompts are left-padded to
one length P: row b's prompt
fills slots [P - len_b, P), its pad slots are never read, and every row writes the same slot at
each decode step (one ``dynamic_update_slice`` for all layers). Positions are per row: the
token in slot s of row b sits at position ``s - (P - len_b)``. The cache's dtype is the
compute dtype of the precision policy the model runs under (``zoo.generate``).

Why rows of :data:`LANES`: a TPU keeps an array's last two dimensions in tiles 128 lanes wide,
and a decode step reads the whole cache. With each head's keys a [T, 64] matrix (GPT-2 small,
Llama 3.2 1B), half of every tile is padding: the chip read twice the cache's bytes per step
(GPT-2 small at batch 64: the two cache reads took 4.1 of 5.1 ms a step). The compiler's other
layout, slots along the lanes (which it picks for Llama's grouped heads), costs as much on the
way in: each step's new key is then one lane of every tile, written through an update buffer
padded 128-fold. Two 64-wide heads to a 128-lane row are dense both ways: a step writes one whole
row per row of heads and reads no padding (``benchmarks/generate/RESULTS.md``, "The decode
step's bytes").
"""

from __future__ import annotations

import importlib
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.models.cache_rows import LANES as LANES
from zoo.models.cache_rows import CacheSlice, heads_per_row
from zoo.models.cache_rows import row_lanes as row_lanes


class Cache(NamedTuple):
    """Keys and values of every layer: [L, B, kv_heads / p, T, p * head_dim] each
    (:func:`heads_per_row`)."""

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


def cache_shape(cfg, batch: int, length: int, lanes: int = 1) -> tuple[int, ...]:
    """[L, B, rows, T, p * head_dim]: the shape of ``cfg``'s cache keys (and values), a slot's
    kv_heads in rows = kv_heads / p rows of p heads (:func:`heads_per_row` in ``lanes``)."""
    spec = cache_spec(cfg)
    kv, d = spec.kv_heads(cfg), spec.head_dim(cfg)
    p = heads_per_row(kv, d, lanes)
    return (cfg.num_layers, batch, kv // p, length, p * d)


def init_cache(cfg, batch: int, length: int, dtype, lanes: int = 1) -> Cache:
    """An empty cache of ``length`` slots for ``batch`` sequences, in rows of ``lanes``
    (:func:`row_lanes`: 128 on a TPU)."""
    shape = cache_shape(cfg, batch, length, lanes)
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
    logits, new = model(tokens, positions=positions, cache=CacheSlice(*past, pad, slot))
    layers, batch, rows, _, width = cache.k.shape  # the rows init_cache gave it
    seq = tokens.shape[1]
    at = (0, 0, 0, slot, 0)

    def write(into, x):  # [L, B, S, KV * d] -> the rows of slots [slot, slot + S)
        x = jnp.swapaxes(x.reshape(layers, batch, seq, rows, width), 2, 3)
        return jax.lax.dynamic_update_slice(into, x.astype(into.dtype), at)

    return logits[:, 0].astype(jnp.float32), Cache(*map(write, cache, new))
