"""User-level DP three ways on one dataset with users: ULS, ELS, and record-level DP-SGD
turned into a user-level guarantee by group privacy. Eval loss against the user-level
epsilon, a table and a plot.

Every run is the recipe ``skewed-users-mlp-dp`` (the ``skewed-users`` table: 2,000 users with
2 to 41 records each; its user column read, so train and eval hold the same whole users) with
its privacy settings changed:

- ``uls``: as the recipe: ``dp.unit = "user"``, E users a step, ``k`` records each, the user's
  mean gradient clipped (zoo.dp.users); its epsilon is per user.
- ``els``: ``dp.unit = "user"`` with ``dp.sampler = "els"``: records sampled, each user capped at
  ``k`` records, accounted per user with the mixture-of-Gaussians accountant.
- ``group``: ``dp.unit = "record"`` calibrated to ``(eps / g, delta / (g e^((g-1) eps / g)))``
  per record, ``g = 41`` the most records a user has: by group privacy, ``(eps, delta)`` per
  user.

Each row of the JSONL output is one run: algorithm, the user-level epsilon asked for, the seed
(``train.seed``: the split, the init and the draws; the noise is each run's own secret), eval
loss and accuracy, and the run's own (epsilon, delta) turned into the user's. The table and the
plot take each cell's mean over the seeds (the plot's bars span their min and max); the table
gives each algorithm's eval loss at epsilon 8 and the epsilon at which it reaches ULS's loss at
epsilon 8 (log-linear between the cells)::

    .venv/bin/python benchmarks/dp/users_table.py --epsilons 1,2,4,8,16 --seeds 0,1,2 --out benchmarks/dp/results/users
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import warnings
from pathlib import Path

import numpy as np

from zoo import recipes
from zoo.commands import settings
from zoo.data.forms.skewed_users import HEAVIEST
from zoo.train.loop import train_recipe

DELTA = 1e-5
RECIPE = "skewed-users-mlp-dp"


def group_budget(epsilon: float, delta: float, g: int) -> tuple[float, float]:
    """Per-record ``(eps, delta)`` that group privacy turns into ``(epsilon, delta)`` for a
    group of ``g`` records: ``(g e, g e^((g-1) e) d)``."""
    e = epsilon / g
    return e, delta / (g * math.exp((g - 1) * e))


def recipe_for(algorithm: str, epsilon: float, args, seed: int = 0) -> object:
    values = {
        "dp.epsilon": epsilon,
        "dp.noise_multiplier": None,
        "dp.delta": DELTA,
        "dp.records_per_user": args.k,
        "train.steps": args.steps,
        "train.eval_every": args.steps,
        "train.checkpoint_every": args.steps,
        "train.tensorboard": False,
        "train.seed": seed,
    }
    if algorithm == "uls":
        values |= {"dp.unit": "user", "dp.expected_batch_size": args.users_per_step}
    elif algorithm == "els":
        values |= {
            "dp.unit": "user",
            "dp.sampler": "els",
            "dp.expected_batch_size": args.users_per_step * args.k,
        }
    else:  # record-level, a user-level guarantee by group privacy over the heaviest user's records
        e, d = group_budget(epsilon, DELTA, HEAVIEST)
        values |= {"dp.unit": "record", "dp.epsilon": e, "dp.delta": d}
        values["dp.expected_batch_size"] = args.users_per_step * args.k
    return settings.with_values(recipes.load_recipe(RECIPE), values)


def cells(rows: list[dict]) -> list[dict]:
    """One row per asked epsilon: the mean over its seeds of the user-level epsilon, the eval
    loss and the accuracy, with the loss's and accuracy's (min, max) over the seeds."""
    by_epsilon: dict[float, list[dict]] = {}
    for row in rows:
        by_epsilon.setdefault(row["epsilon"], []).append(row)
    out = []
    for epsilon, group in sorted(by_epsilon.items()):
        cell = {"epsilon": epsilon, "seeds": len(group)}
        for key in ("user_epsilon", "eval_loss", "eval_accuracy"):
            values = [r[key] for r in group]
            cell[key], cell[f"{key}_range"] = float(np.mean(values)), (min(values), max(values))
        out.append(cell)
    return out


def at_epsilon(rows, target: float) -> float:
    """Eval loss at ``target`` epsilon, log-linear between the runs (NaN outside them)."""
    eps = np.log([r["user_epsilon"] for r in rows])
    return float(np.interp(math.log(target), eps, [r["eval_loss"] for r in rows], left=np.nan, right=np.nan))


def epsilon_at_loss(rows, loss: float) -> float:
    """The epsilon at which the (decreasing) loss curve reaches ``loss`` (NaN if it never does)."""
    losses = [r["eval_loss"] for r in rows]
    if not min(losses) <= loss <= max(losses):
        return math.nan
    order = np.argsort(losses)
    eps = np.log([rows[i]["user_epsilon"] for i in order])
    return float(math.exp(np.interp(loss, np.asarray(losses)[order], eps)))


def plot(by_algorithm: dict, path: Path) -> None:
    """Eval loss (log scale: group privacy's small budgets diverge) and accuracy against the
    user-level epsilon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9.5, 3.6), dpi=120)
    labels = {
        "uls": "ULS (users sampled)",
        "els": "ELS (records, capped)",
        "group": "record-level, group privacy",
    }
    for name, rows in by_algorithm.items():
        eps = [r["user_epsilon"] for r in rows]
        for ax, key in zip(axes, ("eval_loss", "eval_accuracy"), strict=True):
            mean = np.array([r[key] for r in rows])
            spread = np.abs(np.array([r[f"{key}_range"] for r in rows]).T - mean)
            ax.errorbar(eps, mean, yerr=spread, fmt="o-", capsize=3, label=labels[name])
    for ax, what in zip(axes, ("eval loss (log scale)", "eval accuracy"), strict=True):
        ax.set_xscale("log")
        ax.set_xlabel("user-level epsilon (delta = 1e-5)")
        ax.set_ylabel(what)
    axes[0].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle("skewed-users-mlp-dp: 1,600 training users of 2 to 41 records, 300 steps", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(by_algorithm: dict) -> None:
    """The cells (mean over seeds, loss range), then each algorithm's figures at epsilon 8."""
    print(
        "| algorithm | epsilon asked | user-level epsilon | seeds | eval loss (min, max) | accuracy (min, max) |"
    )
    print("|---|---|---|---|---|---|")
    for name, rows in by_algorithm.items():
        for r in rows:
            (lo, hi), (alo, ahi) = r["eval_loss_range"], r["eval_accuracy_range"]
            print(
                f"| {name} | {r['epsilon']:g} | {r['user_epsilon']:.3g} | {r['seeds']} | {r['eval_loss']:.3f} "
                f"({lo:.3f}, {hi:.3f}) | {r['eval_accuracy']:.1%} ({alo:.1%}, {ahi:.1%}) |"
            )
    reference = at_epsilon(by_algorithm["uls"], 8.0) if "uls" in by_algorithm else math.nan
    print("\n| algorithm | eval loss at user-level epsilon 8 | epsilon at ULS's loss at 8 |")
    print("|---|---|---|")
    for name, rows in by_algorithm.items():
        print(f"| {name} | {at_epsilon(rows, 8.0):.4f} | {epsilon_at_loss(rows, reference):.3g} |")


def report(by_algorithm: dict, out: Path) -> None:
    """The plot and the tables of the runs' rows, by algorithm."""
    by_cell = {name: cells(rows) for name, rows in by_algorithm.items()}
    plot(by_cell, out / "users_table.png")
    table(by_cell)


def seed_list(text: str) -> list[int]:
    """``--seeds``: ints >= 0, comma-separated."""
    try:
        seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(
            f"--seeds takes ints >= 0, comma-separated (e.g. 0,1,2); got {text!r}"
        )
    return seeds


def run_row(algorithm: str, epsilon: float, seed: int, args, tmp: Path) -> dict:
    """Train one cell's run; its row: the eval figures and the user-level (epsilon, delta)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = train_recipe(
            recipe_for(algorithm, epsilon, args, seed),
            tmp / f"{algorithm}-{epsilon}-{seed}",
            show_progress=False,
        )
    g = HEAVIEST if algorithm == "group" else 1
    return {
        "algorithm": algorithm,
        "epsilon": epsilon,
        "seed": seed,
        "eval_loss": summary["eval_loss"],
        "eval_accuracy": summary["eval_accuracy"],
        "run_epsilon": summary["epsilon"],
        "run_delta": summary["delta"],
        "user_epsilon": g * summary["epsilon"],  # what the run's own (eps, delta) give a user
        "user_delta": g * math.exp((g - 1) * summary["epsilon"]) * summary["delta"],
        "privacy_unit": summary["privacy_unit"],
        "steps": args.steps,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", default="uls,els,group")
    p.add_argument("--epsilons", default="1,2,4,8,16")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--users-per-step", type=int, default=64)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument(
        "--seeds", type=seed_list, default="0", help="train.seed of each cell's runs, comma-separated"
    )
    p.add_argument("--out", default="benchmarks/dp/results/users")
    p.add_argument("--replot", action="store_true", help="only redraw the plot and table from OUT's JSONL")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    by_algorithm: dict[str, list[dict]] = {}
    if args.replot:
        for row in map(json.loads, (out / "users_table.jsonl").read_text().splitlines()):
            by_algorithm.setdefault(row["algorithm"], []).append(row)
        report(by_algorithm, out)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        runs = [
            (algorithm, epsilon, seed)
            for algorithm in args.algorithms.split(",")
            for epsilon in map(float, args.epsilons.split(","))
            for seed in args.seeds
        ]
        for algorithm, epsilon, seed in runs:
            row = run_row(algorithm, epsilon, seed, args, Path(tmp))
            print(json.dumps(row), flush=True)
            by_algorithm.setdefault(algorithm, []).append(row)
    with open(out / "users_table.jsonl", "w") as f:
        for rows in by_algorithm.values():
            for row in rows:
                f.write(json.dumps(row) + "\n")
    report(by_algorithm, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
