"""A batch taken a microbatch at a time: the one split order, the one check, the one loop.

``train.microbatch_size = m`` cuts a step's batch of ``B`` rows into ``n = B / m`` microbatches
and runs the step's per-batch work on each of them under one ``jax.lax.scan``, so only one
microbatch's activations are alive at once. What the work returns is declared per output, in the
shape of optax's ``microbatching.micro_vmap`` accumulators:

- :data:`SUM`: added up over the microbatches, in at least float32, then cast back to the
  output's own dtype (a gradient, a clipped sum, a loss already divided by the whole batch's
  count);
- :data:`CONCAT`: one value per row, returned in the batch's own order (per-example norms and
  losses).

Microbatch ``i`` holds rows ``i, i + n, i + 2n, ...``: a batch split over a mesh's batch axis in
contiguous blocks gives every device its share of every microbatch. A sum does not depend on
which rows share a microbatch, only on the order it is added in, and that order is this one.

Every caller accumulates here: the non-private step (its loss and gradient), every DP clipping
method (:func:`zoo.dp.clipping.accumulated_clip`, and the ``microbatch_size`` of
:func:`zoo.dp.clipping.clipped_grad_sum`'s request) and ``zoo bench dp``'s rows. A new
memory setting that cuts the batch is a new output kind here, never a loop of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp

from zoo.checks import is_int
from zoo.precision import float32_scope

__all__ = ["CONCAT", "SUM", "accumulate", "count", "merge", "split", "valid_sizes"]

SUM = "sum"
CONCAT = "concat"
_OUTPUTS = (SUM, CONCAT)
SETTING = "train.microbatch_size"  # the one knob (under DP the clipping reads it too)


def valid_sizes(rows: int) -> list[int]:
    """The microbatch sizes that divide a batch of ``rows`` rows."""
    return [d for d in range(1, rows + 1) if rows % d == 0]


def count(rows: int | None, size: int | None, name: str = SETTING) -> int:
    """How many microbatches of ``size`` rows make a batch of ``rows`` (1 for ``None``).

    A size that is not a positive int, or does not divide the batch, is a ValueError naming
    ``name``, the bad value and the valid sizes: the one message, written here. ``rows=None``
    checks the size alone (a DP run's padded batch is not known yet; it is padded to a multiple
    of the size). The batch is public (under DP the padded size): the refusal depends on no record.
    """
    if size is None:
        return 1
    if not is_int(size) or size < 1 or (rows is not None and rows % size):
        batch = "the batch" if rows is None else f"the batch of {rows} rows"
        valid = "" if rows is None else f"; valid microbatch sizes: {', '.join(map(str, valid_sizes(rows)))}"
        raise ValueError(f"{name} must be a positive int that divides {batch}, got {size!r}{valid}")
    return 1 if rows is None else rows // size


def split(tree, n: int):
    """Every leaf ``[B, ...]`` as ``[n, B / n, ...]``: microbatch ``i`` holds rows ``i::n``."""

    def one(a):
        a = jnp.asarray(a)
        return jnp.swapaxes(a.reshape((a.shape[0] // n, n) + a.shape[1:]), 0, 1)

    return jax.tree.map(one, tree)


def merge(tree):
    """Per-microbatch values ``[n, m, ...]`` back in the batch's order ``[n * m, ...]``."""
    return jax.tree.map(lambda a: jnp.swapaxes(a, 0, 1).reshape((-1,) + a.shape[2:]), tree)


def _wide(dtype) -> jnp.dtype:
    return jnp.promote_types(dtype, jnp.float32)


def accumulate(fn: Callable, batch, n: int, outputs: Sequence[str]) -> tuple:
    """``fn(batch)``'s outputs over ``n`` microbatches of ``batch``, under one ``lax.scan``.

    ``fn(part)`` returns a tuple of pytrees, one per entry of ``outputs`` (:data:`SUM` or
    :data:`CONCAT`); ``batch`` is a pytree of ``[B, ...]`` arrays, all split the same way
    (:func:`split`). ``n == 1`` calls ``fn`` once, on the whole batch. Otherwise each SUM output
    is a float32 (at least) running total, cast back to the dtype ``fn`` gave it; each CONCAT
    output comes back ``[B, ...]`` in the batch's order (:func:`merge`).
    """
    kinds = tuple(outputs)
    for kind in kinds:
        if kind not in _OUTPUTS:
            raise ValueError(f"unknown accumulation {kind!r}; valid: {', '.join(_OUTPUTS)}")
    if n == 1:
        return tuple(fn(batch))
    parts = split(batch, n)
    shapes = jax.eval_shape(lambda p: tuple(fn(p)), jax.tree.map(lambda a: a[0], parts))
    if len(shapes) != len(kinds):
        raise ValueError(f"fn returned {len(shapes)} outputs for {len(kinds)} accumulations {kinds}")
    summed = [i for i, kind in enumerate(kinds) if kind == SUM]

    def body(carry, part):
        out = tuple(fn(part))
        with float32_scope("f32_accumulate"):
            carry = tuple(
                jax.tree.map(lambda c, o: c + o.astype(c.dtype), total, out[i])
                for total, i in zip(carry, summed, strict=True)
            )
        return carry, tuple(o for i, o in enumerate(out) if kinds[i] == CONCAT)

    zeros = tuple(jax.tree.map(lambda s: jnp.zeros(s.shape, _wide(s.dtype)), shapes[i]) for i in summed)
    totals, stacked = jax.lax.scan(body, zeros, parts)
    totals, stacked = iter(totals), iter(stacked)
    result = []
    for i, kind in enumerate(kinds):
        if kind == SUM:
            result.append(jax.tree.map(lambda t, s: t.astype(s.dtype), next(totals), shapes[i]))
        else:
            result.append(merge(next(stacked)))
    return tuple(result)
