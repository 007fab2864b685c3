"""``--remat auto``: train with the fastest (remat policy, placement) whose step fits a budget.

The budget is ``--memory-budget`` (``train.memory_budget``) or, without one, the device's own
memory (:func:`device_memory`): ``memory_stats()["bytes_limit"]``, or where the runtime reports
none, a TPU's HBM capacity (``pallas.tpu.get_tpu_info().hbm_capacity_bytes``), less
:data:`SAFETY` of it. Never ``peak_bytes_in_use``: on a TPU it leaves out a program's
temporaries. A CPU reports no limit, and there the flag is required.

The candidates are every remat policy at every placement of the state
(:data:`zoo.train.remat_search.PLACEMENTS`: the three in-program ones, by their ``[train]
offload`` names, and the update on the host, where it can run: one device with a CPU backend
beside it) on an accelerator; on a CPU, whose ``pinned_host`` and ``device`` memory are one RAM
(:mod:`zoo.parallel.offload`), every policy at the run's own placement. They are measured and
chosen by :mod:`zoo.train.remat_search`, the chooser ``zoo bench remat --budget`` calls too,
for the run's exact step (model, batch shapes, freezing, DP, optimizer, precision). The table it
chose from is printed, the run's summary says what was chosen and why (``remat_auto``: the
budget and where it came from, the reason, and every candidate's need and time), and the
choice is cached in ``$ZOO_CACHE_DIR/remat-auto.json`` (:mod:`zoo.cache`), keyed by what it
depends on, so a second run does not search. When nothing fits, the run is refused, naming the
smallest need found.
"""

from __future__ import annotations

import jax

from zoo.cache import ChoiceCache, digest
from zoo.errors import ZooError
from zoo.remat import policy_names
from zoo.train import remat_search
from zoo.train.remat_search import (
    HOST,
    IN_PROGRAM,
    PLACEMENTS,
    Candidate,
    candidates,
    placement_of,
    placement_row,
)

CACHE_FILE = "remat-auto.json"
CACHE = ChoiceCache(CACHE_FILE)
SEARCH_VERSION = 3  # in the cache key: a choice made by an older search is made again
# Kept out of a budget taken from the device: memory_analysis() does not count the program's
# code, the batch the loader has already placed for the next step, the eval step's buffers or
# the allocator's fragmentation. 5% of a 15.75 GiB v5e chip is 0.79 GiB, several times the
# first three at llama-1b's T 2048 shapes.
SAFETY = 0.05


def cache_path():
    return CACHE.path


def _device():
    """The device whose memory is the budget (a seam for tests)."""
    return jax.devices()[0]


def host_memory_is_separate() -> bool:
    """Whether host memory is not the device's: an accelerator's HBM is not its host's RAM; a
    CPU's ``pinned_host`` and ``device`` are the same memory."""
    return _device().platform != "cpu"


def _tpu_hbm() -> int | None:
    """A TPU's HBM capacity from Pallas' chip table (None where it has none)."""
    try:
        from jax.experimental.pallas import tpu as pltpu

        return int(pltpu.get_tpu_info().hbm_capacity_bytes) or None
    except Exception:  # noqa: BLE001 (an older JAX, an unknown chip: no figure, not a failed run)
        return None


def device_memory(device) -> tuple[int, str] | None:
    """``(bytes, where they came from)``: the allocator's ``bytes_limit``, else (a TPU) the
    chip's HBM capacity; None for a device that reports neither (a CPU)."""
    try:
        stats = device.memory_stats() or {}
    except Exception:  # noqa: BLE001 (a backend without memory stats)
        stats = {}
    if stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), "memory_stats bytes_limit"
    hbm = _tpu_hbm() if device.platform == "tpu" else None
    return (hbm, "tpu_info hbm_capacity_bytes") if hbm else None


def budget_of(run) -> tuple[int, str]:
    """``(budget in bytes, its source)``: ``"flag"`` (``--memory-budget``) or ``"device"``
    (:func:`device_memory` less :data:`SAFETY`). A device that reports no memory (a CPU) and
    no flag is refused in one line."""
    flag = run.recipe.train.memory_budget
    if flag is not None:
        return int(flag), "flag"
    device = _device()
    memory = device_memory(device)
    if memory is None:
        raise ZooError(
            f"--remat auto needs a budget: the {device.platform} device reports no memory limit to "
            "take as one; add --memory-budget 256MiB (or set train.memory_budget)"
        )
    return int(memory[0] * (1 - SAFETY)), "device"


def candidates_for(engine, policies=None) -> list[Candidate]:
    """``policies`` (default: every one) at every placement on an accelerator (the update on
    the host where ``engine``'s layout can run it: :meth:`Placement.check`); at ``engine``'s
    own on a CPU (there an offload moves and saves nothing)."""
    if not host_memory_is_separate():
        return candidates(policies or policy_names(), (placement_of(engine),))
    try:
        placement_row(HOST).check(layout=engine.layout)
        where = PLACEMENTS
    except ValueError:  # a mesh of several devices, or no CPU backend beside the device
        where = IN_PROGRAM
    return candidates(policies or policy_names(), where)


def apply(engine, chosen: dict):
    """``engine`` with the chosen policy and placement."""
    return remat_search.with_candidate(engine, Candidate(chosen["policy"], chosen["offload"]))


def _key(run, batch: dict, budget: int, among: list[Candidate]) -> str:
    device = _device()
    parts = {
        "search": SEARCH_VERSION,
        "cfg": repr(run.cfg),
        "backend": run.engine.backend,
        "batch": {k: [list(v.shape), str(v.dtype)] for k, v in sorted(batch.items())},
        "freeze": [sorted(run.freeze.frozen_leaves), sorted(run.freeze.frozen_rows.items())],
        "dp": repr(run.engine.dp),
        "optim": repr(run.recipe.optim),
        "budget": budget,
        "device": [device.platform, device.device_kind, jax.device_count()],
        "jax": jax.__version__,
        "candidates": [c.label for c in among],
        "microbatch": run.engine.microbatch_size,  # accumulation changes the step's activations
        "precision": run.engine.precision.name,
    }
    return digest(parts)


def _whole(entry) -> bool:
    chosen = entry["chosen"]
    return (
        chosen["policy"] in policy_names()
        and chosen["offload"] in PLACEMENTS
        and isinstance(entry["rows"], list)
    )


def choose(run, batch: dict, progress=None) -> tuple[dict, list[dict], bool]:
    """``(chosen, the rows it was chosen from, whether they came from the cache)``; ``chosen``
    holds the ``policy``, the ``offload`` (its placement), the ``budget``, its
    ``budget_source``, the device memory it came from, and the ``reason``."""
    budget, source = budget_of(run)
    among = candidates_for(run.engine)
    key = _key(run, batch, budget, among)
    cached = CACHE.get(key, _whole)
    if cached is not None:
        return {**cached["chosen"], "budget_source": source}, cached["rows"], True
    rows = remat_search.search(
        run.engine,
        run.params,
        batch,
        budget,
        among,
        host_separate=host_memory_is_separate(),
        progress=progress,
    )
    best = remat_search.pick(rows)
    if best is None:
        raise nothing_fits(rows, budget)
    chosen = {
        "policy": best["policy"],
        "offload": best["offload"],
        "budget": budget,
        "reason": reason(best, rows, budget),
    }
    if source == "device":
        memory, field = device_memory(_device())
        chosen["device_memory"] = {"bytes": memory, "from": field, "kept_free": SAFETY}
    CACHE.put(key, {"chosen": chosen, "rows": rows})
    return {**chosen, "budget_source": source}, rows, False


def candidate_table(rows: list[dict]) -> list[dict]:
    """The summary's view of the rows: each candidate's need, whether it fit, its time and why not."""
    out = []
    for r in rows:
        note = next(
            (f"{k.replace('_', ' ')} {r[k]}" for k in ("same_as", "dominated_by") if r.get(k)),
            "does not compile: out of memory" if r.get("compile_oom")
            else "out of memory when run" if r.get("out_of_memory")
            else f"stopped after {len(r['round_ms'])} round" if r.get("stopped") else "",
        )  # fmt: skip
        out.append(
            {
                "policy": r["policy"],
                "offload": r["offload"],
                "need_bytes": r.get("need_bytes"),
                "fits": r.get("fits"),
                "step_ms": r.get("step_ms"),
                **({"note": note} if note else {}),
            }
        )
    return out


def resolve(run, batch: dict, console) -> dict:
    """What to train ``run`` with (:func:`choose`'s ``chosen``, with the ``candidates``
    table); prints the table it chose from."""
    from zoo.ui import print_table

    def progress(message: str) -> None:
        console.print(message, style="dim", markup=False, highlight=False)

    chosen, rows, cached = choose(run, batch, progress)
    mark = (chosen["policy"], chosen["offload"])
    one_placement = len({r["offload"] for r in rows}) == 1  # then a candidate is named by its policy
    table = candidate_table(rows)

    def name(r: dict) -> str:
        same = r.get("same_as")
        if same:
            return f"{r['policy']} (= {same.split('/')[0] if one_placement else same})"
        return r["policy"] + (" <" if (r["policy"], r["offload"]) == mark else "")

    print_table(
        f"--remat auto under {chosen['budget'] / 2**20:.1f} MiB ({chosen['budget_source']}): {chosen['policy']}"
        + ("" if one_placement else f", offload {chosen['offload']}")
        + (f" (cached in {cache_path()})" if cached else ""),
        ["policy", "offload", "need MiB", "temp MiB", "host MiB", "fits", "step ms", "note"],
        [
            (
                name(r),
                r["offload"],
                *(
                    (
                        f"{r['need_bytes'] / 2**20:.1f}",
                        f"{r['temp_bytes'] / 2**20:.1f}",
                        f"{r['host_bytes'] / 2**20:.1f}",
                    )
                    if r.get("need_bytes") is not None
                    else ("-", "-", "-")
                ),
                "yes" if r.get("fits") else "no",
                "-" if r.get("step_ms") is None else f"{r['step_ms']:.1f}",
                "" if r.get("same_as") else t.get("note", ""),
            )
            for r, t in zip(rows, table, strict=True)
        ],
        out=console,
    )
    console.print(f"--remat auto: {chosen['reason']}", markup=False, highlight=False)
    return {**chosen, "candidates": table}


# --- what the run says ------------------------------------------------------------------


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def _why_not(row: dict, budget: int) -> str:
    if row.get("compile_oom"):
        return "does not compile: out of memory"
    if row.get("out_of_memory"):
        return f"needs {_size(row['need_bytes'])}, out of memory when run"
    if "resident_bytes" in row:
        return f"its state and batch alone need {_size(row['need_bytes'])} > {_size(budget)}"
    return f"needs {_size(row['need_bytes'])} > {_size(budget)}"


def reason(chosen: dict, rows: list[dict], budget: int) -> str:
    """Why ``chosen`` won, in one line: how many fit and ran, the runner-up, and what did not fit."""
    ran = [r for r in rows if r.get("fits") and r.get("step_ms") is not None and not r.get("same_as")]
    text = f"fastest of {len(ran)} fitting ({chosen['step_ms']:.1f} ms/step, needs {_size(chosen['need_bytes'])})"
    others = sorted((r for r in ran if r is not chosen), key=lambda r: r["step_ms"])
    if others:
        text += f"; next {others[0]['label']} ({others[0]['step_ms']:.1f} ms)"
    over = [r for r in rows if not r.get("fits") and not r.get("same_as") and not r.get("dominated_by")]
    if over:
        named = ", ".join(f"{r['label']} ({_why_not(r, budget)})" for r in over[:3])
        text += f"; over budget: {named}" + (f" and {len(over) - 3} more" if len(over) > 3 else "")
    return text


def _way_out(rows: list[dict]) -> str:
    """What a "nothing fits" line offers besides a smaller step: the state off the chip, unless
    the update on the host was a candidate and did not fit either."""
    if any(r["offload"] == HOST for r in rows):
        return ""
    return (
        ", or keep the optimizer state and the float32 params on the host and update there "
        "(--placement update-on-host, with a named --remat policy)"
    )


def nothing_fits(rows: list[dict], budget: int) -> ZooError:
    """Why no candidate fits ``budget``, naming the smallest need found."""
    head = f"--remat auto: no policy fits the memory budget of {budget:,} bytes"
    way_out = _way_out(rows)
    compiled = [r for r in rows if r.get("temp_bytes") is not None]
    if not compiled and any("resident_bytes" in r for r in rows):
        least = min(r["resident_bytes"] for r in rows if "resident_bytes" in r)
        return ZooError(
            f"{head}: the state and batch alone need {least:,} bytes at the least. Shrink the batch or model{way_out}"
        )
    if not compiled:
        return ZooError(
            f"{head}: the device's compiler refused all {len(rows)} for memory. Shrink the batch or model{way_out}"
        )
    ran_out = [r["label"] for r in compiled if r.get("out_of_memory") and r["need_bytes"] <= budget]
    if ran_out:
        return ZooError(
            f"{head}: {', '.join(ran_out)} fit by their compiled footprint but ran out of memory when run. "
            f"Shrink the batch or model{way_out}"
        )
    small = min(compiled, key=lambda r: r["need_bytes"])
    return ZooError(
        f"{head} ({budget / 2**20:.1f} MiB); the smallest footprint is {small['label']!r} at "
        f"{small['need_bytes']:,} bytes ({small['need_bytes'] / 2**20:.1f} MiB: temp {small['temp_bytes']:,} + "
        f"arguments {small['argument_bytes']:,}). Raise --memory-budget, or shrink the batch or model{way_out}"
    )
