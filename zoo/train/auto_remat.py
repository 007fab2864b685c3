"""``--remat auto --memory-budget B``: train with the fastest remat policy that fits B.

For the run's exact step (its model, batch shapes, freezing, DP and optimizer) every named
policy's train step is compiled; its footprint is XLA's compiled temp plus its arguments
(params, optimizer state, frozen weights, batch). Those within the budget run one untimed and
three timed steps on the real device, and the fastest median wins (under the run's precision
policy: a bf16 step keeps bf16 residuals). The table it chose from is printed,
and the choice is cached per (model, shapes, backend, device, budget...) in
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

from zoo.remat import choose_under_budget, footprint, get_policy, nothing_fits, policy_names
from zoo.scan import StackPlan
from zoo.train.runlog import atomic_write

CACHE_FILE = "remat-auto.json"
TIMED_STEPS = 3  # per fitting policy, after an untimed one; the median decides


def cache_path() -> Path:
    root = os.environ.get("ZOO_CACHE_DIR") or Path.home() / ".cache" / "zoo"
    return Path(root) / CACHE_FILE


def _key(run, batch: dict, budget: int) -> str:
    device = jax.devices()[0]
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
    if not run.engine.precision.is_identity:  # float32 keys stay those of runs before the policy
        parts["precision"] = run.engine.precision.name
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def _read(key: str) -> dict | None:
    try:
        entry = json.loads(cache_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and entry.get("chosen") in policy_names() else None


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


def with_policy(engine, policy: str):
    """``engine`` with its stack on ``policy`` (same frozen prefix)."""
    return dataclasses.replace(engine, stack=StackPlan(get_policy(policy), engine.stack.frozen_prefix))


def measure(run, batch: dict, budget: int, policies=None) -> list[dict]:
    """One row per policy: compiled temp and argument bytes, and, for those that fit, the
    time of one step (after an untimed one)."""
    rows, timed = [], {}  # timed: program text -> its row (one timing per distinct program)
    for policy in policies or policy_names():
        engine = with_policy(run.engine, policy)
        state, frozen = engine.init_state(run.params, 0, jax.random.key(0))
        lowered = engine.train_step.lower(state, frozen, batch)
        program = hashlib.sha256(lowered.as_text().encode()).hexdigest()
        compiled = lowered.compile()
        stats = compiled.memory_analysis()
        row = {
            "policy": policy,
            "temp_bytes": int(stats.temp_size_in_bytes),
            "argument_bytes": int(stats.argument_size_in_bytes),
            "step_ms": None,
        }
        if program in timed:  # the same program as an earlier policy: the same step
            rows.append({**row, "step_ms": timed[program]["step_ms"], "same_as": timed[program]["policy"]})
            continue
        timed[program] = row
        if footprint(row) <= budget:
            times = []
            for _ in range(1 + TIMED_STEPS):  # the first is untimed
                tic = time.perf_counter()
                state, out = compiled(state, frozen, batch)
                jax.block_until_ready((state, out))
                times.append(time.perf_counter() - tic)
            row["step_ms"] = round(1e3 * statistics.median(times[1:]), 3)
        rows.append(row)
    return rows


def choose(run, batch: dict) -> tuple[str, list[dict], bool]:
    """``(chosen policy, the rows it was chosen from, whether they came from the cache)``."""
    budget = run.recipe.train.memory_budget
    key = _key(run, batch, budget)
    cached = _read(key)
    if cached is not None:
        return cached["chosen"], cached["rows"], True
    rows = measure(run, batch, budget)
    timed = [r for r in rows if r["step_ms"] is not None and "same_as" not in r]
    chosen = choose_under_budget(timed, budget)[0] if timed else None
    if chosen is None:
        raise nothing_fits(rows, budget)
    rows = [{**r, "fits": footprint(r) <= budget} for r in rows]
    _write(key, {"chosen": chosen, "rows": rows, "budget": budget})
    return chosen, rows, False


def resolve(run, batch: dict, console) -> str:
    """The policy to train ``run`` with; prints the table it chose from."""
    from zoo.ui import print_table

    chosen, rows, cached = choose(run, batch)
    budget = run.recipe.train.memory_budget
    print_table(
        f"--remat auto under {budget / 2**20:.1f} MiB: {chosen}"
        + (f" (cached in {cache_path()})" if cached else ""),
        ["policy", "temp MiB", "args MiB", "fits", "step ms"],
        [
            (
                r["policy"]
                + (" <" if r["policy"] == chosen else "")
                + (f" (= {r['same_as']})" if r.get("same_as") else ""),
                f"{r['temp_bytes'] / 2**20:.1f}",
                f"{r['argument_bytes'] / 2**20:.1f}",
                "yes" if r["fits"] else "no",
                "-" if r["step_ms"] is None else f"{r['step_ms']:.1f}",
            )
            for r in rows
        ],
        out=console,
    )
    return chosen
