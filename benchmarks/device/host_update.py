"""Full-parameter AdamW of a model whose training state does not fit on the chip: ``zoo train``'s
step with ``[train] placement = "update-on-host"`` (the float32 masters and moments on the host,
the update on the host's CPU: :mod:`zoo.parallel.host_step`), over a logical batch of
``MICRO x ACCUM`` rows (``train.microbatch_size``).

    python benchmarks/device/host_update.py --preset llama-1b --seq 2048 \
        --rows full:4:16:serial,full:4:16,full:4:16:delayed,full:4:32:serial,full:4:32,full:4:32:delayed
    python benchmarks/device/host_update.py --small --rows full:2:2:serial,full:2:2,full:2:2:delayed --compare

A row is ``REMAT:MICRO:ACCUM[:MODE]``; a malformed one is refused in one line before anything
runs (:func:`parse_row`). MODE is the host step (:data:`MODES`):

- ``exact`` (the default): pipelined leaf by leaf, the gradient down in pieces of at most
  ``--chunk-mib`` MiB, each leaf updated as it arrives and sent up for the next step, the leaves
  in flight bounded by ``--inflight-mib`` MiB of host memory (default: the step's own, the
  whole gradient's and the largest leaf update's; :mod:`zoo.parallel.host_step`);
- ``serial``: one trip of each kind in turn (the whole tree): ``zoo train``'s step;
- ``delayed``: the pipelined step with ``update_delay = 1`` (ZeRO-Offload's delayed update, a
  different algorithm: the gradient at the params one update behind).

For each: the device program (the gradient) is compiled from the real arrays and its device
footprint read (``memory_analysis()``, as ``fits_table.py`` does); a row over the chip's
``bytes_limit`` is reported and skipped. Then one warm-up step and ``--steps`` steps back to
back, timed together (a delayed update overlaps the next step, so no step is waited on alone).
Then one step timed phase by phase (``phases_ms``): for ``serial`` each phase blocked in turn
(params up, gradient, down, update; the trip up also as ``up_cast``, ``up_send``, ``up_join``); for the pipeline the step's own marks (each leaf's stages
waited on inside its thread, the leaves side by side): ``up`` (the params the step had to send
itself: zero after the first step of ``exact``), ``grads``, ``down`` (from the gradient's end to
the last piece on the host), ``update`` and ``up_next`` (the leaves' summed busy time),
``tail`` (from the gradient's end to the step's end: the critical path past the device's
work) and ``hidden`` (the trips and updates that ran beside others: their sum less the tail).
MFU: ``devicekit.step_mfu`` (zoo's one FLOP count) over the step against the chip's peak.
Host memory (Linux): ``host_rss_gib`` when the timed steps start (the state, the bench's copy of
the params, what the warm-up left), ``host_peak_gib`` the most over them (``/proc/self``'s
high-water mark, reset first), ``state_gib`` the training state's bytes, and for the pipeline
``inflight_limit_mib`` and ``inflight_peak_mib``, its budgets (trips and updates) together and
the most both held at once (their one tally), and
``inflight_unbounded_mib``, every leaf's update bytes summed: what a pipeline without the budget
queues at once (a compiled program's call returns before it runs).
``--set KEY=VALUE,...`` overrides the preset's fields (whole numbers), for a model of a chosen
size on a CPU.

``--compare``: the same steps with the update on the device (``offload = none``), from the same
params, where that fits (``--compare-preset``, default the row's own at ``--small``): the
largest relative difference of the params and the losses after ``--steps`` + 1 steps.

One JSON line per row on stdout; ``--json FILE`` writes them all. A row that runs out of memory
is ``"fits": false``; one that fails otherwise is ``"fits": null`` with its error, and the run's
exit status is 1 (:func:`row_result`): a failure never reads as a measurement.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from devicekit import (  # noqa: E402
    config,
    footprint,
    host_memory,
    host_params,
    out_of_memory,
    ram_tripwire,
    reset_host_peak,
    say,
    step_mfu,
)

import zoo  # noqa: E402
from zoo import recipes  # noqa: E402
from zoo.bench.step import bench_start  # noqa: E402
from zoo.parallel.host_step import HostStep, SerialHostStep  # noqa: E402
from zoo.remat import policy_names  # noqa: E402
from zoo.train import stages  # noqa: E402

ROW_FORM = "REMAT:MICRO:ACCUM[:MODE]"


def pipeline(update_delay: int):
    """The pipelined step of a row, with ``--chunk-mib`` and (where given) ``--inflight-mib``."""

    def make(engine, args) -> HostStep:
        budget = {} if args.inflight_mib is None else {"inflight_bytes": args.inflight_mib * 2**20}
        return HostStep(engine, update_delay=update_delay, chunk_bytes=args.chunk_mib * 2**20, **budget)

    return make


MODES = {
    "exact": pipeline(0),
    "serial": lambda engine, args: SerialHostStep(engine),
    "delayed": pipeline(1),
}


def parse_row(row: str) -> tuple[str, int, int, str]:
    """``(remat, micro, accum, mode)`` of one ``--rows`` item; SystemExit with one line naming a
    malformed one, the form and what is valid."""
    remat, *rest = row.split(":")
    sizes, mode = rest[:2], (rest[2:] or ["exact"])[0]
    valid = len(rest) in (2, 3) and all(s.isdigit() and int(s) > 0 for s in sizes)
    if remat in policy_names() and valid and mode in MODES:
        return remat, int(sizes[0]), int(sizes[1]), mode
    raise SystemExit(
        f"host_update: bad row {row!r}: the form is {ROW_FORM} (e.g. full:4:16:delayed): REMAT one of "
        f"{', '.join(policy_names())}; MICRO (rows per microbatch) and ACCUM (microbatches a step) "
        f"whole numbers >= 1; MODE one of {', '.join(MODES)} (default exact)"
    )


def recipe_for(remat: str, micro: int, accum: int, precision: str, update_on: str = "host"):
    train = {
        "remat": remat,
        "precision": precision,
        "batch_size": micro * accum,
        "microbatch_size": micro,
        "placement": "update-on-host" if update_on == "host" else "device",
    }
    return recipes.parse_recipe({"train": train}, "host-update")


def build(cfg, recipe, params: dict, seq: int, seed: int = 0):
    """``(engine, state, frozen, batch)`` of ``zoo train``'s step for ``recipe`` on ``params``."""
    engine = stages.engine(recipe, bench_start(cfg, recipe, params), None, recipe.train.steps)
    rows = recipe.train.batch_size
    x = zoo.example_batch(cfg, rows, seq_len=seq, seed=seed)
    batch = {"x": x, "y": zoo.example_labels(cfg, x), "mask": jnp.ones((rows,), jnp.float32)}
    state, frozen = engine.init_state(params, seed)
    return engine, state, frozen, engine.place_batch(batch)


def phases(step, state, frozen, batch) -> tuple[dict, object]:
    """One step, phase by phase: ``({phase: ms}, new state)`` (the module's docstring)."""
    if isinstance(step, HostStep):
        return pipeline_phases(step, state, frozen, batch)
    return serial_phases(step, state, frozen, batch)


def pipeline_phases(step: HostStep, state, frozen, batch) -> tuple[dict, object]:
    step.timing = True
    try:
        state, metrics = step(state, frozen, batch)
        jax.block_until_ready((state, metrics))
        end = time.perf_counter()
    finally:
        step.timing = False
    t, leaves = step.trace, step.trace["leaves"]
    busy = {
        "down": max(leaf["down"] for leaf in leaves) - t["grads"],
        "update": sum(leaf["update"] - leaf["down"] for leaf in leaves),
        "up_next": sum(leaf["up"] - leaf["update"] for leaf in leaves),
    }
    tail = end - t["grads"]
    out = {"up": t["up"] - t["start"], "grads": t["grads"] - t["up"], **busy, "tail": tail}
    out["hidden"] = max(0.0, sum(busy.values()) - tail)
    return {k: round(v * 1e3, 1) for k, v in out.items()}, state


def serial_phases(step: SerialHostStep, state, frozen, batch) -> tuple[dict, object]:
    """Each phase blocked and timed in turn; the trip up also in its three stages (``up_cast``:
    the host's cast and cut of the tree, ``up_send``: the pieces' copies, ``up_join``: the
    device's join)."""
    marks, out = [time.perf_counter()], {}
    step.uplink.timing = True
    try:
        up = jax.block_until_ready(step.up(state))
    finally:
        step.uplink.timing = False
    marks.append(time.perf_counter())
    t = step.uplink.trace
    for name, a, b in (
        ("up_cast", "start", "cast"),
        ("up_send", "cast", "sent"),
        ("up_join", "sent", "joined"),
    ):
        out[name] = round((t[b] - t[a]) * 1e3, 1)
    loss, grads, _ = jax.block_until_ready(step.grads(up, frozen, batch))
    marks.append(time.perf_counter())
    loss, grads = jax.block_until_ready(jax.device_put((loss, grads), step.host))
    marks.append(time.perf_counter())
    new, _ = jax.block_until_ready(step.update(state, loss, grads))
    marks.append(time.perf_counter())
    for name, a, b in zip(("up", "grads", "down", "update"), marks, marks[1:], strict=False):
        out[name] = round((b - a) * 1e3, 1)
    return out, new


def measure(cfg, params, row: tuple[str, int, int, str], args, limit: int) -> dict:
    remat, micro, accum, mode = row
    recipe = recipe_for(remat, micro, accum, args.precision)
    engine, state, frozen, batch = build(cfg, recipe, params, args.seq)
    step = MODES[mode](engine, args)
    rows = recipe.train.batch_size
    out = {
        "row": ":".join(map(str, row)),
        "remat": remat,
        "micro": micro,
        "accum": accum,
        "mode": mode,
        "rows": rows,
        "seq": args.seq,
    }
    reset_host_peak()  # the progress lines' peaks count from here (the compile, the warm-up)
    tic = time.perf_counter()
    compiled = step.grads.lower(step.up(state), frozen, batch).compile()
    out["compile_s"] = round(time.perf_counter() - tic, 1)
    out["device_footprint_gib"] = round(footprint(compiled) / 2**30, 3)
    if footprint(compiled) > limit:
        return {**out, "fits": False, "why": f"device program {out['device_footprint_gib']} GiB > limit"}
    say(
        f"{out['row']}: compiled in {out['compile_s']} s, {out['device_footprint_gib']} GiB on the device; {resident()}"
    )
    state, metrics = step(state, frozen, batch)  # the warm-up (it compiles the host's programs)
    jax.block_until_ready((state, metrics))
    say(f"{out['row']}: warm-up step done; {resident()}")
    gc.collect()
    reset_host_peak()
    before = host_memory()
    t0 = time.perf_counter()
    for _ in range(args.steps):  # back to back: a delayed update overlaps the next step
        state, metrics = step(state, frozen, batch)
    jax.block_until_ready((state, metrics))
    seconds = (time.perf_counter() - t0) / args.steps
    out.update(host_figures(before, host_memory(), state, step))
    say(f"{out['row']}: {seconds:.3f} s a step, loss {float(metrics['loss']):.4f}")
    out["phases_ms"], state = phases(step, state, frozen, batch)
    kind = jax.devices()[0].device_kind
    mfu = step_mfu(cfg, rows, args.seq, seconds, args.precision)
    stats = jax.devices()[0].memory_stats() or {}
    return {
        **out,
        "fits": True,
        "ms_per_step": round(seconds * 1e3, 3),
        "tokens_per_s": round(rows * args.seq / seconds, 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "peak_bytes_in_use_gib": round(stats.get("peak_bytes_in_use", 0) / 2**30, 3),
        "loss": float(metrics["loss"]),
        "device": kind,
    }


def resident() -> str:
    """The host's resident memory now and at most so far, for a progress line (a run that
    runs the machine's RAM out is killed with no JSON written: these lines say how far it got)."""
    mem = host_memory()
    return (
        f"host RSS {mem['rss'] / 2**30:.2f} GiB, peak {mem['peak'] / 2**30:.2f} GiB"
        if mem
        else "host RSS n/a"
    )


def host_figures(before: dict, after: dict, state, step) -> dict:
    """The row's host memory (the module's docstring), in GiB and MiB."""
    gib = lambda n: round(n / 2**30, 3)  # noqa: E731
    out = {"state_gib": gib(sum(x.nbytes for x in jax.tree.leaves(state)))}
    if before:
        out.update(host_rss_gib=gib(before["rss"]), host_peak_gib=gib(after["peak"]))
    if isinstance(step, HostStep):
        mib = lambda n: round(n / 2**20, 3)  # noqa: E731  (a tiny row holds KiB)
        limit, peak = step.held
        out.update(
            inflight_limit_mib=mib(limit),
            inflight_peak_mib=mib(peak),
            inflight_unbounded_mib=mib(sum(step.leaf_bytes)),
        )
    return out


def run_both(args) -> dict:
    """``{update_on: (params, losses)}`` after ``--steps`` + 1 steps with the update on the
    device and on the host, from the same params."""
    cfg = config(args.compare_preset or args.preset, args.small)
    seq = cfg.max_len if args.small else args.compare_seq
    params = host_params(cfg)
    ends = {}
    for update_on in ("device", "host"):
        recipe = recipe_for("full", args.compare_micro, 2, args.precision, update_on)
        engine, state, frozen, batch = build(cfg, recipe, params, seq)
        step = (
            MODES["exact"](engine, args) if update_on == "host" else engine.train_step
        )  # the pipeline, on a CPU too
        losses = []
        for _ in range(args.steps + 1):
            state, metrics = step(state, frozen, batch)
            losses.append(float(metrics["loss"]))
        ends[update_on] = (jax.device_get(state.params), np.array(losses))
    return ends


def compare(args) -> dict:
    """The host update against the device step (:func:`run_both`): the largest difference of a
    param leaf over that leaf's largest magnitude, and both runs' losses."""
    ends = run_both(args)
    (p_dev, l_dev), (p_host, l_host) = ends["device"], ends["host"]
    rel = max(
        float(np.max(np.abs(np.asarray(a, np.float64) - b)) / (np.max(np.abs(b)) or 1.0))
        for a, b in zip(jax.tree.leaves(p_host), jax.tree.leaves(p_dev), strict=True)
    )
    return {
        "compare": args.compare_preset or args.preset,
        "small": args.small,
        "steps": args.steps + 1,
        "params_max_rel_diff": rel,
        "losses_device": l_dev.tolist(),
        "losses_host": l_host.tolist(),
    }


def row_result(cfg, params, row: tuple[str, int, int, str], args, limit: int) -> dict:
    """:func:`measure`'s row; one that runs out of memory (at compile or run time) is
    ``fits: false``, one that fails otherwise ``fits: null`` with its error. Whatever the row
    made is let go before the next: the host step holds its last params (on the host and on
    the device) through a reference cycle (its jitted bound methods), which only a collection
    frees; on a TPU v5e three ``llama-1b`` rows in one process ran the host's RAM out
    (2026-12-07), where one row left 10.5 GiB of 42 available."""
    try:
        return measure(cfg, params, row, args, limit)
    except Exception as e:  # noqa: BLE001 - one row's failure is its result, the rest still run
        error = f"{type(e).__name__}: {str(e)[:400]}"
        return {"row": ":".join(map(str, row)), "fits": False if out_of_memory(e) else None, "error": error}
    finally:
        gc.collect()


def parse(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--rows", default="full:4:16", help=f"comma-separated {ROW_FORM}")
    parser.add_argument("--chunk-mib", type=int, default=64, help="the largest piece of a leaf a trip moves")
    parser.add_argument(
        "--inflight-mib", type=int, default=None, help="the pipeline's host budget (default: the step's own)"
    )
    parser.add_argument(
        "--set", default="", help="KEY=VALUE,... overrides of the preset's fields (whole numbers)"
    )
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--small", action="store_true", help="the kind's small config (a CPU)")
    parser.add_argument("--compare", action="store_true", help="also the device step, where it fits")
    parser.add_argument("--compare-preset", default=None)
    parser.add_argument("--compare-seq", type=int, default=1024)
    parser.add_argument("--compare-micro", type=int, default=4)
    parser.add_argument("--json", default=None)
    parser.add_argument(
        "--ram-floor-gib",
        type=float,
        default=None,
        help="end the run, with every thread's stack, once the machine has less RAM available (devicekit.ram_tripwire)",
    )
    parser.add_argument(
        "--ram-trail-gib",
        type=float,
        default=None,
        help="with --ram-floor-gib: a line each time the RAM available moves this much, naming where each thread is",
    )
    args = parser.parse_args(argv)
    args.rows = [parse_row(row) for row in args.rows.split(",")]  # before anything runs
    if args.ram_floor_gib is not None and not args.ram_floor_gib > 0:
        parser.error(f"--ram-floor-gib {args.ram_floor_gib}: the floor is a number of GiB > 0")
    if args.ram_trail_gib is not None and not (args.ram_trail_gib > 0 and args.ram_floor_gib is not None):
        parser.error(f"--ram-trail-gib {args.ram_trail_gib}: a number of GiB > 0, with --ram-floor-gib")
    if args.inflight_mib is not None and args.inflight_mib < 1:
        parser.error(f"--inflight-mib {args.inflight_mib}: the budget is a whole number of MiB >= 1")
    return args


def overrides(text: str) -> dict[str, int]:
    """``--set``'s ``KEY=VALUE,...`` as fields; SystemExit with one line naming a malformed one."""
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        if not value.isdigit():
            raise SystemExit(
                f"host_update: bad --set item {item!r}: the form is KEY=VALUE, VALUE a whole number"
            )
        out[key] = int(value)
    return out


def main(argv=None) -> int:
    args = parse(argv)
    if args.ram_floor_gib is not None:
        ram_tripwire(args.ram_floor_gib, trail_gib=args.ram_trail_gib)
    cfg = zoo.get_config(config(args.preset, args.small), **overrides(args.set))
    if args.small:
        args.seq = cfg.max_len
    stats = jax.devices()[0].memory_stats() or {}
    limit = int(stats.get("bytes_limit", 2**62))
    results = []
    say(f"{args.preset}: drawing params on the device, copying them to the host")
    params = host_params(cfg)
    for row in args.rows:
        results.append(row_result(cfg, params, row, args, limit))
        print(json.dumps(results[-1]), flush=True)
    del params
    if args.compare:
        results.append(compare(args))
        print(json.dumps(results[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r.get("fits", False) is None for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
