"""Freeze parts of a model by path pattern, on canonical parameter trees.

A pattern names canonical dotted paths (``embed.w``, ``blocks.attn.q.w``, ``head.b``...):

* a plain path selects every leaf at or below it, on segment boundaries: ``embed`` selects
  ``embed.w``; ``blocks.attn`` selects all attention leaves; ``head.w`` selects just that leaf;
* ``*`` and ``?`` are fnmatch wildcards (``*`` also crosses dots). A glob selects a leaf when
  it matches the leaf's full path or one of its ancestors: ``head.*``, ``blocks.*.b``, ``*.b``;
* directly after ``blocks`` (the scanned stack, whose leaves carry a leading L axis) a layer
  index or Python slice restricts the pattern to those layers: ``blocks[0:4]``,
  ``blocks[0:4].mlp.*``, ``blocks[2]``, ``blocks[-1]``, ``blocks[:2]``, ``blocks[2:]``,
  ``blocks[::2]``. Square brackets mean layer ranges only (no fnmatch character classes).

Patterns are OR-ed. :func:`resolve_freeze` turns them into a :class:`FreezePlan`, which
splits canonical params into a ``trainable`` and a ``frozen`` tree and merges them back
exactly. Stacked leaves may be frozen row by row (one row = one layer).

Typical use::

    plan = resolve_freeze(params, ["embed", "pos", "blocks[0:2]"])
    trainable, frozen = plan.split(params)
    loss = loss_of(cfg, backend, plan.stack_plan("full"))   # frozen_prefix=2: no backward there
    grads = jax.grad(lambda t: loss(plan.merge(t, frozen), x, y))(trainable)
"""

from zoo.freeze.patterns import Pattern, parse_pattern
from zoo.freeze.plan import STACK, FreezePlan, Trainable, plan_of, resolve_freeze

__all__ = ["STACK", "FreezePlan", "Pattern", "Trainable", "parse_pattern", "plan_of", "resolve_freeze"]
