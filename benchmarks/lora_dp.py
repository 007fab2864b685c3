"""DP-LoRA against frozen-layer DP fine-tuning, on the same recipe, data, epsilon and seeds.

Runs ``digits-transformer-dp-lora`` (or ``--recipe``) through ``zoo.train.loop.train`` -- what
``zoo train`` runs -- in three variants, for each seed (``train.seed`` and ``dp.noise_seed``
pinned to it):

* ``dp-lora``: the recipe as shipped (adapters only, DP-SGD, ghost clipping);
* ``dp-frozen:<patterns>``: the same recipe without adapters, the base trained with DP-SGD
  except for the frozen patterns (one variant per ``--frozen``, default two);
* ``lora``: the adapters without DP (fixed batches of ``dp.expected_batch_size``).

Every variant keeps the recipe's optimizer, steps, epsilon and sampling rate: nothing is tuned
per variant, and nothing is chosen on the eval split. Reports eval accuracy (mean, standard
deviation and each seed) and trainable parameters::

    python benchmarks/lora_dp.py --base runs/digits-transformer-pretrain --seeds 0,1,2 --json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from zoo import recipes
from zoo.train.loop import train

FROZEN = ("embed,pos,blocks[:-1]", "embed,pos")


def variants(recipe, frozen):
    yield "dp-lora", {}
    for patterns in frozen:
        yield (
            f"dp-frozen:{patterns}",
            {"lora.rank": 0, "lora.targets": [], "freeze.patterns": patterns.split(",")},
        )
    yield "lora", {"dp.enabled": False, "train.batch_size": int(recipe.dp.expected_batch_size)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits-transformer-dp-lora")
    parser.add_argument("--base", help="the base run directory (default: the recipe's freeze.init_from)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--frozen", action="append", help=f"frozen patterns, comma-separated (default {FROZEN})"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    recipe = recipes.load_recipe(args.recipe)
    if args.base:
        recipe = recipes.with_values(recipe, {"freeze.init_from": args.base})
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for name, values in variants(recipe, args.frozen or FROZEN):
        accuracies, summary = [], {}
        for seed in seeds:
            run = recipes.with_values(recipe, {**values, "train.seed": seed, "dp.noise_seed": seed})
            with tempfile.TemporaryDirectory() as out:
                summary = train(run, out, show_progress=False)
            accuracies.append(summary["eval_accuracy"])
            print(f"{name} seed {seed}: eval accuracy {accuracies[-1]:.4f}", flush=True)
        rows.append(
            {
                "run": name,
                "accuracy_mean": statistics.mean(accuracies),
                "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                "accuracies": accuracies,
                "epsilon": summary.get("epsilon"),
                "trainable_params": summary["trainable_params"],
            }
        )
    if args.json:
        print(json.dumps({"recipe": recipe.name, "seeds": seeds, "rows": rows}))
    else:
        for row in rows:
            eps = "inf" if row["epsilon"] is None else f"{row['epsilon']:.2f}"
            print(
                f"{row['run']:<32} eps {eps:>5}  accuracy {row['accuracy_mean']:.4f} +- {row['accuracy_std']:.4f}"
                f"  trainable {row['trainable_params']:,}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
