"""The step of ``placement = "update-on-host"``: the optimizer update on the host CPU, where the
state lives (:data:`zoo.parallel.placement.PLACEMENTS`).

ZeRO-Offload's split (Ren et al., 2021; DeepSpeed's "CPU Adam"). With the optimizer state and
params offloaded and the update on the device, each step copies the float32 masters and both
moments to the chip and writes them back: on a TPU v5e a write to host memory inside ``jit``
measured 0.55 GB/s (``benchmarks/device/bandwidth.py``), about 27 s a step for a 1B model's
15 GB of state. Here the state never leaves the host. A step:

1. the params, in the compute dtype (half the bytes under bfloat16), are on the device: sent up
   by the previous step as each leaf's update finished (or, for the first step and a state the
   step did not make, cast and sent up now, leaf by leaf);
2. the device computes the loss, the float32 gradient (over ``train.microbatch_size`` rows at a
   time; under DP the noisy mean of the clipped sum) by the engine's public
   :meth:`~zoo.train.engine.Engine.grads` from the params widened back to float32 inside the
   program (the model's own cast then gives the very values the device step's cast of the
   masters gives), and the gradient's global norm (the step's ``grad_norm``, and the clip's);
3. every leaf's gradient comes down in pieces of at most ``chunk_bytes``
   (:mod:`zoo.parallel.host_leaves`), issued from a small thread pool, so the copies run side
   by side; a leaf's pieces are cut on the device as its task starts (under its share of the
   budget below), and the step lets go of the leaf's gradient once they are on their way, so
   the device holds the gradient and the in-flight leaves' pieces, not two gradients (the
   previous params, once the gradient's program is dispatched, are let go too: the exact step
   sends the new ones up beside the gradient);
4. as soon as a leaf's pieces are on the host, its update runs there (the optimizer's own,
   fused with the cast of the new value to the compute dtype), and its pieces go up for the
   next step while the other leaves are still coming down or being updated.

The leaves in flight are bounded in bytes, not in number (:mod:`zoo.parallel.host_budget`),
by two :class:`~zoo.parallel.host_budget.ByteBudget` that share ``inflight_bytes``: the trips'
(``self.budget``: a leaf's gradient pieces on the host, held from its cut until its update has
run) and the updates' (``self.updating``: what an update holds beyond its gradient, its
temporaries and the pieces going up, held once the pieces are down until the update and its
trip up have run; at most the largest leaf's, so the large leaves' updates run one at a time,
each on every core, while the other leaves keep coming down). By default the trips may hold the
whole gradient (what the whole-tree step holds anyway) and the host's peak is the state plus
the gradient plus one leaf's update. Without a budget every leaf's update was queued at once (a
compiled program's call returns before it runs) and the host's CPU ran them side by side; with
one budget of twice the largest leaf's update over trips and updates together, a TPU v5e
(``llama-1b``, 64 rows) had at most two large leaves in flight: the trips down ran at 0.65 GB/s
and the step's tail after the gradient took 11.0 s, where the whole-tree step's down and update
took 5.6 (``benchmarks/device/RESULTS.md``, 2026-12-07).

The step's critical path is the gradient, then the trip down, then the last leaf's update and
trip up (the tail); the other updates and trips up hide behind the trips down. It equals the
whole-tree step (:class:`SerialHostStep`: the engine's ``update`` on the whole tree) bit for
bit on a CPU, and the device step under the float rule.

``update_delay = 1`` is a different algorithm: ZeRO-Offload's one-step delayed parameter update
(DPU). Step t's gradient is taken at the params from before step t-1's update (the copy already
on the device), and applied to the params after it: ``g_t = grad(p_{t-2})``, ``p_t = U(p_{t-1},
g_t)`` (the first two steps both take ``p_0``). The host's update of step t-1 and its trip up
then run while the device computes step t. The state a step returns is whole (params and
moments after its update); the device copy one step behind is the step object's, so a resumed
run (a state it did not make) starts the delay again.

The chip holds the compute-dtype params, the gradient and the activations; never the masters or
the moments. Between steps the state is on the host's CPU device
(:func:`zoo.parallel.placement.host_device`), where checkpoints and resumes find it; the eval
step and other read-only passes get the compute-dtype copy. On a CPU the "device" and the host
are one memory, and a test process with several host devices puts the two halves on two of them.
"""

from __future__ import annotations

import dataclasses
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import optax
from jax.sharding import SingleDeviceSharding

from zoo.parallel.host_budget import ByteBudget, Tally
from zoo.parallel.host_leaves import CHUNK_BYTES, LeafUpdates, down_pieces, pieces, whole
from zoo.parallel.host_up import Uplink

DELAYS = (0, 1)


class HostStep:
    """An engine's train step with the update on the host, pipelined leaf by leaf: ``(state,
    frozen, batch) -> (state, metrics)``, the state (on the host) donated, as the one-program
    step takes it. It calls the engine's public ``grads``, ``optimizer`` and ``precision``.

    ``update_delay``: 0 (the exact step) or 1 (the delayed update, a different algorithm: the
    module's docstring). ``chunk_bytes``: the largest piece of a leaf a trip moves.
    ``inflight_bytes``: the host bytes the leaves' trips and updates may hold at once beside
    the state (None: the whole gradient's plus the largest leaf update's own, each call's; a
    leaf larger than its budget goes alone); ``self.budget`` and ``self.updating`` are the last
    call's two (:meth:`_budgets`), ``self.leaf_bytes`` its leaves' update weights (their sum:
    what an unbounded pipeline would queue at once).
    ``workers``: the host threads that issue the trips and the updates (each waits on its
    leaf's copies and update: numpy and XLA release the GIL). ``timing``: each call blocks
    after every stage and keeps when it ended (``self.trace``), for the benchmark's phases."""

    def __init__(
        self,
        engine,
        update_delay: int = 0,
        chunk_bytes: int = CHUNK_BYTES,
        workers: int = 8,
        inflight_bytes: int | None = None,
    ):
        if update_delay not in DELAYS:
            raise ValueError(f"update_delay = {update_delay!r} is not one of {DELAYS}")
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes = {chunk_bytes!r} must be a whole number >= 1")
        if inflight_bytes is not None and inflight_bytes < 1:
            raise ValueError(f"inflight_bytes = {inflight_bytes!r} must be a whole number >= 1 (or None)")
        self.engine = engine
        self.update_delay = update_delay
        self.inflight_bytes = inflight_bytes
        self.budget: ByteBudget | None = None  # the last call's trips'
        self.updating: ByteBudget | None = None  # the last call's updates'
        self.leaf_bytes: list[int] = []  # the last call's leaves' update weights
        self.leaf_downs: list[int] = []  # the last call's leaves' gradient bytes on the host
        self.device = engine.placement.compute(engine.layout)
        self.host = engine.placement.host(engine.layout)  # the one rule
        self.grads = jax.jit(self._grads)
        self._next = jax.jit(lambda step: step + 1)
        # The gradient's norm, a program of its own on the finished gradient (milliseconds of
        # HBM reads): inside the gradient's program XLA may fuse its sums into the backward and
        # add in another order than the whole-tree update on the host does.
        self._norm = jax.jit(optax.tree.norm)
        self._updates = LeafUpdates(engine.optimizer, engine.precision)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="host-step")
        self.uplink = Uplink(engine.precision, self.device, self._pool, chunk_bytes, inflight_bytes)
        self._returned: list = []  # the params leaves the last call returned
        self._ahead: list | None = None  # device params the next call computes at
        self.timing = False
        self.trace: dict = {}

    # -- the programs ------------------------------------------------------------------------
    def _grads(self, state, frozen: dict, batch: dict):
        """On the device: ``(loss, float32 gradient, report)`` of the engine's step at
        ``state.params`` (compute dtype, widened here to the masters' dtype: the model casts
        them back)."""
        masters = dataclasses.replace(state, params=self.engine.precision.master(state.params))
        return self.engine.grads(masters, frozen, batch)

    # -- the trips (zoo.parallel.host_up) -----------------------------------------------------
    def _edges(self, leaves: list) -> list[tuple[int, ...]]:
        return self.uplink.edges(leaves)

    def _up_leaf(self, budget: ByteBudget, p, edges: tuple[int, ...]) -> jax.Array:
        return self.uplink.leaf(budget, p, edges)

    def _up_all(self, leaves: list, edges: list, budget: ByteBudget | None = None) -> list:
        return self.uplink.all(leaves, edges, budget)

    def _budgets(self, downs: list[int], extras: list[int]) -> ByteBudget:
        """A call's two budgets from its leaves' gradient bytes (``downs``) and their updates'
        own (``extras``), one tally over both: the updates' the largest leaf's own (at most what
        ``inflight_bytes`` leaves beside the largest gradient), the trips' the rest of
        ``inflight_bytes`` (by default the whole gradient). Returns the trips'
        (``self.budget``); the updates' is ``self.updating``."""
        own = max(extras, default=1)
        total = self.inflight_bytes or sum(downs) + own
        tally = Tally()
        self.updating = ByteBudget(max(1, min(own, total - max(downs, default=0))), tally)
        self.budget = ByteBudget(max(1, total - self.updating.limit), tally)
        return self.budget

    @property
    def held(self) -> tuple[int, int]:
        """The last call's ``(limit, peak)`` of both budgets together: the host bytes beside the
        state it allowed, and the most both held at once."""
        if self.budget is None or self.updating is None:
            return 0, 0
        return self.budget.limit + self.updating.limit, self.budget.tally.peak

    def params_up(self, params: dict) -> dict:
        """Trainable ``params`` (on the host) in the compute dtype, on the compute device: what
        the gradient program reads, and what the eval step and the other read-only passes
        read (the model casts to that dtype anyway, so their values are the masters'). The
        exact step's copy of the params it returned is already there."""
        leaves, treedef = jax.tree.flatten(params)
        if not self.update_delay and self._is_ours(leaves) and self._ahead is not None:
            return treedef.unflatten(self._ahead)
        return treedef.unflatten(self._up_all(leaves, self._edges(leaves)))

    def up(self, state):
        """``state`` as the gradient program reads it, on the compute device (the benchmark
        compiles the program from it): the params in the compute dtype, the step and the key,
        and no optimizer state (an empty tuple, as :meth:`__call__` passes it)."""
        step, rng = jax.device_put((state.step, state.rng), SingleDeviceSharding(self.device))
        return dataclasses.replace(
            state, step=step, params=self.params_up(state.params), opt_state=(), rng=rng
        )

    def _is_ours(self, leaves: list) -> bool:
        return len(leaves) == len(self._returned) and all(
            a is b for a, b in zip(leaves, self._returned, strict=False)
        )

    # -- the step ----------------------------------------------------------------------------
    def __call__(self, state, frozen: dict, batch: dict):
        leaves, treedef = jax.tree.flatten(state.params)
        edges = self._edges(leaves)
        self.trace = {"start": time.perf_counter()}
        plan = self._plan(state, leaves, edges)
        self.leaf_bytes = plan["weights"]
        self.leaf_downs = plan["downs"]  # each leaf's gradient bytes on the host
        budget = self._budgets(
            plan["downs"], [w - d for w, d in zip(plan["weights"], plan["downs"], strict=True)]
        )
        ahead, self._ahead = (self._ahead if self._is_ours(leaves) else None), None
        on_device = ahead if ahead is not None else self._up_all(leaves, edges, budget)
        self._mark("up", on_device)
        step, rng = jax.device_put((state.step, state.rng), SingleDeviceSharding(self.device))
        up = dataclasses.replace(state, step=step, params=treedef.unflatten(on_device), opt_state=(), rng=rng)
        loss, grads, report = self.grads(up, frozen, batch)
        norm = self._norm(grads)
        # The delayed update: this step computed at the copy one step behind; the params it
        # was handed go up now, beside the device's work, for the next step. Its first call
        # has no copy behind: the next one computes at this one's params again.
        ups, keep = None, None
        if self.update_delay and ahead is not None:
            ups = [self._pool.submit(self._up_leaf, budget, p, e) for p, e in zip(leaves, edges, strict=True)]
        elif self.update_delay:
            keep = on_device
        # The program that reads the params it computed at is dispatched: JAX keeps its inputs
        # until it has run, so the step lets go of them (the new params go up beside the rest).
        del up, on_device, ahead
        self._mark("grads", loss)
        grads = treedef.flatten_up_to(grads)
        new_state, sent = self._update(state, leaves, grads, plan, norm, ups)
        self._returned = jax.tree.leaves(new_state.params)
        self._ahead = keep if keep is not None else sent
        return new_state, {"loss": loss, "grad_norm": norm, **report}

    def leaf_updates(self) -> LeafUpdates:
        """The host's update of one leaf (its compiled programs), as the step calls it."""
        return self._updates

    def _plan(self, state, leaves: list, edges: list) -> dict:
        """Each leaf's moments, the shared optimizer leaves, and the host bytes each leaf's
        update holds (its weight in the budget: :func:`zoo.parallel.host_budget.update_bytes`),
        and its program, compiled now (once per shape, in the calling thread) for the shapes of
        the pieces the leaf's cut will make (``down_pieces``: none is cut yet)."""
        updates = self.leaf_updates()
        moments, shared = updates.prepare(state.opt_state, jax.tree.structure(state.params))
        host = SingleDeviceSharding(self.host)
        norm = jax.ShapeDtypeStruct((), jax.numpy.float32, sharding=host)
        downs = [down_pieces(p, e, host) for p, e in zip(leaves, edges, strict=True)]
        programs = [
            updates.compile(p, m, shared, norm, d, e)
            for p, m, d, e in zip(leaves, moments, downs, edges, strict=True)
        ]
        weights = [updates.held_bytes(p, d, e) for p, d, e in zip(leaves, downs, edges, strict=True)]
        return {
            "moments": moments,
            "shared": shared,
            "weights": weights,
            "downs": [sum(g.size * g.dtype.itemsize for g in d) for d in downs],
            "edges": edges,
            "programs": programs,
        }

    def _update(self, state, leaves: list, grads: list, plan: dict, norm, ups):
        """Every leaf's gradient cut, down, updated and (the exact step) up, one pool task a
        leaf: its gradient's bytes held in the trips' budget from its cut until its update has
        run, and once its pieces are on the host, its update's own in the updates' budget until
        the update and its trip up have run: ``(the new state, the device params the next call
        computes at)``. ``grads`` (the device's gradient, leaf by leaf) lets go of each leaf
        once its pieces are on their way down."""
        updates, budget, updating = self.leaf_updates(), self.budget, self.updating
        moments, shared, programs = plan["moments"], plan["shared"], plan["programs"]
        norm = jax.device_put(norm, self.host)
        self.trace["leaves"] = [{} for _ in leaves]

        def leaf(k: int):
            if ups is not None:
                ups[k].result()  # the leaf's trip up read it before the update overwrites it
            own = plan["weights"][k] - plan["downs"][k]
            with budget.hold(plan["downs"][k]):
                down = tuple(jax.device_put(pieces(grads[k], plan["edges"][k]), self.host))
                grads[k] = None  # the device's gradient and pieces of the leaf, freed once down
                jax.block_until_ready(down)  # down before its turn to update: no turn held waiting
                self._mark("down", down, k)
                with updating.hold(own):
                    new, m, s, up, _ = programs[k](leaves[k], moments[k], shared, norm, down)
                    del down
                    self._mark("update", new, k)
                    sent = None if self.update_delay else whole(tuple(jax.device_put(up, self.device)))
                    del up
                    jax.block_until_ready((new, m, sent))  # its bytes are free once it has run
                    self._mark("up", sent, k)
            return new, m, s, sent

        done = list(self._pool.map(leaf, range(len(leaves))))
        new_state = dataclasses.replace(
            state,
            step=self._next(state.step),
            params=jax.tree.structure(state.params).unflatten([d[0] for d in done]),
            opt_state=updates.rebuild([d[1] for d in done], list(done[0][2])),
        )
        if not self.update_delay:
            return new_state, [d[3] for d in done]
        return new_state, None if ups is None else [u.result() for u in ups]

    def _mark(self, stage: str, value, leaf: int | None = None) -> None:
        """With ``timing``: wait for ``value`` and note when it was ready."""
        if not self.timing:
            return
        jax.block_until_ready(value)
        where = self.trace if leaf is None else self.trace["leaves"][leaf]
        where[stage] = time.perf_counter()

    def cache_sizes(self) -> dict[str, int]:
        """Compiles of each of the step's programs: the device's gradient, the host's update
        of a leaf (one per leaf shape) and the host's cast and cut (one per leaf shape)."""
        return {
            "grads": self.grads._cache_size(),
            "update": self._updates.compiles,
            "cast": self.uplink.cast_split._cache_size(),
        }

    def _cache_size(self) -> int:
        """The most compiles of any one of the step's programs (``jax.jit``'s own answer)."""
        return max(self.cache_sizes().values())


class SerialHostStep:
    """The update on the host in turn: the params cast and up (in pieces, side by side:
    :meth:`~zoo.parallel.host_up.Uplink.tree`), the gradient, the whole tree down, the
    whole-tree update (the engine's ``update``). ``zoo train``'s step under ``update-on-host``,
    and the pipeline's (:class:`HostStep`) reference: the benchmark's ``serial`` rows and the
    tests' bit-for-bit comparison. ``workers``: the threads that send the pieces up."""

    def __init__(self, engine, workers: int = 8) -> None:
        self.engine = engine
        self.device = engine.placement.compute(engine.layout)
        self.host = engine.placement.host(engine.layout)  # the one rule
        pool = ThreadPoolExecutor(workers, thread_name_prefix="host-up")
        self.uplink = Uplink(engine.precision, self.device, pool)
        self.grads = jax.jit(self._grads)
        self.update = jax.jit(engine.update, donate_argnames="state")

    def _grads(self, state, frozen: dict, batch: dict):
        """On the device: ``(loss, float32 gradient, report)`` of the engine's step at
        ``state.params`` (compute dtype, widened here to the masters' dtype: the model casts
        them back)."""
        masters = dataclasses.replace(state, params=self.engine.precision.master(state.params))
        return self.engine.grads(masters, frozen, batch)

    def params_up(self, params: dict) -> dict:
        """Trainable ``params`` (on the host) in the compute dtype, on the compute device: what
        the gradient program reads, and what the eval step and the other read-only passes
        read (the model casts to that dtype anyway, so their values are the masters')."""
        leaves, treedef = jax.tree.flatten(params)
        return treedef.unflatten(self.uplink.tree(leaves))

    def up(self, state):
        """``state`` as the gradient program reads it, on the compute device: the params in the
        compute dtype, the step and the key, and no optimizer state (an empty tuple: no leaves,
        and no ``None`` that a compiled program's argument list reads as a dropped argument)."""
        step, rng = jax.device_put((state.step, state.rng), SingleDeviceSharding(self.device))
        params = self.params_up(state.params)
        return dataclasses.replace(state, step=step, params=params, opt_state=(), rng=rng)

    def __call__(self, state, frozen: dict, batch: dict):
        loss, grads, report = self.grads(self.up(state), frozen, batch)
        loss, grads = jax.device_put((loss, grads), SingleDeviceSharding(self.host))
        new_state, metrics = self.update(state, loss, grads)
        return new_state, {**metrics, **report}

    def cache_sizes(self) -> dict[str, int]:
        """Compiles of each of the step's programs: the device's gradient, the host's update
        and the host's cast and cut of the tree (1 each once it ran, when every step's arguments
        come back alike; the cast runs where there is a cast or a cut to make)."""
        return {
            "grads": self.grads._cache_size(),
            "update": self.update._cache_size(),
            "cast": self.uplink.cast_split_all._cache_size(),
        }

    def _cache_size(self) -> int:
        """The most compiles of any one of the step's programs (``jax.jit``'s own answer)."""
        return max(self.cache_sizes().values())
