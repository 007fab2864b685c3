"""The norm rule of the ``conv`` op: per-example gradient norms of a conv kernel from the op's
input windows and its output gradient (mixed ghost clipping, Bu et al. 2022).

A 2-D conv is a dense op over its output positions: with ``a_p`` the input window read at
output position ``p`` (``kh * kw * in`` values, :func:`zoo.models.ops.conv_patches`) and
``delta_p`` the output gradient there, example ``i``'s kernel gradient is
``g = sum_p a_p^T delta_p`` [kh * kw * in, out]. Its squared norm comes two ways:

* ``"gram"`` (the ghost norm): ``sum_{p,q} (a_p . a_q)(delta_p . delta_q)``, about
  ``P^2 (K + out)`` flops and ``2 P^2`` floats per example for ``P`` positions and
  ``K = kh * kw * in``;
* ``"materialise"`` (the per-example gradient): ``g`` itself, about ``P K out`` flops and
  ``K out`` floats, and ``g`` then serves the clipped sum directly.

:func:`conv_method` takes the cheaper per layer, the same rule as a dense op on a sequence
(:func:`zoo.dp.ghost.rules.dense_method`). For Opacus's MNIST net (``cnn-mnist``) that is the
per-example gradient for conv1 (196 positions, a 64 x 16 kernel) and the ghost norm for
conv2 (25 positions, 256 x 32); :func:`layer_methods` lists the choice for any model.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from zoo.dp.ghost.rules import RULES, Rule, dense_method, keep
from zoo.dp.ghost.sites import discover
from zoo.models.canonical import canonical_shapes


def conv_method(positions: int, window: int, out: int) -> str:
    """``"gram"`` or ``"materialise"`` for a conv with ``positions`` output positions, ``window``
    inputs per position (kh * kw * in) and ``out`` channels: the form with fewer flops."""
    return dense_method(positions, window, out)


class Conv(Rule):
    """``z = conv(x, w) (+ b)``: ``patches`` [B, H', W', kh, kw, in], delta [B, H', W', out]."""

    def __init__(self, patches, d, leaves, rows=None, force=None):
        del rows
        window = tuple(int(n) for n in patches.shape[-3:])
        b = patches.shape[0]
        a = patches.reshape(b, -1, math.prod(window)).astype(jnp.float32)
        d = d.reshape(b, -1, d.shape[-1]).astype(jnp.float32)
        method = force or conv_method(a.shape[1], a.shape[2], d.shape[2])
        self.static = (method, tuple(leaves), window)
        self.arrays = {}
        if "w" in leaves:
            self.arrays = (
                {"g": jnp.einsum("bpk,bpo->bko", a, d)} if method == "materialise" else {"a": a, "d": d}
            )
        if "b" in leaves:
            self.arrays["gb"] = d.sum(axis=1)

    def sq(self):
        method, leaves, _ = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "materialise":
                out["w"] = jnp.sum(jnp.square(arr["g"]), axis=(1, 2))
            else:
                aa = jnp.einsum("bpk,bqk->bpq", arr["a"], arr["a"])
                dd = jnp.einsum("bpo,bqo->bpq", arr["d"], arr["d"])
                out["w"] = jnp.sum(aa * dd, axis=(1, 2))
        if "b" in leaves:
            out["b"] = jnp.sum(jnp.square(arr["gb"]), axis=1)
        return out

    def grad(self, weights, use):
        method, leaves, window = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "materialise":
                g = jnp.einsum("b,bko->ko", weights, keep(arr["g"], use))
            else:
                scaled = keep(arr["d"], use) * weights[:, None, None]
                g = jnp.einsum("bpk,bpo->ko", keep(arr["a"], use), scaled)
            out["w"] = g.reshape(*window, g.shape[-1])
        if "b" in leaves:
            out["b"] = weights @ keep(arr["gb"], use)
        return out


RULES["conv"] = Conv


def layer_methods(cfg, x: jax.Array | jax.ShapeDtypeStruct) -> dict[str, str]:
    """``{site path: "gram" or "materialise"}`` for every conv op of the model ``cfg`` on inputs
    shaped like ``x``: the norm form ghost clipping takes for each (``zoo bench dp`` and
    ``docs/ghost.md`` show it)."""
    sites, _ = discover(cfg, x)
    shapes = canonical_shapes(cfg)
    out = {}
    for site in sites:
        if site.kind == "conv":
            kernel = shapes[f"{site.path}.w"]
            positions = math.prod(site.shape[1:-1])
            out[site.path] = conv_method(positions, math.prod(kernel[-4:-1]), kernel[-1])
    return out
