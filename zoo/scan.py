"""Run a stack of identical layers with `lax.scan`, under a remat policy.

This is the one place where layers are scanned, and where a policy meets the model: the scan
body is wrapped in ``jax.checkpoint``. Both backends call :func:`scan_layers` with a pure
``layer_fn``; the residual inspector and ghost clipping reach the stack through the model, so
they run this same scan. The stack also owns the frozen prefix, nested groups, and per-layer
hooks (:mod:`zoo.hooks`): arrays scanned along with the layers and returned per layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
from jax.ad_checkpoint import checkpoint_name

from zoo import hooks, names
from zoo.grouped import run_grouped
from zoo.remat import RematPolicy, get_policy

LayerFn = Callable  # (layer_params, h) -> h


@dataclass(frozen=True)
class StackPlan:
    """How a stack runs: the remat policy, and how many leading layers are frozen.

    Frozen layers run first, as their own scan on ``stop_gradient`` weights and without hooks.
    When their input needs no gradient either, autodiff never linearises them: no residuals,
    no backward.
    """

    policy: RematPolicy
    frozen_prefix: int = 0


# What a model's ``remat`` argument may be: a StackPlan, or a policy (or its name) for a
# StackPlan with no frozen prefix.
Remat = StackPlan | RematPolicy | str


def as_plan(remat: Remat) -> StackPlan:
    if isinstance(remat, StackPlan):
        return remat
    return StackPlan(get_policy(remat))


def tagged(layer_fn: LayerFn) -> LayerFn:
    """Tag the block input as ``layer_input`` inside the (checkpointed) body, so a policy can
    save or offload it by name."""

    def body(layer_params, h):
        return layer_fn(layer_params, checkpoint_name(h, names.LAYER_INPUT))

    return body


def layer_body(layer_fn: LayerFn, policy: RematPolicy | str) -> LayerFn:
    """The function the scan runs per layer: the tagged block, wrapped by the policy."""
    policy = get_policy(policy)
    if policy.grouped:  # the inner layers of a grouped scan recompute everything
        return get_policy("full").wrap(tagged(layer_fn))
    return policy.wrap(tagged(layer_fn))


def num_groups(num_layers: int) -> int:
    """Group count for nested remat: the divisor of L closest to sqrt(L)."""
    divisors = [g for g in range(1, num_layers + 1) if num_layers % g == 0]
    return min(divisors, key=lambda g: (abs(g - math.sqrt(num_layers)), g))


def recursive_levels(n: int) -> tuple[int, ...]:
    """Scan lengths whose product is ``n`` and whose sum is smallest: the prime factors, with
    pairs of 2s merged into 4s (2 + 2 = 4: the same sum, one level fewer), largest first.

    The sum is what the stack holds in block inputs, and with :mod:`zoo.grouped`'s backward it
    is what the temp memory follows (measured in ``docs/remat.md``, with its commands). Each
    level costs one more forward pass over the layers, so of equal sums the fewer levels win.
    """
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    if n > 1:
        factors.append(n)
    twos = factors.count(2)
    merged = [4] * (twos // 2) + [2] * (twos % 2) + [f for f in factors if f != 2]
    return tuple(sorted(merged, reverse=True)) or (1,)


def stack_levels(policy: RematPolicy, num_layers: int) -> tuple[int, ...] | None:
    """The scan lengths of a grouped stack, outermost first (their product is L), or None.

    ``nested``: (G, L/G) with G the divisor closest to sqrt(L). ``recursive``:
    :func:`recursive_levels`, so L = 64 runs as three scans of four. Level i keeps its scan
    length in block inputs while the backward pass replays it, so the stack holds about
    ``sum(levels)`` block inputs at a time: 2 sqrt(L) for nested, 2 log2(L) for recursive at
    a power of two.
    """
    if policy.nested:
        groups = num_groups(num_layers)
        return (groups, num_layers // groups)
    if policy.recursive:
        return recursive_levels(num_layers)
    return None


def _num_layers(stacked) -> int:
    leaves = jax.tree_util.tree_leaves(stacked)
    return leaves[0].shape[0] if leaves else 0


def _scan(body, xs, h):
    """``(h, ys)`` of ``body(x, h) -> (h, y)`` scanned over the leading axis of ``xs``."""
    return jax.lax.scan(lambda carry, x: body(x, carry), h, xs)


def scan_layers(layer_fn: LayerFn, stacked_params, h, remat: Remat = "none"):
    """Apply ``layer_fn`` once per layer along the leading axis of ``stacked_params``.

    ``remat`` names a policy (see :mod:`zoo.remat`) or gives a :class:`StackPlan`.
    With a ``nested`` policy the L layers run as G groups of L/G: the outer scan keeps only
    each group's input, and a group's inner scan is replayed during the backward pass. A
    ``recursive`` policy does the same on every level of :func:`stack_levels`.
    Under active :mod:`zoo.hooks`, the layers after the frozen prefix run with per-layer hooks.
    """
    plan = as_plan(remat)
    k = plan.frozen_prefix
    active = hooks.current()
    stack_hooks = active.stack(stacked_params, k) if active is not None else None
    if k:
        frozen = jax.tree_util.tree_map(lambda a: jax.lax.stop_gradient(a[:k]), stacked_params)
        with hooks.active(None):
            h, _ = _scan_policy(_plain(layer_fn), frozen, h, plan.policy)
        stacked_params = jax.tree_util.tree_map(lambda a: a[k:], stacked_params)
    if stack_hooks is None:
        with hooks.active(None):
            return _scan_policy(_plain(layer_fn), stacked_params, h, plan.policy)[0]

    def hooked(layer, carry):
        layer_hooks = stack_hooks.layer(layer["hooks"], layer["params"])
        with hooks.active(layer_hooks):
            out = layer_fn(layer["params"], carry)
        return out, layer_hooks.outputs()

    h, ys = _scan_policy(hooked, {"params": stacked_params, "hooks": stack_hooks.xs}, h, plan.policy)
    stack_hooks.finish(ys)
    return h


def _plain(layer_fn: LayerFn):
    return lambda layer, carry: (layer_fn(layer, carry), None)


def _scan_policy(layer_fn, stacked, h, policy: RematPolicy):
    """``(h, per-layer outputs)`` of ``layer_fn(layer, h) -> (h, y)`` over the stack."""
    num_layers = _num_layers(stacked)
    if num_layers == 0:
        return h, None
    body = layer_body(layer_fn, policy)
    levels = stack_levels(policy, num_layers)
    return _scan(body, stacked, h) if levels is None else _scan_levels(body, stacked, h, levels)


def _scan_levels(body, stacked, h, levels: tuple[int, ...]):
    """``levels[0]`` checkpointed groups, each the same structure over ``levels[1:]``: one
    level is a plain scan of the (checkpointed) body; more go to :func:`zoo.grouped.run_grouped`,
    which writes the backward pass by hand."""
    if len(levels) == 1:
        return _scan(body, stacked, h)
    return run_grouped(body, stacked, h, levels)


def scan_levels(layer_fn: LayerFn, stacked_params, h, levels: tuple[int, ...]):
    """The grouped stack over ``levels`` with every block recomputed (what the backward pass
    replays inside a group); the residual inspector measures it."""
    return _scan_levels(layer_body(_plain(layer_fn), "full"), stacked_params, h, levels)[0]
