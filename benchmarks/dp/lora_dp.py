"""DP-LoRA against frozen-layer DP fine-tuning, on the same recipe, data, epsilon and seeds.

Runs ``digits-transformer-dp-lora`` (or ``--recipe``) through ``zoo.train.loop.train`` -- what
``zoo train`` runs -- in three variants, for each seed (``train.seed`` and ``dp.noise_seed``
pinned to it):

* ``dp-lora``: the recipe as shipped (adapters only, DP-SGD, ghost clipping);
* ``dp-frozen:<patterns>``: the same recipe without adapters, the base trained with DP-SGD
  except for the frozen patterns (one variant per ``--frozen``, default two);
* ``lora``: the adapters without DP (fixed batches of ``dp.expected_batch_size``).

Every variant keeps the recipe's steps, epsilon and sampling rate, and its optimizer but for
``--frozen-lr``: the frozen-layer runs' learning rate, to be chosen on a validation split with
``benchmarks/dp/sweep.py sweep`` (nothing here reads the eval split to choose). Reports eval
accuracy and loss (mean, standard deviation and each seed) and trainable parameters::

    python benchmarks/dp/sweep.py sweep --recipe digits-transformer-dp-lora --epsilons 3 \
        --seeds 0,1,2 --val-size 180 --grid optim.lr=0.003,0.01,0.03,0.1 \
        --set lora.rank=0 --set lora.targets=[] --set 'freeze.patterns=["embed","pos","blocks[:-1]"]'
    python benchmarks/dp/lora_dp.py --base runs/digits-transformer-pretrain --seeds 0,1,2 --frozen-lr 0.03
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile

from zoo import recipes
from zoo.commands import settings
from zoo.train.loop import train_recipe

FROZEN = ("embed,pos,blocks[:-1]", "embed,pos")


def variants(recipe, frozen, frozen_lr):
    yield "dp-lora", {}
    lr = {"optim.lr": frozen_lr} if frozen_lr else {}
    for patterns in frozen:
        off = {"lora.rank": 0, "lora.targets": [], "freeze.patterns": patterns.split(",")}
        yield f"dp-frozen:{patterns}", {**off, **lr}
    yield (
        "lora",
        {
            "dp.enabled": False,
            "train.batch_size": int(recipe.dp.expected_batch_size),
            "train.microbatch_size": None,
        },
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="digits-transformer-dp-lora")
    parser.add_argument("--base", help="the base run directory (default: the recipe's model.init_from)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--frozen", action="append", help=f"frozen patterns, comma-separated (default {FROZEN})"
    )
    parser.add_argument(
        "--frozen-lr", type=float, help="optim.lr of the frozen-layer runs (default: the recipe's)"
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    recipe = recipes.load_recipe(args.recipe)
    if args.base:
        recipe = settings.with_values(recipe, {"model.init_from": args.base})
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    for name, values in variants(recipe, args.frozen or FROZEN, args.frozen_lr):
        accuracies, losses, summary = [], [], {}
        for seed in seeds:
            run = settings.with_values(recipe, {**values, "train.seed": seed, "dp.noise_seed": seed})
            with tempfile.TemporaryDirectory() as out:
                summary = train_recipe(run, out, show_progress=False)
            accuracies.append(summary["eval_accuracy"])
            losses.append(summary["eval_loss"])
            print(f"{name} seed {seed}: eval accuracy {accuracies[-1]:.4f}", flush=True)
        rows.append(
            {
                "run": name,
                "accuracy_mean": statistics.mean(accuracies),
                "accuracy_std": statistics.stdev(accuracies) if len(accuracies) > 1 else 0.0,
                "accuracies": accuracies,
                "eval_loss_mean": statistics.mean(losses),
                "lr": run.optim.lr,
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
                f"  eval loss {row['eval_loss_mean']:.4f}  lr {row['lr']:g}  trainable {row['trainable_params']:,}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
