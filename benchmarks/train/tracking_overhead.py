"""What the TensorBoard event writer costs a run: steps per second with ``train.tensorboard``
on and off, in interleaved rounds in one process (the order alternates each round), and the
size of the event files per 1,000 steps.

Steps per second are the loop's whole wall time between its first and last training lines of
``metrics.jsonl`` (``elapsed_sec``): every step, log write, eval and checkpoint in between, so
the writer's cost is inside it (``examples_per_sec`` times the step call alone and would miss
it). Prints one table; the median of the per-round ratios is the figure.

    .venv/bin/python benchmarks/train/tracking_overhead.py digits-mlp --steps 600 --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import warnings
from pathlib import Path

from zoo import recipes
from zoo.commands import settings
from zoo.train.loop import train_recipe
from zoo.train.rundir import ELAPSED, read_records


def steps_per_sec(run_dir: Path) -> float:
    train = [r for r in read_records(run_dir) if "examples_per_sec" in r]
    first, last = train[0], train[-1]
    return (last["step"] - first["step"]) / (last[ELAPSED] - first[ELAPSED])


def one_run(recipe, tensorboard: bool, root: Path, tag: str) -> tuple[float, int]:
    out = root / tag
    run = settings.with_values(recipe, {"train.tensorboard": tensorboard})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train_recipe(run, out, show_progress=False)
    size = sum(p.stat().st_size for p in (out / "tb").glob("events.out.tfevents.*")) if tensorboard else 0
    return steps_per_sec(out), size


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("recipe")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--log-every", type=int, default=10)
    args = p.parse_args()
    recipe = settings.with_values(
        recipes.load_recipe(args.recipe),
        {
            "train.steps": args.steps,
            "train.log_every": args.log_every,
            "train.eval_every": args.steps,
            "train.checkpoint_every": args.steps,
        },
    )
    on, off, ratios, sizes = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        one_run(recipe, True, Path(tmp), "warmup")  # compiles and loads once, outside the rounds
        for i in range(args.rounds):
            order = (True, False) if i % 2 == 0 else (False, True)
            rates = {}
            for tb in order:
                rates[tb], size = one_run(recipe, tb, Path(tmp), f"r{i}-{tb}")
                if tb:
                    sizes.append(size)
            on.append(rates[True])
            off.append(rates[False])
            ratios.append(rates[True] / rates[False])
            print(f"round {i}: on {rates[True]:.1f} steps/s, off {rates[False]:.1f}, on/off {ratios[-1]:.4f}")
    print(
        f"{args.recipe}, {args.steps} steps, log_every {args.log_every}, {args.rounds} interleaved rounds: "
        f"median steps/s on {statistics.median(on):.1f}, off {statistics.median(off):.1f}; "
        f"median of per-round on/off ratios {statistics.median(ratios):.4f}; "
        f"event files {statistics.median(sizes) * 1000 / args.steps / 1024:.1f} KiB per 1,000 steps"
    )


if __name__ == "__main__":
    main()
