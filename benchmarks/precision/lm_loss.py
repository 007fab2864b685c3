"""Eval loss of a recipe trained in float32 and in bfloat16 (``[train] precision``), over seeds.

``train`` runs ``zoo train RECIPE --set train.seed=S --set train.precision=P --json`` as a
child process per (precision, seed), the precisions of one seed back to back, and appends one
JSON line per run to ``--results``; ``table`` prints the mean and spread of the eval loss per
precision and the bf16 mean over the float32 mean::

    .venv/bin/python benchmarks/precision/lm_loss.py train --recipe python-docs-lm --seeds 0,1,2
    .venv/bin/python benchmarks/precision/lm_loss.py table
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from zoo.bench.common import append_row, run_child, train_command

RESULTS = Path("benchmarks/precision/results/lm_loss.jsonl")
PRECISIONS = ("float32", "bfloat16")


def cmd_train(args) -> None:
    for seed in [int(s) for s in args.seeds.split(",")]:
        for precision in PRECISIONS:
            out = f"/tmp/zoo-precision/{args.recipe}-{precision}-s{seed}"
            sets = [f"train.seed={seed}", f"train.precision={precision}", *(args.set or [])]
            run = run_child(train_command(args.recipe, out, sets))
            summary = run.summary
            result = {
                "recipe": args.recipe,
                "precision": summary["precision"],
                "seed": seed,
                "steps": summary["steps"],
                "eval_loss": summary["eval_loss"],
                "train_loss": summary["train_loss"],
                "examples_per_sec": summary["examples_per_sec"],
                "wall_s": round(run.wall_s, 1),
                "command": run.command,
            }
            append_row(args.results, result)


def cmd_table(args) -> None:
    rows = [json.loads(line) for line in args.results.read_text().splitlines() if line.strip()]
    means = {}
    print("| recipe | precision | seeds | eval loss (mean +- std) | per seed |")
    print("|---|---|---|---|---|")
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        for precision in PRECISIONS:
            runs = sorted(
                (r for r in rows if r["recipe"] == recipe and r["precision"] == precision),
                key=lambda r: r["seed"],
            )
            if not runs:
                continue
            losses = [r["eval_loss"] for r in runs]
            std = statistics.stdev(losses) if len(losses) > 1 else 0.0
            means[recipe, precision] = statistics.mean(losses)
            each = ", ".join(f"{r['seed']}: {r['eval_loss']:.4f}" for r in runs)
            print(
                f"| {recipe} | {precision} | {len(runs)} | {means[recipe, precision]:.4f} +- {std:.4f} | {each} |"
            )
        if (recipe, "float32") in means and (recipe, "bfloat16") in means:
            ratio = means[recipe, "bfloat16"] / means[recipe, "float32"]
            print(f"\n{recipe}: bf16 mean / float32 mean = {ratio:.4f} ({100 * (ratio - 1):+.2f}%)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--recipe", default="python-docs-lm")
    t.add_argument("--seeds", default="0,1,2")
    t.add_argument("--set", action="append", help="extra SECTION.FIELD=VALUE for every run")
    t.add_argument("--results", type=Path, default=RESULTS)
    tb = sub.add_parser("table")
    tb.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    {"train": cmd_train, "table": cmd_table}[args.cmd](args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
