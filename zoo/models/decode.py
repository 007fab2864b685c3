"""Decoding with a key/value cache: what a language-model kind registers so that
:mod:`zoo.generate` samples it with one prefill and one compiled decode loop.

A kind's cache module defines a :class:`DecodeCache` (its limit, its key/value heads and how
one block reads and writes the cache) and names it when the kind registers
(``register(..., cache="zoo.models.<kind>.cache:CACHE")``). The rest is here, written once:
the cache arrays, the scan over the stacked blocks with each layer's slice of the cache, and
attention over the cache, dense or in key chunks (``cfg.attention``).

The cache holds, for each layer, the keys and values of every slot written so far:
``k``, ``v`` [L, B, kv_heads, T, head_dim]: each head's keys are one contiguous [T, head_dim]
matrix, the layout XLA's CPU dot reads fastest (one layer's attention over a batch-8, 768-slot
cache of transformer-s: 4.2 ms in ``[B, T, kv_heads, head_dim]``, 0.7 ms here). Prompts are left-padded to one length P: row b's
prompt fills slots [P - len_b, P), its pad slots are never read, and every row writes the same
slot at each decode step (one ``dynamic_update_slice`` for all layers). Positions are per row:
the token in slot s of row b sits at position ``s - (P - len_b)``.
"""

from __future__ import annotations

import importlib
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

_NEG = -1e30  # masked scores: finite, so a row with nothing to read gives zeros, not NaN


class Cache(NamedTuple):
    """Keys and values of every layer: [L, B, kv_heads, T, head_dim] each."""

    k: jax.Array
    v: jax.Array


class DecodeCache:
    """What a kind's cache module defines (a subclass, registered as one instance).

    ``block(cfg, block, h, positions, attend)`` runs one block on the new tokens ``h``
    [B, S, D] at ``positions`` [B, S]: it computes q, k and v as the block's own forward does
    (rotary applied at ``positions`` where the kind has it), calls ``attend(q, k, v)`` (q
    [B, S, heads * head_dim], k and v [B, S, kv_heads * head_dim]) for the context
    [B, S, heads * head_dim], and returns ``(h, k, v)``: the block's output and the k, v the
    cache keeps.
    """

    limit_name = "max_len"  # the config field that bounds prompt + new tokens, in user terms

    def limit(self, cfg) -> int:
        """Positions the model can attend to (prompt plus new tokens)."""
        return cfg.max_len

    def check(self, cfg) -> None:
        """Raise ValueError when ``cfg`` cannot generate (not a language model over token ids)."""
        if not cfg.task_type.tokenized:
            raise ValueError(f"{type(cfg).__name__} is a {cfg.task} model; generation needs a language model")

    def kv_heads(self, cfg) -> int:
        raise NotImplementedError

    def head_dim(self, cfg) -> int:
        raise NotImplementedError

    def embed(self, cfg, model, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """Token ids [B, S] at ``positions`` [B, S] -> the residual stream [B, S, D]."""
        raise NotImplementedError

    def block(self, cfg, block, h, positions, attend):
        raise NotImplementedError

    def head(self, cfg, model, h: jax.Array) -> jax.Array:
        """The final norm and the LM head: [B, S, D] -> logits [B, S, V]."""
        raise NotImplementedError


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


def cache_dtype(params) -> jnp.dtype:
    """The dtype the cache keeps: that of the token table (the params' compute dtype)."""
    return jnp.asarray(params["embed"]["w"]).dtype


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


def _layers(blocks):
    """``(merge, stacked)``: the stacked blocks' arrays (leading layer axis) and the function
    that makes one layer's block module from its slice (the backend's adapter)."""
    from zoo.models import backends

    return backends.of(blocks).layer_modules(blocks)


def forward(cfg, backend: str, params, cache: Cache, tokens, positions, pad, slot, *, prefill: bool):
    """The new tokens through the model with the cache: ``(logits [B, V] of the last new
    token, cache with the new keys and values written)``.

    tokens, positions: [B, S]; they go to slots [slot, slot + S). ``pad`` [B]: the first slot
    each row may read (its left padding ends there). ``prefill``: the cache holds nothing yet,
    so only the new keys are read.
    """
    from zoo.models.canonical import from_canonical

    spec = cache_spec(cfg)
    model = from_canonical(cfg, backend, params)
    merge, stacked = _layers(model.blocks)
    h = spec.embed(cfg, model, tokens, positions)
    heads, kv = cfg.num_heads, spec.kv_heads(cfg)
    chunk = cfg.attention_chunk if cfg.attention == "chunked" else 0

    def layer(h, xs):
        past = None if prefill else (xs[1], xs[2])

        def attend(q, k, v):
            return attention(q, k, v, heads, kv, past=past, pad=pad, slot=slot, chunk=chunk)

        h, k, v = spec.block(cfg, merge(xs[0]), h, positions, attend)
        return h, (k, v)

    xs = (stacked,) if prefill else (stacked, cache.k, cache.v)
    h, (k, v) = jax.lax.scan(layer, h, xs)
    logits = spec.head(cfg, model, h[:, -1:])[:, 0].astype(jnp.float32)
    batch, seq = tokens.shape
    shape = (cfg.num_layers, batch, seq, kv, spec.head_dim(cfg))
    at = (0, 0, 0, slot, 0)
    k = jax.lax.dynamic_update_slice(cache.k, jnp.swapaxes(k.reshape(shape), 2, 3).astype(cache.k.dtype), at)
    v = jax.lax.dynamic_update_slice(cache.v, jnp.swapaxes(v.reshape(shape), 2, 3).astype(cache.v.dtype), at)
    return logits, Cache(k, v)


# --- attention over the cache -------------------------------------------------------------
# softmax over the union of two key sets, the cache's and the new tokens', kept as running
# (max, normaliser, weighted sum) triples and merged: the new keys are never copied into the
# cache before they are read, so a step reads the cache and writes one slot.


def _part(q, k, v, ok):
    """``(m, l, acc)`` of q [B, KV, G, S, d] over keys k, v [B, KV, T, d] where ``ok``
    [B, S, T]: the row max, the normaliser and the unnormalised output, float32."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = jnp.einsum("bkgsd,bktd->bkgst", q, k).astype(jnp.float32) * scale
    ok = ok[:, None, None]
    s = jnp.where(ok, s, _NEG)
    m = s.max(-1)
    p = jnp.where(ok, jnp.exp(s - m[..., None]), 0.0)
    acc = jnp.einsum("bkgst,bktd->bkgsd", p.astype(v.dtype), v).astype(jnp.float32)
    return m, p.sum(-1), acc


def _merge(a, b):
    (ma, la, xa), (mb, lb, xb) = a, b
    m = jnp.maximum(ma, mb)
    fa, fb = jnp.exp(ma - m), jnp.exp(mb - m)
    return m, la * fa + lb * fb, xa * fa[..., None] + xb * fb[..., None]


def _over(q, k, v, ok_fn, chunk: int):
    """:func:`_part` over all of k, v [B, KV, T, d] (``chunk`` 0) or ``chunk`` keys at a time
    (a scan: no [S, T] scores built at once). ``ok_fn(start, size)`` -> [B, S, size]."""
    seq = k.shape[2]
    if not chunk or chunk >= seq:
        return _part(q, k, v, ok_fn(0, seq))
    chunk = math.gcd(seq, chunk)  # slots come in powers of two; a chunk that divides them

    def step(carry, i):
        start = i * chunk
        kc = jax.lax.dynamic_slice_in_dim(k, start, chunk, axis=2)
        vc = jax.lax.dynamic_slice_in_dim(v, start, chunk, axis=2)
        return _merge(carry, _part(q, kc, vc, ok_fn(start, chunk))), None

    b, kv, g, s, d = q.shape
    init = (
        jnp.full((b, kv, g, s), _NEG, jnp.float32),
        jnp.zeros((b, kv, g, s), jnp.float32),
        jnp.zeros((b, kv, g, s, d), jnp.float32),
    )
    out, _ = jax.lax.scan(step, init, jnp.arange(seq // chunk))
    return out


def attention(q, k, v, heads: int, kv_heads: int, *, past, pad, slot, chunk: int = 0):
    """Causal attention of the new tokens' q [B, S, H * d] over the cached keys and values
    ``past`` (k, v [B, KV, T, d], or None) and their own k, v [B, S, KV * d].

    A query at slot ``slot + i`` of row b reads the cached slots in [pad_b, slot) and the new
    slots in [max(pad_b, slot), slot + i]. Returns [B, S, H * d].
    """
    b, s, width = q.shape
    d = width // heads
    qh = jnp.moveaxis(q.reshape(b, s, kv_heads, heads // kv_heads, d), 1, 3)  # [B, KV, G, S, d]
    kh, vh = (jnp.swapaxes(x.reshape(b, s, kv_heads, d), 1, 2) for x in (k, v))  # [B, KV, S, d]
    rows = jnp.arange(s)

    def new_ok(start, size):
        keys = start + jnp.arange(size)
        causal = keys[None, :] <= rows[:, None]
        return causal[None] & (slot + keys >= pad[:, None])[:, None, :]

    out = _over(qh, kh, vh, new_ok, chunk)
    if past is not None:

        def past_ok(start, size):
            keys = start + jnp.arange(size)
            ok = (keys[None, :] >= pad[:, None]) & (keys[None, :] < slot)
            return jnp.broadcast_to(ok[:, None, :], (b, s, size))

        out = _merge(_over(qh, past[0], past[1], past_ok, chunk), out)
    _, norm, acc = out
    context = acc / jnp.where(norm > 0, norm, 1.0)[..., None]  # [B, KV, G, S, d]
    return jnp.moveaxis(context, 3, 1).reshape(b, s, width).astype(q.dtype)
