"""The params' trip up from the host, in pieces: both host steps' (:mod:`zoo.parallel.host_step`).

Each host leaf is cast to the compute dtype and cut along its first axis into pieces of at most
``chunk_bytes`` by one program on the host (:func:`zoo.parallel.host_leaves.row_bounds`: the
float32 gradient's cut, which the params' pieces follow), the pieces are sent up from a thread
pool, side by side, and joined on the device. On a TPU v5e (``llama-1b``, 2026-12-08,
``benchmarks/device/RESULTS.md``) the whole tree cast and sent up in one ``device_put`` took
5.19 s for its 2.47 GB (0.5 GB/s), where the pipelined step's trips up in pieces took 1.27 s of
busy time summed (how much of the 5.19 s was the host's cast is not known yet:
``benchmarks/device/host_update.py``'s serial rows time the stages). Copies issued side by side
run side by side; one huge copy runs alone (the trip down showed it: 1.83 GB/s as a tree,
0.65 GB/s as one array). The leaves in flight
hold at most a :class:`~zoo.parallel.host_budget.ByteBudget` of cast bytes on the host (by
default twice the largest leaf's).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp

from zoo.parallel.host_budget import ByteBudget, compute_bytes
from zoo.parallel.host_leaves import CHUNK_BYTES, cut, row_bounds, whole


class Uplink:
    """Host leaves up to ``device`` in the compute dtype of ``precision``, in pieces of at most
    ``chunk_bytes``, from ``pool``'s threads; ``inflight_bytes`` bounds the cast bytes the
    leaves on their way hold (None: twice the largest leaf's)."""

    def __init__(
        self,
        precision,
        device,
        pool: ThreadPoolExecutor,
        chunk_bytes: int = CHUNK_BYTES,
        inflight_bytes: int | None = None,
    ) -> None:
        self.precision = precision
        self.device = device
        self.pool = pool
        self.chunk_bytes = chunk_bytes
        self.inflight_bytes = inflight_bytes
        self.cast_split = jax.jit(self._cast_and_cut, static_argnums=1)
        self.cast_split_all = jax.jit(self._cast_and_cut_all, static_argnums=1)
        self.timing = False  # tree() then waits after each stage and keeps when it ended
        self.trace: dict = {}

    def _cast_and_cut(self, p, edges):
        return cut(self.precision.to_compute({"leaf": p})["leaf"], edges)

    def _cast_and_cut_all(self, leaves: list, edges: tuple) -> list:
        return [self._cast_and_cut(p, e) for p, e in zip(leaves, edges, strict=True)]

    def edges(self, leaves: list) -> list[tuple[int, ...]]:
        """Each leaf's cut, by its float32 bytes (the gradient's; the params' pieces follow it)."""
        return [row_bounds(p.shape, p.size * 4, self.chunk_bytes) for p in leaves]

    def budget(self, leaves: list) -> ByteBudget:
        """A trip's own budget: ``inflight_bytes``, or twice the largest leaf's cast bytes."""
        weights = [compute_bytes(p, self.precision.compute_dtype) for p in leaves]
        return ByteBudget(self.inflight_bytes or 2 * max(weights, default=1))

    def leaf(self, budget: ByteBudget, p, edges: tuple[int, ...]) -> jax.Array:
        """One host leaf cast, cut, sent up piece by piece and joined on the device, its cast
        pieces' bytes held in ``budget`` until they are there."""
        with budget.hold(compute_bytes(p, self.precision.compute_dtype)):
            sent = whole(tuple(jax.device_put(self.cast_split(p, edges), self.device)))
            return jax.block_until_ready(sent)

    def all(self, leaves: list, edges: list | None = None, budget: ByteBudget | None = None) -> list:
        """Every leaf up (:meth:`leaf`), side by side, under ``budget`` (or the trip's own)."""
        edges = self.edges(leaves) if edges is None else edges
        budget = self.budget(leaves) if budget is None else budget
        return list(self.pool.map(lambda p, e: self.leaf(budget, p, e), leaves, edges))

    def tree(self, leaves: list) -> list:
        """Every leaf up at once, as the whole-tree step sends them: cast and cut by one host
        program for the whole tree, the pieces sent up side by side from the pool, the cut
        leaves joined by one device program (one compile each whatever the leaves' shapes, none
        where there is nothing to cast or cut: ``zoo train``'s summary counts compiles). The
        cast tree is on the host at once, and the pieces beside the joined leaves on the device
        until the join has run."""
        self.trace = {"start": time.perf_counter()}
        edges = tuple(self.edges(leaves))
        cut_any = any(len(e) > 2 for e in edges)
        if self.precision.is_identity and not cut_any:
            pieces = [(p,) for p in leaves]
        else:
            pieces = self.cast_split_all(leaves, edges)
        self._mark("cast", pieces)
        sent = list(self.pool.map(lambda ps: tuple(jax.device_put(ps, self.device)), pieces))
        self._mark("sent", sent)
        up = join_all(sent) if cut_any else [ps[0] for ps in sent]
        self._mark("joined", up)
        return up

    def _mark(self, stage: str, value) -> None:
        """With ``timing``: wait for ``value`` and note when it was ready."""
        if self.timing:
            jax.block_until_ready(value)
            self.trace[stage] = time.perf_counter()


def _join_all(leaves: list) -> list:
    return [jnp.concatenate(ps, axis=0) if len(ps) > 1 else ps[0] for ps in leaves]


join_all = jax.jit(_join_all)  # on the device: every cut leaf's pieces, one array again
