"""Soundness and power of ``zoo audit`` on a recipe (docs/dp-audit.md).

Run from the repository root with the project venv::

    python benchmarks/dp/audit.py --recipe digits-mlp-dp --epsilons 1,3,8 --seeds 0,1,2,3,4 \\
        --canaries 1000 --power-canaries 1000,5000

Soundness: every (epsilon, seed, mode) is one ``zoo audit RECIPE --set dp.epsilon=E --seed S
--mode MODE`` (the same function), and its lower bound must stay <= the claimed epsilon.
Power: the same recipe with ``--no-noise`` (clipping on, noise off), white-box and black-box,
for each canary count in ``--power-canaries``. Prints one JSON row per audit and the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time

from zoo import recipes
from zoo.audit.report import audit
from zoo.commands import settings

MODES = ("whitebox", "blackbox")


def one(recipe, canaries: int, mode: str, no_noise: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as out:
        tic = time.perf_counter()
        summary = audit(recipe, out, canaries=canaries, mode=mode, no_noise=no_noise, plot=False)
        summary["seconds"] = time.perf_counter() - tic
    row = {k: summary[k] for k in ("mode", "canaries", "epsilon_claimed", "epsilon_lower_bound", "bounds")}
    row.update(seed=recipe.train.seed, seconds=round(summary["seconds"], 1))
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits-mlp-dp")
    parser.add_argument("--epsilons", default="1,3,8")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--canaries", type=int, default=1000)
    parser.add_argument("--power-canaries", default="1000,5000")
    args = parser.parse_args()
    base = recipes.load_recipe(args.recipe)
    seeds = [int(s) for s in args.seeds.split(",")]
    sound = []
    for eps in (float(e) for e in args.epsilons.split(",")):
        for mode in MODES:
            rows = [
                one(settings.with_values(base, {"dp.epsilon": eps, "train.seed": s}), args.canaries, mode)
                for s in seeds
            ]
            worst = max(r["epsilon_lower_bound"] for r in rows)
            claimed = max(r["epsilon_claimed"] for r in rows)
            sound.append(
                (eps, mode, claimed, [round(r["epsilon_lower_bound"], 3) for r in rows], worst <= claimed)
            )
    power = [one(base, int(m), mode, no_noise=True) for m in args.power_canaries.split(",") for mode in MODES]
    print("\n| target eps | mode | claimed eps | lower bound per seed | all <= claimed |")
    print("|---|---|---|---|---|")
    for eps, mode, claimed, bounds, ok in sound:
        print(f"| {eps:g} | {mode} | {claimed:.3f} | {', '.join(f'{b:.2f}' for b in bounds)} | {ok} |")
    print("\n| canaries | mode | lower bound (no noise) | per score |")
    print("|---|---|---|---|")
    for row in power:
        per = ", ".join(f"{k} {v:.2f}" for k, v in row["bounds"].items())
        assert math.isinf(row["epsilon_claimed"])
        print(f"| {row['canaries']} | {row['mode']} | {row['epsilon_lower_bound']:.2f} | {per} |")


if __name__ == "__main__":
    main()
