"""Ghost clipping of units of several records: users (``dp.unit = "user"``, :mod:`zoo.dp.users`).

A user fills ``k`` record slots of a step (``slots`` [U, k], 1 where filled); its loss is the
mean over its filled slots, so its gradient is ``g_u = sum_j w_j g_j`` with the slot weights
``w_j = slot_j / n_u`` (``n_u`` its filled slots), and ``g_u`` is what is clipped. Ghost
clipping gets ``||g_u||`` and ``sum_u f_u g_u`` without per-user gradients, by two changes and
nothing written per op kind:

* the backward pass that hands out the output gradients starts from the slot weights instead
  of ones (:meth:`Units.row_weights`), so record ``j``'s output gradient is ``w_j dL_j/dz``;
* before a rule sees an op's arrays, the ``[U * k, ...]`` rows are grouped as ``[U, k, ...]``
  (:func:`zoo.dp.ghost.rules.build`, in each norm tap). Each record's gradient of an op is a
  sum over its positions, so the user's is the same sum over the positions of all of its
  records: the rules read the records' axis as positions and give the user's norm and clipped
  sum (a dense op's Gram form runs over the concatenated tokens). The positional table is the exception:
  every record reads its rows 0..T-1, so the records' gradients add row by row.

The model itself still runs on the records (attention stays within one record). The norms,
the clip factors and the clipped sum then run over ``U`` users exactly as over records.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.dp.ghost.rules import by_unit


@dataclass(frozen=True)
class Units:
    """How the rows of a batch make clipping units. ``slots`` ``[U, k]``: row ``u * k + j`` is
    slot ``j`` of unit ``u`` (a user), filled where ``slots > 0``; ``None``: each row is a unit
    of its own (record-level DP). Used while tracing: ``slots`` may be a tracer."""

    slots: jax.Array | None = None

    @classmethod
    def of(cls, slots, rows: int) -> Units:
        """The units of a batch of ``rows`` rows (a shape mismatch is an error)."""
        if slots is None:
            return cls()
        shape = tuple(jnp.shape(slots))
        if len(shape) != 2 or shape[0] * shape[1] != rows:
            raise ValueError(f"slots must have shape [users, k] with users * k = {rows} rows; got {shape}")
        return cls(jnp.asarray(slots))

    @property
    def records(self) -> int:
        """Rows per unit: ``k``, or 1."""
        return 1 if self.slots is None else int(self.slots.shape[1])

    def count(self, rows: int) -> int:
        return rows // self.records

    def _filled(self) -> jax.Array:
        return self.slots > 0

    def row_weights(self) -> jax.Array | None:
        """``[U * k]`` float32 ``w_j = [slot j filled] / max(n_u, 1)``: the cotangent of the
        records' losses whose backward gives each user's mean gradient (``None``: ones)."""
        if self.slots is None:
            return None
        filled = self._filled()
        n = jnp.maximum(filled.sum(axis=1, keepdims=True), 1).astype(jnp.float32)
        return (filled.astype(jnp.float32) / n).reshape(-1)

    def losses(self, losses: jax.Array) -> jax.Array:
        """Per-unit losses ``[U]`` from the records' ``[U * k]``: a user's mean over its filled
        slots (an empty slot adds exactly nothing, even a NaN), as :func:`zoo.dp.users.user_loss`."""
        if self.slots is None:
            return losses
        kept = jnp.where(self._filled().reshape(-1), losses.astype(jnp.float32), 0.0)
        return (kept * self.row_weights()).reshape(self.slots.shape).sum(axis=1)

    def spread(self, weights: jax.Array) -> jax.Array:
        """Per-row weights ``[U * k]`` from per-unit ``[U]``: unit ``u``'s weight times each
        slot's weight (so ``sum_rows weight L_row = sum_u weight_u L_u``)."""
        if self.slots is None:
            return weights
        return jnp.repeat(weights, self.records) * self.row_weights()

    def keep_or_copy(self, a: jax.Array, use: jax.Array) -> jax.Array:
        """``a`` [rows, ...] with the rows of every unit not in ``use`` replaced by those of the
        first unit in it: a zero weight does not silence a batched backward (``0 * NaN``)."""
        units = by_unit(a, self.records)
        first = units[jnp.argmax(use)]
        kept = jnp.where(use.reshape((-1,) + (1,) * (units.ndim - 1)), units, first)
        return kept.reshape(a.shape)

    def vmap_loss(self, batch_losses):
        """The loss of one unit for :func:`zoo.dp.clipped_grad_sum` (on :meth:`vmap_batch`),
        from ``batch_losses(trainable, x [n, ...], y [n, ...]) -> [n]``: a row alone, or a
        user's mean over its filled slots (:func:`zoo.dp.users.user_loss`)."""
        if self.slots is None:
            return lambda trainable, frozen, xi, yi: batch_losses(trainable, xi[None], yi[None])[0]
        from zoo.dp.users import user_loss

        return user_loss(lambda trainable, frozen, x, y: batch_losses(trainable, x, y))

    def vmap_batch(self, x, y):
        """``(x, y)`` as :meth:`vmap_loss` reads them: as they are, or per user as
        :func:`zoo.dp.users.group_users` makes them."""
        if self.slots is None:
            return x, y
        return by_unit(x, self.records), {"y": by_unit(y, self.records), "mask": self.slots}


def from_grouped(batch: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(x [P * k, ...], y [P * k, ...], slots [P, k])`` of a batch as
    :func:`zoo.dp.users.group_users` makes it (``x`` [P, k, ...], ``y`` ``{"y", "mask"}``)."""

    def rows(a):
        return a.reshape((-1,) + a.shape[2:])

    return rows(batch["x"]), rows(batch["y"]["y"]), batch["y"]["mask"]
