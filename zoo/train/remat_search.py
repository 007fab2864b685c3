"""The one chooser of a remat policy and a state placement under a memory budget.

``zoo train --remat auto`` (:mod:`zoo.train.auto_remat`) and ``zoo bench remat --budget``
(:mod:`zoo.bench.remat`) both call :func:`search` on an engine, its params and one batch, and
take :func:`pick` of its rows, so the same model, batch and budget get the same choice from
either (up to the noise of the clock between two near-equal candidates).

A candidate is a remat policy (:mod:`zoo.remat`) at a placement of the training state: one row
of :data:`PLACEMENTS`, the three in-program placements by their ``[train] offload`` names, and
:data:`HOST`, the update on the host. The search, for every candidate in order (placements
outer, from the one that moves the least state):

1. skips it, not compiled, where its arguments alone (the state, frozen leaves and batch in
   device memory, counted from shapes) are over the budget (``resident_bytes``), or where its
   policy already fit, and ran, at a placement where the same policy is no slower
   (:data:`NO_SLOWER_AT`, ``dominated_by``): moving more of the state to the host only adds
   copies to the same step;
2. lowers the candidate's device program from shapes, nothing allocated (the arguments carry
   the memory kinds the run puts them in, :func:`placed_shapes`): the train step, or for the
   update on the host its gradient program (:func:`host_shapes`: the compute-dtype params, the
   step and key, frozen leaves and batch in; the float32 gradient, loss and report out; the
   masters and the optimizer state stay on the host and are no device bytes). A program equal
   to an earlier candidate's is that candidate (``same_as``) and is neither compiled nor timed
   again;
3. compiles the rest; the need is :func:`zoo.remat.footprint` of :func:`zoo.remat.step_bytes`:
   XLA's ``memory_analysis()`` arguments + outputs - aliased + temporaries, in device memory (an
   offloaded state's host-memory arguments are not the device's). A TPU refuses at compile time
   a program it cannot hold: that row is ``compile_oom``;
4. times the candidates that fit (with ``time_all``, as the bench does, every compiled one),
   placement by placement on one real state that every step passes on (one state in memory at
   a time): a warm-up step each, then :data:`ROUNDS` rounds in which each takes an untimed and
   a timed step in turn, so all of them see the same machine load (:func:`time_candidates`).
   The step timed is the run's own: the compiled program, or for the update on the host the
   placement's step object (the gradient, the trips and the host's update; its gradient
   program compiles again, through the step's own ``jit``, at the warm-up step). After the
   first round, a candidate more than :data:`SLOWER` times the fastest so far (of any
   placement) stops, and so does one whose step is over :data:`LONG_STEP` seconds
   (``stopped``). One that runs out of memory (``out_of_memory``: the analysis does not see
   everything) does not fit.

:func:`pick`: the least median step time among the candidates that fit and ran; a tie goes to
the earlier candidate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import jax
from jax.sharding import SingleDeviceSharding

from zoo.parallel.placement import ON_DEVICE, Placement, offloaded, placement_named
from zoo.remat import HOST_KINDS, footprint, get_policy, step_bytes

ROUNDS = 3  # timed rounds of the search (the bench takes its --repeats)
SLOWER = 1.5  # after the first round, a candidate this many times the fastest stops
# A step this long (seconds) is timed to well under 1% by one reading: after the first round it
# takes no more (an offloaded 1B step takes tens of seconds on a TPU v5e).
LONG_STEP = 2.0


# The search's placement axis, named by what the summary's ``offload`` field calls the rows of
# :data:`zoo.parallel.placement.PLACEMENTS` (the update on the host by its placement name), in
# the order that moves more of the state, each mapped to the placements where the same policy
# is no slower: an offload holds the host copies of the one before it and adds to them; the
# update on the host adds trips and the host's update to the state-on-device step's gradient,
# and moves less than an offload of the params (compute-dtype params up, the gradient down),
# so only the device's step is sure to be no slower.
HOST = "update-on-host"
NO_SLOWER_AT: dict[str, tuple[str, ...]] = {
    "none": (),
    "optimizer": ("none",),
    "optimizer+params": ("none", "optimizer"),
    HOST: ("none",),
}
PLACEMENTS = tuple(NO_SLOWER_AT)
IN_PROGRAM = tuple(p for p in PLACEMENTS if p != HOST)


def placement_of(engine) -> str:
    """The search's name of ``engine``'s own placement."""
    return HOST if engine.placement.update_on_host else engine.placement.offload


def placement_row(name: str) -> Placement:
    """The :class:`~zoo.parallel.placement.Placement` the search's ``name`` stands for."""
    return placement_named(HOST) if name == HOST else offloaded(name)


@dataclass(frozen=True)
class Candidate:
    policy: str
    placement: str

    @property
    def label(self) -> str:
        return f"{self.policy}/{self.placement}"


def candidates(policies, placements) -> list[Candidate]:
    """Every (policy, placement), placements outer, each axis in the order given."""
    return [Candidate(p, where) for where in placements for p in policies]


def with_candidate(engine, candidate: Candidate):
    """``engine`` with its stack on the candidate's policy (same frozen prefix), at its placement."""
    get_policy(candidate.policy)  # an unknown name fails here, with the valid list
    grad = dataclasses.replace(engine.grad, remat=candidate.policy)
    return dataclasses.replace(engine, grad=grad, placement=placement_row(candidate.placement))


def placed_shapes(engine, state, frozen: dict):
    """``(state, frozen)`` shapes with the shardings ``engine.init_state`` commits them to (the
    layout's device, or its mesh, in host memory for what ``[train] placement`` keeps there), so
    that they lower to the program real arrays lower to, and its memory analysis does not
    count an offloaded state as device bytes."""
    layout = engine.layout
    state_shardings = engine.placement.state_shardings(layout, state, engine.optimizer)
    if layout.is_single:
        device = jax.sharding.SingleDeviceSharding(layout.mesh.devices.flat[0])
        frozen_shardings = jax.tree.map(lambda _: device, frozen)
    else:
        frozen_shardings = layout.params(frozen)
    return jax.tree.map(
        lambda a, sharding: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
        (state, frozen),
        (state_shardings, frozen_shardings),
    )


def program_digest(lowered) -> str:
    """A digest of a lowered program's text (``jax.stages.Lowered``): the same step, the same digest."""
    return hashlib.sha256(lowered.as_text().encode()).hexdigest()[:16]


def _out_of_memory(error: Exception) -> bool:
    return isinstance(error, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" in str(error)


def _placed_state(engine, params) -> tuple:
    """``(state, frozen)`` of ``engine`` as placed shapes: nothing allocated."""
    return placed_shapes(engine, *jax.eval_shape(lambda p: engine.init_state(p, 0), params))


def host_shapes(engine, params) -> tuple:
    """``(state, frozen)`` as the update on the host's gradient program reads them (its step's
    ``up``), as shapes on the compute device: the params in the compute dtype, the step and the
    key, no optimizer state (an empty tuple), and the frozen leaves. The float32 masters and
    the optimizer state stay on the host: they are not the program's arguments."""
    device = SingleDeviceSharding(engine.placement.compute(engine.layout))
    on_device = dataclasses.replace(engine, placement=ON_DEVICE)
    state, frozen = jax.eval_shape(lambda p: on_device.init_state(p, 0), params)
    up = dataclasses.replace(
        state, params=jax.eval_shape(engine.precision.to_compute, state.params), opt_state=()
    )
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), (up, frozen))


def _device_program(engine):
    """``(the program on the device that is lowered, the step a timing calls or None)``: the
    train step and None (its compiled program is timed), or for the update on the host its
    gradient program and its whole step."""
    step = engine.train_step
    return (step.grads, step) if engine.placement.update_on_host else (step, None)


def _arguments(engine, params) -> tuple:
    """``(state, frozen)`` shapes as ``engine``'s device program takes them."""
    return host_shapes(engine, params) if engine.placement.update_on_host else _placed_state(engine, params)


def _device_bytes(tree, host_separate: bool) -> int:
    """Bytes per device of ``tree``'s leaves (shapes or arrays with shardings) in device memory."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if host_separate and getattr(sharding, "memory_kind", None) in HOST_KINDS:
            continue
        shape = sharding.shard_shape(tuple(leaf.shape)) if sharding is not None else leaf.shape
        total += math.prod(shape) * getattr(leaf.dtype, "itemsize", 8)
    return total


def _compile(engine, args: tuple, host_separate: bool, seen: dict) -> tuple[dict, object]:
    """``(measured, step)`` of ``engine``'s device program (:func:`_device_program`) on ``args``
    (state, frozen, batch): its bytes and program digest, or ``same_as`` (the label of an
    earlier candidate in ``seen`` with the same program) or ``compile_oom``; ``step`` (what a
    timed step calls: the compiled program, or the update on the host's step) is None unless
    compiled here."""
    program, whole_step = _device_program(engine)
    try:  # a TPU refuses at compile time a program that cannot fit its memory
        tic = time.perf_counter()
        lowered = program.lower(*args)
        program = program_digest(lowered)
        if program in seen:
            label, measured = seen[program]
            return {**measured, "same_as": label}, None
        lowered_at = time.perf_counter()
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as error:
        if not _out_of_memory(error):
            raise
        return {"compile_oom": True}, None
    seconds = {"lower_s": round(lowered_at - tic, 3), "compile_s": round(time.perf_counter() - lowered_at, 3)}
    return {**step_bytes(compiled, host_separate), "program": program, **seconds}, whole_step or compiled


def _row(candidate: Candidate, budget: int | None, measured: dict) -> dict:
    row = {"policy": candidate.policy, "offload": candidate.placement, "label": candidate.label, **measured}
    if "temp_bytes" in row:
        row["need_bytes"] = footprint(row)
    elif "resident_bytes" in row:  # not compiled: its arguments alone are over the budget
        row["need_bytes"] = row["resident_bytes"]
    if budget is not None:
        row["fits"] = fits(row, budget)
    return row


def fits(row: dict, budget: int) -> bool:
    """Whether a measured row's step fits ``budget``: its need within it, and it compiled and
    (if it was run) did not run out of memory."""
    need = row.get("need_bytes")
    return need is not None and need <= budget and not row.get("out_of_memory") and not row.get("compile_oom")


clock = time.perf_counter  # a seam: the tests read a clock of their own


def time_candidates(steps: dict, init: Callable, rounds: int, stop_slower: float | None, best: float | None):
    """Per candidate, its seconds a step in each round it ran, or None if it ran out of memory.

    ``steps[c](state, frozen) -> (state, metrics)`` are one placement's compiled steps;
    ``init() -> (state, frozen)`` makes the one real state they pass on (again if a step that
    ran out of memory took it). Each takes a warm-up step, then ``rounds`` rounds of an untimed
    and a timed step in turn. With ``stop_slower``, after the first round a candidate over
    ``stop_slower`` times the fastest (or ``best``, seconds: the fastest found before) stops,
    and so does one whose step took over :data:`LONG_STEP` seconds."""
    held = list(init())

    def step(c) -> None:
        if any(leaf.is_deleted() for leaf in jax.tree.leaves(held[0])):
            held[:] = init()  # taken by a step that then ran out of memory
        held[0], out = steps[c](*held)
        jax.block_until_ready((held[0], out))

    times: dict = {c: [] for c in steps}
    live = list(steps)
    for r in range(-1, rounds):  # round -1: the warm-up
        for c in list(live):
            try:
                step(c)
                if r >= 0:
                    tic = clock()
                    step(c)
                    times[c].append(clock() - tic)
            except jax.errors.JaxRuntimeError as error:
                if not _out_of_memory(error):
                    raise
                times[c] = None
                live.remove(c)
        if r == 0 and stop_slower is not None and live:
            fastest = min([times[c][0] for c in live] + ([best] if best is not None else []))
            live = [c for c in live if stop_slower * fastest >= times[c][0] <= LONG_STEP]
    return times


def search(
    engine,
    params,
    batch: dict,
    budget: int | None,
    among: list[Candidate],
    *,
    host_separate: bool,
    rounds: int = ROUNDS,
    time_all: bool = False,
    progress: Callable[[str], None] | None = None,
) -> list[dict]:
    """One row per candidate of ``among`` (see the module docstring), in its order. ``budget``
    None (the bench without one) marks nothing as fitting; ``time_all`` times every compiled
    candidate, fitting or not, and skips none as dominated."""
    say = progress or (lambda message: None)
    batch = jax.device_put(engine.place_batch(batch))  # on the device once, as the loop's prefetch puts it
    rows: dict[Candidate, dict] = {}
    seen: dict[str, tuple[str, dict]] = {}  # program digest -> (first candidate's label, its bytes)
    best = None  # the least median seconds of a fitting candidate so far
    for where in dict.fromkeys(c.placement for c in among):
        group = [c for c in among if c.placement == where]
        placed = with_candidate(engine, group[0])
        args = (*_arguments(placed, params), batch)
        resident = _device_bytes(args, host_separate)  # live for the whole step, whatever the policy
        compiled = {}
        for c in group:
            earlier = None if time_all else _dominating(rows, c)
            if earlier is not None or (budget is not None and resident > budget):
                skipped = {"dominated_by": earlier} if earlier is not None else {"resident_bytes": resident}
                rows[c] = _row(c, budget, skipped)
                continue
            say(f"remat search: compiling {c.label}")
            measured, program = _compile(with_candidate(engine, c), args, host_separate, seen)
            rows[c] = _row(c, budget, measured)
            if program is not None:
                seen[measured["program"]] = (c.label, measured)
                if time_all or rows[c].get("fits"):
                    compiled[c] = program
        if compiled:
            say(f"remat search: timing {len(compiled)} at placement {where}, {rounds} rounds")
            times = time_candidates(
                {c: (lambda state, frozen, fn=fn: fn(state, frozen, batch)) for c, fn in compiled.items()},
                lambda placed=placed: placed.init_state(params, 0, jax.random.key(0)),
                rounds,
                None if time_all else SLOWER,
                best,
            )
            best = _record(rows, times, rounds, budget, best, time_all)
    by_label = {row["label"]: row for row in rows.values()}
    for row in rows.values():  # the same program as an earlier candidate: the same step
        if row.get("same_as"):
            first = by_label[row["same_as"]]
            row.update({k: first[k] for k in ("step_ms", "round_ms", "out_of_memory", "fits") if k in first})
    return [rows[c] for c in among]


def _record(rows: dict, times: dict, rounds: int, budget, best, time_all: bool):
    """Put ``times`` in their rows; the new least median seconds of a fitting candidate."""
    for c, seconds in times.items():
        rows[c].update(_timed(seconds, rounds))
        if budget is not None:  # one that ran out of memory does not fit: the analysis missed some
            rows[c]["fits"] = fits(rows[c], budget)
        if seconds and (time_all or rows[c].get("fits")):
            best = min(best or float("inf"), statistics.median(seconds))
    return best


def _dominating(rows: dict, c: Candidate) -> str | None:
    """The label of the same policy at a placement where it is no slower than at ``c``'s, if it
    fit and ran there."""
    for row in rows.values():
        ran = row.get("fits") and row.get("step_ms") is not None
        if ran and row["policy"] == c.policy and row["offload"] in NO_SLOWER_AT[c.placement]:
            return row["label"]
    return None


def _timed(seconds: list[float] | None, rounds: int) -> dict:
    if seconds is None:
        return {"step_ms": None, "out_of_memory": True}
    ms = [round(1e3 * s, 3) for s in seconds]
    out = {"step_ms": round(1e3 * statistics.median(seconds), 3), "round_ms": ms}
    return {**out, "stopped": True} if len(seconds) < rounds else out


# --- the choice ----------------------------------------------------------------------------


def pick(rows: list[dict]) -> dict | None:
    """The fastest row that fits and ran (least median ``step_ms``; a tie goes to the earlier
    row), or None. A row the same program as an earlier one is that one."""
    ran = [r for r in rows if r.get("fits") and r.get("step_ms") is not None and not r.get("same_as")]
    return min(ran, key=lambda r: r["step_ms"]) if ran else None
