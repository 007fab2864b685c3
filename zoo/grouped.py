"""Grouped stacks (``nested``, ``recursive``): checkpointed levels with a hand-written backward.

A grouped stack runs its L layers as levels of groups (``levels = (4, 4, 4)`` for L = 64):
the forward pass keeps only the input of each outermost group, and the backward pass, one group
at a time from the last, recomputes that group's inner group inputs level by level until it
reaches single layers, which it differentiates. That is recursive checkpointing (the seed's
``chain_compose`` applied to blocks), and ``nested`` is its two-level case.

Written as nested ``jax.checkpoint`` around nested ``lax.scan``, autodiff gets the schedule
right but pays twice in memory for it: every level slices its groups' parameters into a copy,
and every level's backward stacks the parameter gradient of its sub-stack into a buffer of its
own before the level above copies it into place: temp memory the schedule does not need
(``benchmarks/remat/grouped_backward.py`` measures both side by side; the table is in
``docs/remat.md``). Here the backward is written once, as a
``jax.custom_vjp``: each layer reads its parameters straight from the full stack by index, and
the gradient of the whole stack is one buffer that every layer writes its slice of in place.

Layers are still differentiated by JAX (``jax.vjp`` of the layer function), so anything a
layer computes -- per-layer hook outputs included -- has the gradient autodiff gives it; only
the order and the bookkeeping around the layers are ours.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

Body = Callable  # (layer, h) -> (h, y): one layer, y a per-layer output (a pytree, or None)


def _take(tree, i):
    """Layer ``i`` of a stacked pytree (a dynamic index: no copy of the rest of the stack)."""
    return jax.tree_util.tree_map(lambda a: jax.lax.dynamic_index_in_dim(a, i, keepdims=False), tree)


def _put(tree, update, i):
    """``tree`` with layer ``i`` replaced by ``update`` (written in place by XLA); leaves
    without a gradient (None) stay None."""
    return jax.tree_util.tree_map(
        lambda a, u: a if a is None else jax.lax.dynamic_update_index_in_dim(a, u.astype(a.dtype), i, 0),
        tree,
        update,
        is_leaf=lambda x: x is None,
    )


def _differentiable(a) -> bool:
    return jnp.issubdtype(jnp.result_type(a), jnp.inexact)


def _zeros(stacked):
    """The gradient buffer of the stack: zeros for float leaves, None for the others."""
    return jax.tree_util.tree_map(lambda a: jnp.zeros_like(a) if _differentiable(a) else None, stacked)


def _run(body: Body, stacked, h, start, n: int):
    """``(h, ys)``: layers ``[start, start + n)`` forward, their outputs stacked."""
    return jax.lax.scan(lambda h, i: body(_take(stacked, start + i), h), h, jnp.arange(n))


def _group_inputs(body: Body, stacked, h, start, levels: tuple[int, ...]):
    """The inputs of the ``levels[0]`` groups of layers ``[start, start + prod(levels))``,
    stacked ``[levels[0], ...]``, computed forward from ``h``. The last group is not run."""
    groups, size = levels[0], math.prod(levels[1:])

    def step(h, k):
        return _run(body, stacked, h, start + k * size, size)[0], h

    last, inputs = jax.lax.scan(step, h, jnp.arange(groups - 1))
    return jnp.concatenate([inputs, last[None]])


def _backward(body: Body, stacked, inputs, g, g_ys, grads, start, levels: tuple[int, ...]):
    """``(g, grads)`` through layers ``[start, start + prod(levels))``, last group first.

    ``inputs`` holds the input of each of the ``levels[0]`` groups; ``g`` is the cotangent of
    the output of the last layer and becomes that of the input of the first; ``g_ys`` are the
    cotangents of every layer's output y (whole stack); each layer's parameter cotangent is
    written into ``grads`` at its row.
    """
    size = math.prod(levels[1:])

    def step(carry, k):
        g, grads = carry
        h, first = jax.lax.dynamic_index_in_dim(inputs, k, keepdims=False), start + k * size
        if size > 1:
            inner = _group_inputs(body, stacked, h, first, levels[1:])
            return _backward(body, stacked, inner, g, g_ys, grads, first, levels[1:]), None
        _, pullback = jax.vjp(body, _take(stacked, first), h)
        d_layer, g = pullback((g, None if g_ys is None else _take(g_ys, first)))
        return (g, _put(grads, d_layer, first)), None

    (g, grads), _ = jax.lax.scan(step, (g, grads), jnp.arange(levels[0]), reverse=True)
    return g, grads


def run_grouped(body: Body, stacked, h, levels: tuple[int, ...]):
    """``(h, ys)`` of ``body`` over the stack, run as the checkpointed ``levels`` (outermost
    first, product L). The forward keeps ``levels[0]`` group inputs; see the module docstring
    for the backward."""

    @jax.custom_vjp
    def grouped(stacked, h):
        return _run(body, stacked, h, 0, math.prod(levels))

    def forward(stacked, h):
        size = math.prod(levels[1:])

        def group(h, k):
            out, ys = _run(body, stacked, h, k * size, size)
            return out, (h, ys)

        out, (inputs, ys) = jax.lax.scan(group, h, jnp.arange(levels[0]))
        ys = jax.tree_util.tree_map(lambda y: y.reshape(-1, *y.shape[2:]), ys)
        return (out, ys), (stacked, inputs)

    def backward(saved, cotangents):
        stacked, inputs = saved
        g, g_ys = cotangents
        g, grads = _backward(body, stacked, inputs, g, g_ys, _zeros(stacked), 0, levels)
        return grads, g

    grouped.defvjp(forward, backward)
    return grouped(stacked, h)
