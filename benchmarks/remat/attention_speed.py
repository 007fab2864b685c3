"""``zoo train``'s step under each attention kind, side by side in one process on this machine.

    .venv/bin/python benchmarks/remat/attention_speed.py --model transformer-xs --batch 8 --seq 64

Every kind runs the same model, params and batch; the steps take turns in timed rounds
(``zoo.bench.common.time_in_rounds``), and a kind's ratio is the median of its per-round step
time over dense's. Off a TPU, ``splash`` is the Pallas kernel in interpret mode: what this
measures there is what a CPU run of ``attention = "splash"`` costs, not the kernel's speed on
a chip (benchmarks/device/RESULTS.md has that). Prints one JSON line per kind, then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax

from zoo.api import example_batch, example_labels
from zoo.bench.common import median_ratio, time_in_rounds
from zoo.bench.step import compile_step
from zoo.models import canonical
from zoo.models.registry import get_config
from zoo.ui import print_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer-xs")
    parser.add_argument("--kinds", default="dense,chunked,splash")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=3, help="steps per timed round")
    args = parser.parse_args()
    kinds = [k.strip() for k in args.kinds.split(",")]
    base = get_config(args.model)
    x = example_batch(base, args.batch, seed=1, seq_len=args.seq)
    y = example_labels(base, x)
    params = canonical.init_params(base, 0)
    runs, steppers = {}, {}
    for kind in kinds:
        cfg = get_config(args.model, attention=kind)
        step = compile_step(cfg, x, y, params=params)
        runs[kind] = {"state": step.state, "compile_s": step.compile_s}
        steppers[kind] = step.stepper(runs[kind])
    times = time_in_rounds(steppers, args.rounds, args.steps)
    rows = []
    for kind in kinds:
        ms = statistics.median(times[kind]) * 1e3
        row = {
            "model": args.model,
            "attention": kind,
            "platform": jax.devices()[0].platform,
            "batch": args.batch,
            "seq": args.seq,
            "step_ms": ms,
            "examples_per_s": args.batch / (ms / 1e3),
            "of_dense": median_ratio(times[kind], times[kinds[0]]),
            "compile_s": runs[kind]["compile_s"],
        }
        print(json.dumps(row))
        rows.append(row)
    print_table(
        f"{args.model}, batch {args.batch} x {args.seq}, {rows[0]['platform']}; median of {args.rounds} rounds",
        ["attention", "step ms", "examples/s", f"step x {kinds[0]}", "compile s"],
        [
            (
                r["attention"],
                f"{r['step_ms']:.1f}",
                f"{r['examples_per_s']:.1f}",
                f"{r['of_dense']:.2f}",
                f"{r['compile_s']:.1f}",
            )
            for r in rows
        ],
    )


if __name__ == "__main__":
    main()
