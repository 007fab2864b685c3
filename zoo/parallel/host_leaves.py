"""The pieces of the pipelined host step (:mod:`zoo.parallel.host_step`): a leaf cut into
chunks for its trips, and the optimizer's update of one leaf.

Why chunks: on a TPU v5e the float32 gradient of ``llama-1b`` came down at 1.83 GB/s as a
tree of 11 leaves and at 0.65 GB/s as one array (``benchmarks/device/RESULTS.md``): copies
issued side by side run side by side, one huge copy runs alone. So no trip is one huge array:
a leaf is cut along its first axis into pieces of at most ``chunk_bytes`` (a layer-stacked
leaf into groups of layers, the token table into groups of rows), cut on the device by a
slicing program (HBM bandwidth: milliseconds) and joined there after its trip up.

Why per leaf: the update of one leaf can start as soon as that leaf's gradient is on the
host, while the other leaves are still on their way down, and its params can go up while the
others are updated. The optimizer is optax's, the device step's own (``engine.optimizer``):
its update is applied to a one-leaf tree (``{"leaf": x}``) with the leaf's slice of the
optimizer state. Every optax transformation zoo builds (:func:`zoo.train.state.make_optimizer`:
AdamW or SGD, weight decay, a schedule) is elementwise within a leaf but one:
``clip_by_global_norm`` reads the norm of the whole gradient (``optax.tree.norm``). The device
computes that norm once (it is the step's ``grad_norm`` too) and sends it down as a scalar; the
one-leaf program is traced with ``optax.tree.norm`` answering it (:func:`norm_answered`), so
each leaf is clipped by the whole tree's norm, element for element as the whole-tree program
clips it. An optimizer that reads any other quantity across leaves would be wrong here: the
tests compare the pipelined step with the whole-tree one, bit for bit, for zoo's optimizers.
"""

from __future__ import annotations

import contextlib
import math
import threading

import jax
import jax.numpy as jnp
import optax

from zoo.parallel.host_budget import update_bytes

CHUNK_BYTES = 64 * 2**20
ONE = jax.tree.structure({"leaf": 0, "twin": 0})
_TRACING = threading.Lock()  # one trace at a time under the answered norm


def row_bounds(shape: tuple[int, ...], nbytes: int, chunk_bytes: int) -> tuple[int, ...]:
    """Where a leaf of ``shape`` (``nbytes`` in float32) is cut along its first axis: the
    edges ``(0, ..., shape[0])`` of pieces of at most ``chunk_bytes`` each where the axis
    allows it, as equal as the rows allow (the first ``rows % n`` pieces one row longer).
    A scalar or a leaf of one row is one piece, ``(0, rows)``."""
    rows = shape[0] if shape else 1
    n = max(1, min(rows, math.ceil(nbytes / chunk_bytes)))
    size, extra = divmod(rows, n)
    edges = [0]
    for i in range(n):
        edges.append(edges[-1] + size + (i < extra))
    return tuple(edges)


def cut(x: jax.Array, edges: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """``x``'s rows between consecutive ``edges`` (one piece: ``x`` itself, a scalar too)."""
    if len(edges) == 2:
        return (x,)
    return tuple(x[a:b] for a, b in zip(edges, edges[1:], strict=False))


def _join(chunks: tuple[jax.Array, ...]) -> jax.Array:
    return jnp.concatenate(chunks, axis=0)


split = jax.jit(cut, static_argnums=1)  # on the device: a leaf into its pieces
join = jax.jit(_join)  # on the device: the pieces of a leaf, one array again


def pieces(x: jax.Array, edges: tuple[int, ...]) -> tuple[jax.Array, ...]:
    """``x`` cut at ``edges`` (no program for one piece)."""
    return (x,) if len(edges) == 2 else split(x, edges)


def down_pieces(p, edges: tuple[int, ...], sharding) -> tuple[jax.ShapeDtypeStruct, ...]:
    """The pieces of a leaf like ``p``'s gradient (its dtype, the masters') as they come down
    and the host's update program takes them."""
    if len(edges) == 2:
        return (jax.ShapeDtypeStruct(p.shape, p.dtype, sharding=sharding),)
    rest = tuple(p.shape[1:])
    return tuple(
        jax.ShapeDtypeStruct((b - a, *rest), p.dtype, sharding=sharding)
        for a, b in zip(edges, edges[1:], strict=False)
    )


def whole(chunks: tuple[jax.Array, ...]) -> jax.Array:
    """The pieces of a leaf joined (no program for one piece)."""
    return chunks[0] if len(chunks) == 1 else join(chunks)


def by_leaf(tree, treedef) -> tuple[list, list, object]:
    """``tree`` (an optimizer state) as ``(groups, shared, outer)``: ``groups`` its subtrees
    shaped as the params (``treedef``: optax's moments), each a list with one entry a leaf;
    ``shared`` its other leaves (step counts); ``outer`` what :func:`from_leaf` rebuilds from."""
    parts, outer = jax.tree.flatten(tree, is_leaf=lambda node: jax.tree.structure(node) == treedef)
    kinds = [jax.tree.structure(p) == treedef for p in parts]
    groups = [treedef.flatten_up_to(p) for p, k in zip(parts, kinds, strict=True) if k]
    shared = [p for p, k in zip(parts, kinds, strict=True) if not k]
    return groups, shared, (outer, tuple(kinds))


def from_leaf(outer, moments, shared):
    """An optimizer state of a one-leaf tree: each params-shaped group as ``{"leaf": moment}``."""
    tree, kinds = outer
    moments, shared = iter(moments), iter(shared)
    parts = [_one(next(moments)) if k else next(shared) for k in kinds]
    return jax.tree.unflatten(tree, parts)


def _one(x: jax.Array) -> dict:
    """A one-leaf tree as the update sees it: the leaf and its scalar twin (zero), so that each
    scalar the optimizer shares across leaves (Adam's bias corrections) has two users, as in
    any tree of two leaves or more. XLA rewrites a division by a scalar with one user into a
    product with its reciprocal (one ulp off); with two it divides, as the whole-tree program
    does. The program returns the twin's new value (else XLA drops its division too); the
    caller drops it."""
    return {"leaf": x, "twin": jnp.zeros((), x.dtype)}


@contextlib.contextmanager
def norm_answered(norm):
    """While a one-leaf update is traced: ``optax.tree.norm`` (``clip_by_global_norm``'s norm)
    answers ``norm``, the whole gradient's, instead of the one leaf's."""
    real = optax.tree.norm
    optax.tree.norm = lambda tree, *args, **kwargs: norm
    try:
        yield
    finally:
        optax.tree.norm = real


class LeafUpdates:
    """The optimizer's update of one leaf, on the host, fused with the cast of its new value to
    the compute dtype and its cut into the pieces that go up. One compiled program per leaf
    shape (``compiles``), traced in the calling thread under :func:`norm_answered`; the
    params and the moments donated, so the update writes in place as the whole-tree one does."""

    def __init__(self, optimizer, precision) -> None:
        self.optimizer = optimizer
        self.precision = precision
        self.treedef = None  # the params' tree, from the first state prepared
        self._compiled: dict = {}
        self._held: dict = {}  # each program's bytes (XLA's analysis, read once)

    @property
    def compiles(self) -> int:
        return len(self._compiled)

    def _program(self, edges: tuple[int, ...]):
        def one_leaf(p, moments, shared, norm, grads):
            g = grads[0] if len(grads) == 1 else jnp.concatenate(grads, axis=0)
            state = from_leaf(self.outer, moments, shared)
            with norm_answered(norm):
                updates, state = self.optimizer.update(_one(g), state, _one(p))
            new = optax.apply_updates(_one(p), updates)
            moments, shared, _ = by_leaf(state, ONE)
            up = self.precision.to_compute(new)["leaf"]
            # The twin's value is returned (and dropped by the caller) so that XLA keeps it.
            return new["leaf"], tuple(m[0] for m in moments), tuple(shared), cut(up, edges), new["twin"]

        return jax.jit(one_leaf, donate_argnums=(0, 1))

    def prepare(self, opt_state, treedef) -> tuple[list[tuple], list]:
        """``(moments of each leaf, shared leaves)`` of the whole-tree ``opt_state`` of params
        of the tree ``treedef``."""
        self.treedef = treedef
        groups, shared, self.outer = by_leaf(opt_state, self.treedef)
        return [tuple(g[k] for g in groups) for k in range(self.treedef.num_leaves)], shared

    def compile(self, p, moments, shared, norm, grads, edges):
        """The program for a leaf like ``p``, compiled once per shape (in the calling thread:
        the pool's threads only run compiled programs)."""
        key = _key(p, grads, edges)
        if key not in self._compiled:
            with _TRACING:
                self._compiled[key] = self._program(edges).lower(p, moments, shared, norm, grads).compile()
        return self._compiled[key]

    def held_bytes(self, p, grads, edges) -> int:
        """The host bytes the update of a leaf like ``p`` holds beside the state (its weight in
        the step's budget: :func:`zoo.parallel.host_budget.update_bytes`), from its program as
        :meth:`compile` compiled it."""
        key = _key(p, grads, edges)
        if key not in self._held:
            self._held[key] = update_bytes(self._compiled[key], grads)
        return self._held[key]

    def rebuild(self, moments: list[tuple], shared: list):
        """The whole-tree optimizer state from each leaf's new moments and the shared leaves."""
        tree, kinds = self.outer
        groups = [self.treedef.unflatten([m[i] for m in moments]) for i in range(len(moments[0]))]
        groups, shared = iter(groups), iter(shared)
        return jax.tree.unflatten(tree, [next(groups) if k else next(shared) for k in kinds])


def _key(p, grads, edges) -> tuple:
    """A leaf update's program's key: one program per leaf shape and cut."""
    return (p.shape, p.dtype, tuple(g.shape for g in grads), edges)
