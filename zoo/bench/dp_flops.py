"""``zoo bench dp --flops``: what each row's step costs in XLA's counted FLOPs and compiled
temp memory, compile only (nothing runs), so it works at real size on a CPU.

XLA's cost analysis counts the body of a while loop once, whatever its trip count, so a model
whose layer stack is a ``lax.scan`` would be counted as one layer (and ghost clipping's per-layer
work, which runs outside the scan, as all of them). While these programs are compiled the
stack's scan is unrolled (:func:`unrolled_stack`); the temp bytes are then those of the
unrolled program.
"""

from __future__ import annotations

import contextlib

import jax

from zoo import scan


@contextlib.contextmanager
def unrolled_stack():
    """Every layer stack traced inside runs as a fully unrolled ``lax.scan``."""
    real = scan._scan

    def unrolled(body, xs, h):
        return jax.lax.scan(lambda carry, x: body(x, carry), h, xs, unroll=True)

    scan._scan = unrolled
    try:
        yield
    finally:
        scan._scan = real


def counted(compiled) -> float:
    """XLA's counted FLOPs of a compiled program (0 where the backend counts none)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return float((cost or {}).get("flops", 0.0))


def flop_rows(runs: dict, baseline: str) -> list[dict]:
    """One row per compiled run: GFLOP and temp, each also over the baseline's."""
    base = runs[baseline]
    base_flops, base_temp = counted(base["compiled"]), base["temp"]
    rows = []
    for name, run in runs.items():
        flops = counted(run["compiled"])
        rows.append(
            {
                "method": name,
                "flops": flops,
                "gflop": round(flops / 1e9, 2),
                "flop_ratio": round(flops / base_flops, 3) if base_flops else None,
                "temp_bytes": run["temp"],
                "temp_ratio": round(run["temp"] / base_temp, 3) if base_temp else None,
                "compile_s": round(run["compile_s"], 3),
            }
        )
    return rows


def print_flops(result: dict, title: str) -> None:
    from zoo.ui import print_table

    print_table(
        title,
        ["method", "GFLOP", "FLOP x", "temp MiB", "temp x", "compile s"],
        [
            (
                r["method"],
                f"{r['gflop']:.1f}",
                "-" if r["flop_ratio"] is None else f"{r['flop_ratio']:.3f}",
                f"{r['temp_bytes'] / 2**20:.1f}",
                "-" if r["temp_ratio"] is None else f"{r['temp_ratio']:.2f}",
                f"{r['compile_s']:.1f}",
            )
            for r in result["rows"]
        ],
    )
