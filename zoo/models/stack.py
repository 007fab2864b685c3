"""A language model's stacked blocks, run in one of two modes by the model's own ``__call__``:
training (:func:`zoo.scan.scan_layers`, under a remat policy, positions 0..T-1) or over a
key/value cache (the prefill and each decode step, :mod:`zoo.models.decode`). Both run each
block's own ``__call__`` over the same stacked params, with the same ``checkpoint_name`` tags
and the same ops (LoRA's adapters included), so training and decoding cannot drift apart.

A block takes ``(x, positions=None, cache=None)`` and returns ``x`` or, with a
:class:`zoo.models.attention.CacheSlice`, ``(x, (k, v))``: the keys and values of its new
tokens, which the caller writes into the cache.
"""

from __future__ import annotations

import jax

from zoo.models import backends
from zoo.models.attention import CacheSlice
from zoo.scan import Remat, scan_layers, tagged


def cached_scan(blocks, h, positions, cache: CacheSlice):
    """The stacked ``blocks`` over new tokens ``h`` [B, S, D] with the cache, one layer's slice
    of ``cache.k``, ``cache.v`` ([L, B, KV / p, T, p * d], or None) at a time: ``(h, (k, v))``, k and v
    [L, B, S, KV * d] the new tokens' keys and values."""
    merge, stacked = backends.of(blocks).layer_modules(blocks)

    def layer(params, h, k, v):
        return merge(params)(h, positions, cache._replace(k=k, v=v))

    def body(h, xs):
        params, k, v = xs
        return tagged(lambda p, h: layer(p, h, k, v))(params, h)

    return jax.lax.scan(body, h, (stacked, cache.k, cache.v))


def run_stack(model, h, *, remat: Remat = "none", positions=None, cache: CacheSlice | None = None):
    """``model.logits`` of the residual stream ``h`` [B, T, D] through ``model.blocks``.

    Training (no ``cache``): the logits of every token. With a cache: ``(logits, (k, v))``, the
    logits of the last new token only ([B, 1, V]: the one the next token is drawn from; a
    prefill of P tokens makes no [B, P, V] array) and what :func:`cached_scan` wrote."""
    if cache is None:
        return model.logits(scan_layers(*model.stack(), h, remat))
    h, written = cached_scan(model.blocks, h, positions, cache)
    return model.logits(h[:, -1:]), written
