"""``--remat auto``: train with the fastest (remat policy, offload) pair that fits a budget.

The budget is ``--memory-budget`` (``train.memory_budget``) or, without one, the device's own
memory: ``memory_stats()["bytes_limit"]`` less :data:`SAFETY` of it (a CPU reports none, and
then the flag is required). On an accelerator the search runs over every remat policy and every
``[train] offload`` setting; on a CPU, whose ``pinned_host`` and ``device`` memory are one RAM
(:mod:`zoo.parallel.offload`), over the policies at the run's own offload setting.

For the run's exact step (its model, batch shapes, freezing, DP and optimizer) every pair's
train step is compiled; its footprint is what XLA's ``memory_analysis()`` says it needs in
device memory (:func:`zoo.remat.step_bytes`): temp, arguments and the outputs that reuse no
donated buffer, where an offloaded state's host-memory bytes do not count. Those within the
budget run one untimed and three timed steps on the real device, and the fastest median wins
(under the run's precision policy: a bf16 step keeps bf16 residuals). The table it chose from
is printed, the run's summary says what was chosen and why (``remat_auto``), and the choice is
cached per (model, shapes, backend, device, budget, offload settings searched...) in
``$ZOO_CACHE_DIR/remat-auto.json`` (default ``~/.cache/zoo``), so a second run does not search.
When nothing fits, the run is refused, naming the smallest footprint found.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import statistics
import time
from pathlib import Path

import jax

from zoo.configs import OFFLOADS
from zoo.errors import ZooError
from zoo.parallel.placement import offloaded
from zoo.remat import choose_fitting, footprint, get_policy, nothing_fits, policy_names, step_bytes
from zoo.train.runlog import atomic_write

CACHE_FILE = "remat-auto.json"
TIMED_STEPS = 3  # per fitting pair, after an untimed one; the median decides
# Kept out of a budget taken from the device: memory_analysis() does not count the program's
# code, the batch the loader has already placed for the next step, the eval step's buffers or
# the allocator's fragmentation. 5% of a 15.75 GiB v5e chip is 0.79 GiB, several times the
# first three at llama-1b's T 2048 shapes.
SAFETY = 0.05


def cache_path() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or Path.home() / ".cache" / "zoo"
    return Path(root) / CACHE_FILE


def _device():
    """The device whose memory is the budget (a seam for tests)."""
    return jax.devices()[0]


def host_memory_is_separate() -> bool:
    """Whether host memory is not the device's: an accelerator's HBM is not its host's RAM; a
    CPU's ``pinned_host`` and ``device`` are the same memory."""
    return _device().platform != "cpu"


def offload_space(run) -> tuple[str, ...]:
    """The ``[train] offload`` settings the search tries: all of them on an accelerator; on a
    CPU only the run's own (there an offload moves and saves nothing)."""
    return OFFLOADS if host_memory_is_separate() else (run.engine.placement.offload,)


def budget_of(run) -> tuple[int, str]:
    """``(budget in bytes, its source)``: ``"flag"`` (``--memory-budget``) or ``"device"``
    (the device's ``bytes_limit`` less :data:`SAFETY`). A device that reports no limit (a
    CPU) and no flag is refused in one line."""
    flag = run.recipe.train.memory_budget
    if flag is not None:
        return int(flag), "flag"
    device = _device()
    limit = (device.memory_stats() or {}).get("bytes_limit")
    if not limit:
        raise ZooError(
            f"--remat auto needs a budget: the {device.platform} device reports no memory limit to "
            "take as one; add --memory-budget 256MiB (or set train.memory_budget)"
        )
    return int(limit * (1 - SAFETY)), "device"


def _key(run, batch: dict, budget: int, offloads: tuple[str, ...] = ("none",)) -> str:
    device = _device()
    parts = {
        "cfg": repr(run.cfg),
        "backend": run.engine.backend,
        "batch": {k: [list(v.shape), str(v.dtype)] for k, v in sorted(batch.items())},
        "freeze": [sorted(run.freeze.frozen_leaves), sorted(run.freeze.frozen_rows.items())],
        "dp": repr(run.engine.dp),
        "optim": repr(run.recipe.optim),
        "budget": budget,
        "device": [device.platform, device.device_kind, jax.device_count()],
        "jax": jax.__version__,
        "policies": policy_names(),
    }
    if run.engine.microbatch_size is not None:  # accumulation changes the step's activations
        parts["microbatch"] = run.engine.microbatch_size
    if not run.engine.precision.is_identity:  # float32 keys stay those of runs before the policy
        parts["precision"] = run.engine.precision.name
    if tuple(offloads) != ("none",):  # searched over offload settings (or at one of its own)
        parts["offloads"] = list(offloads)
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _read(key: str) -> dict | None:
    try:
        entry = json.loads(cache_path().read_text()).get(key)
        chosen = entry["chosen"]
        ok = chosen["policy"] in policy_names() and chosen["offload"] in OFFLOADS and "reason" in entry
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None
    return entry if ok else None


def _write(key: str, entry: dict) -> None:
    path = cache_path()
    try:
        doc = json.loads(path.read_text())
        doc = doc if isinstance(doc, dict) else {}
    except (OSError, ValueError):
        doc = {}
    doc[key] = entry
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(doc, indent=1) + "\n")


def with_policy(engine, policy: str, offload: str | None = None):
    """``engine`` with its stack on ``policy`` (same frozen prefix), and on ``offload`` if given."""
    get_policy(policy)  # an unknown name fails here, with the valid list
    engine = dataclasses.replace(engine, grad=dataclasses.replace(engine.grad, remat=policy))
    return engine if offload is None else dataclasses.replace(engine, placement=offloaded(offload))


def _time(compiled, state, frozen, batch) -> float | None:
    """Median ms of :data:`TIMED_STEPS` steps after an untimed one; None if the device runs
    out of memory (the footprint does not see everything: it then does not fit)."""
    times = []
    try:
        for _ in range(1 + TIMED_STEPS):  # the first is untimed
            tic = time.perf_counter()
            state, out = compiled(state, frozen, batch)
            jax.block_until_ready((state, out))
            times.append(time.perf_counter() - tic)
    except jax.errors.JaxRuntimeError as error:
        if "RESOURCE_EXHAUSTED" not in str(error):
            raise
        return None
    return round(1e3 * statistics.median(times[1:]), 3)


def does_not_compile(policy: str, offload: str) -> dict:
    """The row of a pair the device's compiler refused for memory: no bytes to show, never chosen."""
    zero = dict.fromkeys(("temp_bytes", "argument_bytes", "output_bytes", "alias_bytes", "host_bytes"), 0)
    return {
        "policy": policy,
        "offload": offload,
        **zero,
        "step_ms": None,
        "out_of_memory": True,
        "compile_oom": True,
    }


def measure(run, batch: dict, budget: int, policies=None, offloads=None) -> list[dict]:
    """One row per (policy, offload): the compiled step's device bytes (:func:`step_bytes`)
    and, for those that fit, the time of one step (after an untimed one)."""
    rows, timed = [], {}  # timed: program text -> its row (one timing per distinct program)
    host_separate = host_memory_is_separate()
    for offload in offloads or (run.engine.placement.offload,):
        for policy in policies or policy_names():
            engine = with_policy(run.engine, policy, offload)
            try:  # a TPU refuses at compile time a program that cannot fit its memory
                state, frozen = engine.init_state(run.params, 0, jax.random.key(0))
                lowered = engine.train_step.lower(state, frozen, batch)
                program = hashlib.sha256(lowered.as_text().encode()).hexdigest()
                compiled = lowered.compile()
            except jax.errors.JaxRuntimeError as error:
                if "RESOURCE_EXHAUSTED" not in str(error):
                    raise
                rows.append(does_not_compile(policy, offload))
                continue
            row = {
                "policy": policy,
                "offload": offload,
                **step_bytes(compiled, host_separate),
                "step_ms": None,
            }
            if program in timed:  # the same program as an earlier pair: the same step
                same = timed[program]
                rows.append(
                    {**row, "step_ms": same["step_ms"], "same_as": f"{same['policy']}/{same['offload']}"}
                )
                continue
            timed[program] = row
            if footprint(row) <= budget:
                row["step_ms"] = _time(compiled, state, frozen, batch)
                row["out_of_memory"] = row["step_ms"] is None
            rows.append(row)
    return rows


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def reason(chosen: dict, rows: list[dict]) -> str:
    """Why ``chosen`` won, from the marked rows: how many fit, and what did not."""
    fitting = [r for r in rows if r["fits"] and r["step_ms"] is not None and "same_as" not in r]
    over = sorted((r for r in rows if not r["fits"] or r["step_ms"] is None), key=footprint)
    text = f"fastest of {len(fitting)} fitting ({chosen['step_ms']:.1f} ms/step)"
    if over:
        named = ", ".join(
            f"{r['policy']}/{r['offload']} (does not compile: out of memory)"
            if r.get("compile_oom")
            else f"{r['policy']}/{r['offload']} ({_gib(footprint(r))}"
            + (", out of memory when run)" if r.get("out_of_memory") else ")")
            for r in over[-3:]
        )
        more = f" and {len(over) - 3} more" if len(over) > 3 else ""
        text += f"; over budget: {named}{more}"
    return text


def choose(run, batch: dict) -> tuple[dict, list[dict], bool]:
    """``(chosen, the rows it was chosen from, whether they came from the cache)``; ``chosen``
    holds the ``policy``, the ``offload``, the ``budget``, its ``budget_source`` and the
    ``reason``."""
    budget, source = budget_of(run)
    offloads = offload_space(run)
    key = _key(run, batch, budget, offloads)
    cached = _read(key)
    if cached is not None:
        return {**cached["chosen"], "budget_source": source}, cached["rows"], True
    rows = measure(run, batch, budget, offloads=offloads)
    best, _ = choose_fitting([r for r in rows if "same_as" not in r], budget)
    if best is None:
        raise nothing_fits(rows, budget)
    rows = [{**r, "fits": footprint(r) <= budget and not r.get("out_of_memory")} for r in rows]
    chosen = {
        "policy": best["policy"],
        "offload": best["offload"],
        "budget": budget,
        "reason": reason(best, rows),
    }
    _write(key, {"chosen": chosen, "rows": rows, "budget": budget, "reason": chosen["reason"]})
    return {**chosen, "budget_source": source}, rows, False


def resolve(run, batch: dict, console) -> dict:
    """What to train ``run`` with (:func:`choose`'s ``chosen``); prints the table it chose from."""
    from zoo.ui import print_table

    chosen, rows, cached = choose(run, batch)
    budget = chosen["budget"]
    mark = (chosen["policy"], chosen["offload"])
    one_offload = len({r["offload"] for r in rows}) == 1  # then a pair is named by its policy

    def same(r: dict) -> str:
        if not r.get("same_as"):
            return ""
        return f" (= {r['same_as'].split('/')[0] if one_offload else r['same_as']})"

    print_table(
        f"--remat auto under {budget / 2**20:.1f} MiB ({chosen['budget_source']}): {chosen['policy']}"
        + ("" if one_offload else f", offload {chosen['offload']}")
        + (f" (cached in {cache_path()})" if cached else ""),
        ["policy", "offload", "temp MiB", "args MiB", "host MiB", "fits", "step ms"],
        [
            (
                r["policy"] + (" <" if (r["policy"], r["offload"]) == mark else "") + same(r),
                r["offload"],
                *(
                    ("-", "-", "-")
                    if r.get("compile_oom")
                    else (
                        f"{r['temp_bytes'] / 2**20:.1f}",
                        f"{r['argument_bytes'] / 2**20:.1f}",
                        f"{r.get('host_bytes', 0) / 2**20:.1f}",
                    )
                ),
                "yes" if r["fits"] else "no",
                "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}",
            )
            for r in rows
        ],
        out=console,
    )
    console.print(f"--remat auto: {chosen['reason']}", markup=False, highlight=False)
    return chosen
