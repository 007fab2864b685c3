"""DP-SGD hyperparameters chosen on a validation split, then accuracy against epsilon on eval.

Two subcommands, both run from the repository root with the project venv:

``sweep``  trains every point of a hyperparameter grid at every epsilon and seed, and scores
    it on a VALIDATION split carved from the training data. The eval split is never read.
    The validation rows are drawn from the rows that are in the training split of *every*
    seed given, so no validation row is an eval row of any reported seed either::

        python benchmarks/dp/sweep.py sweep --recipe digits-mlp-dp \\
            --grid optim.lr=0.5,1,2 --grid dp.expected_batch_size=360,720

``final``  runs the shipped recipe unchanged through ``zoo.train.loop.train`` (exactly what
    ``zoo train RECIPE --set dp.epsilon=E --set train.seed=S`` runs) and reports EVAL accuracy,
    mean and standard deviation over seeds, for each epsilon. ``inf`` means the same recipe
    without DP (no clipping or noise, fixed batches of ``dp.expected_batch_size``)::

        python benchmarks/dp/sweep.py final --recipe digits-mlp-dp --epsilons inf,8,3,1 \\
            --plot docs/img/dp-accuracy.png

Both take ``--set SECTION.FIELD=VALUE`` (repeatable) to override the recipe first, e.g.
``--set model.init_from=/path/to/checkpoint`` for the fine-tuning recipe.

The sweep keeps the sampling rate q, the steps and everything else of the recipe: a grid
value of ``dp.expected_batch_size`` is given in recipe units (for the full training split)
and is scaled down to the smaller sweep training set so that q stays the same. The sweep
loop builds each seed's run with ``zoo train``'s stages (``zoo.train.stages``: model start, DP
plan, DP-PCA projection, engine) on the sweep's data, and steps it without checkpoints or
metric files; one compiled step serves all seeds.

The search itself is not privacy-accounted: picking hyperparameters on the private data
leaks something the reported epsilon does not cover (see docs/dp.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import jax
import numpy as np

from zoo import recipes
from zoo.commands import settings
from zoo.data import Dataset, load_dataset
from zoo.data.arrays import split_indices
from zoo.dp import PoissonSampler
from zoo.train import stages
from zoo.train.engine import evaluate
from zoo.train.loop import train_recipe
from zoo.train.state import train_key
from zoo.train.task import Task

VAL_SIZE = 300
VAL_SEED = 12345


def _say(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- data


def _all_rows(ds: Dataset, train_idx: np.ndarray, held_idx: np.ndarray):
    """Undo the train/eval split: features and labels in original row order."""
    n = len(train_idx) + len(held_idx)
    x = np.empty((n, ds.x_train.shape[1]), np.float32)
    y = np.empty((n,), np.int32)
    x[train_idx], y[train_idx] = ds.x_train, ds.y_train
    x[held_idx], y[held_idx] = ds.x_eval, ds.y_eval
    return x, y


def transform_inputs(x_fit: np.ndarray, kind: str):
    """An input map: ``unit`` (as loaded, [0, 1]), ``centered`` (2x - 1, data independent) or
    ``standardized`` (per-feature z-score with statistics of ``x_fit``: NOT private)."""
    if kind == "unit":
        return lambda x: x
    if kind == "centered":
        return lambda x: (2.0 * x - 1.0).astype(np.float32)
    if kind == "standardized":
        mean, std = x_fit.mean(0), x_fit.std(0)
        std = np.where(std > 1e-6, std, 1.0)
        return lambda x: ((x - mean) / std).astype(np.float32)
    raise SystemExit(f"unknown --inputs {kind!r}; valid: unit, centered, standardized")


def validation_tasks(
    recipe, seeds: list[int], inputs: str = "unit", val_size: int = VAL_SIZE
) -> dict[int, Task]:
    """Per seed, a Task whose 'eval' split is the validation rows, never an eval row of any seed.

    Each seed's training split (as ``load_task`` would build it) minus the validation rows is
    the sweep's training set; the validation rows are ``val_size`` rows drawn once from the
    rows every seed trains on.
    """
    data_cfg = recipe.data
    kind = recipe.model_config.task
    if kind != "classify":
        raise SystemExit("the sweep needs a classification recipe")
    splits, loaded = {}, {}
    for seed in seeds:
        ds = load_dataset(
            data_cfg.dataset,
            task=kind,
            seed=seed,
            eval_fraction=data_cfg.eval_fraction,
            classes=data_cfg.classes,
            label_column=data_cfg.label_column,
        )
        n = ds.num_train + ds.num_eval
        splits[seed] = split_indices(n, data_cfg.eval_fraction, seed, data_cfg.dataset)
        loaded[seed] = ds
    pool = set(range(n))
    for train_idx, _ in splits.values():
        pool &= set(train_idx.tolist())
    pool = np.array(sorted(pool))
    if len(pool) < 2 * val_size:
        raise SystemExit(
            f"only {len(pool)} rows are training rows of every seed; use fewer seeds "
            f"or a --val-size below {len(pool) // 2}"
        )
    val = np.sort(np.random.default_rng(VAL_SEED).choice(pool, val_size, replace=False))
    tasks = {}
    for seed in seeds:
        ds, (train_idx, held_idx) = loaded[seed], splits[seed]
        x, y = _all_rows(ds, train_idx, held_idx)
        fit = train_idx[~np.isin(train_idx, val)]
        f = transform_inputs(x[fit], inputs)
        sub = Dataset(
            name=f"{ds.name}[validation]",
            task="classify",
            x_train=f(x[fit]),
            y_train=y[fit],
            x_eval=f(x[val]),
            y_eval=y[val],
            num_classes=ds.num_classes,
            feature_shape=ds.feature_shape,
        )
        row_shape = tuple(ds.feature_shape) if data_cfg.layout == "rows" else None
        tasks[seed] = Task(data=sub, config=data_cfg, seq_len=None, row_shape=row_shape)
    return tasks


# ----------------------------------------------------------------------------- sweep runs


def _seed_run(recipe, task: Task, seed: int, engine=None):
    """``(model start, DP plan, engine)`` of ``recipe`` with ``train.seed = seed`` on the sweep's
    ``task``: ``zoo train``'s stages (:mod:`zoo.train.stages`), model start, DP plan (its sampler
    seeded from the seed's root key), DP-PCA projection and engine. ``engine``: one the seeds
    share (one compile for all; a step reads neither the params' seed nor the sampler)."""
    r = settings.with_values(recipe, {"train.seed": seed})
    source = stages.start_checkpoint(r)
    start = stages.model_start(r, task, source)
    root = jax.random.key_data(train_key(seed)) if r.dp.enabled else None  # pinned: not a release
    plan = stages.dp_plan(r, task, start, r.train.steps, root)
    start = stages.projection(start, task, plan, root)
    return start, plan, root, engine or stages.engine(r, start, plan, r.train.steps)


def _batch(task: Task, recipe, sampler: PoissonSampler | None, step: int) -> dict:
    """The batch ``zoo.train.run.train_batch`` draws, with this seed's sampler (the engine is
    shared by the seeds, so the sampler is not the engine's)."""
    if sampler is None:
        return task.train_batch(step, recipe.train.batch_size, recipe.train.seed)
    indices, mask, _ = sampler.batch_indices(step)
    return task.examples(indices, mask)


def sweep_point(recipe, tasks: dict[int, Task]) -> list[float]:
    """Validation accuracy per seed for one recipe (DP as configured), one compile for all seeds."""
    accs, engine = [], None
    for seed, task in tasks.items():
        start, plan, root, engine = _seed_run(recipe, task, seed, engine)
        key = None if root is None else jax.random.wrap_key_data(root)
        state, frozen = engine.init_state(start.params, seed, key)
        sampler = plan.sampler if plan else None
        for step in range(recipe.train.steps):
            state, metrics = engine.train_step(state, frozen, _batch(task, recipe, sampler, step))
        if not math.isfinite(float(metrics["loss"])):
            accs.append(0.0)
            continue
        rows = sampler.padded_batch_size if sampler else recipe.train.batch_size
        accs.append(evaluate(engine, state, frozen, task.eval_batches(rows, 1000))["eval_accuracy"])
    return accs


def _rescale_batch(values: dict, recipe_batch: int, n_full: int, n_sweep: int) -> dict:
    """Grid values with the expected batch (the grid's or the recipe's) scaled to the sweep's
    smaller training set, so that q = expected_batch_size / N is the recipe's."""
    out = dict(values)
    ebs = out.get("dp.expected_batch_size", recipe_batch)
    out["dp.expected_batch_size"] = max(1, round(ebs * n_sweep / n_full))
    return out


def _parse_grid(items: list[str]) -> dict[str, list]:
    grid = {}
    for item in items or []:
        key, sep, values = item.partition("=")
        if not sep:
            raise SystemExit(f"--grid expects section.field=v1,v2,...; got {item!r}")
        grid[key.strip()] = [settings.parse_value(v.strip()) for v in values.split(",")]
    return grid


def _parse_epsilons(text: str) -> list[float]:
    return [math.inf if e.strip() in ("inf", "∞") else float(e) for e in text.split(",")]


def _base(args):
    return settings.with_sets(recipes.load_recipe(args.recipe), args.set or [])


def run_sweep(args) -> dict:
    base = _base(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    epsilons = _parse_epsilons(args.epsilons)
    tasks = validation_tasks(base, seeds, args.inputs, args.val_size)
    n_sweep = next(iter(tasks.values())).num_train
    # The recipe's N, as `zoo train` loads it: the data stage (the DP loader under DP).
    n_full = stages.load_data(base, stages.start_checkpoint(base)).num_train
    grid = _parse_grid(args.grid)
    keys = list(grid)
    _say(
        f"sweep: {len(tasks)} seeds, train {n_sweep} (recipe trains on {n_full}), "
        f"validation {args.val_size}, inputs={args.inputs}"
    )
    rows = []
    for combo in itertools.product(*grid.values()) if keys else [()]:
        point = dict(zip(keys, combo, strict=True))
        row = {"point": point, "val_accuracy": {}, "val_std": {}}
        for eps in epsilons:
            values = _rescale_batch(point, base.dp.expected_batch_size, n_full, n_sweep)
            if math.isinf(eps):
                ebs = values.get("dp.expected_batch_size", base.dp.expected_batch_size)
                values.update(
                    {"dp.enabled": False, "train.batch_size": int(ebs), "train.microbatch_size": None}
                )
            else:
                values.update({"dp.epsilon": eps})
            tic = time.perf_counter()
            accs = sweep_point(settings.with_values(base, values), tasks)
            row["val_accuracy"][str(eps)] = statistics.mean(accs)
            row["val_std"][str(eps)] = statistics.pstdev(accs)
            _say(
                f"  {point} eps={eps}: val {statistics.mean(accs):.4f} {[round(a, 3) for a in accs]} "
                f"({time.perf_counter() - tic:.0f}s)"
            )
        row["mean_over_eps"] = statistics.mean(row["val_accuracy"].values())
        rows.append(row)
    rows.sort(key=lambda r: -r["mean_over_eps"])
    return {
        "recipe": args.recipe,
        "set": args.set or [],
        "seeds": seeds,
        "epsilons": [str(e) for e in epsilons],
        "inputs": args.inputs,
        "n_train_sweep": n_sweep,
        "n_validation": args.val_size,
        "rows": rows,
    }


def _print_sweep(result: dict) -> None:
    eps = result["epsilons"]
    print(
        f"\nvalidation accuracy, mean of seeds {result['seeds']} ({result['recipe']}, "
        f"inputs={result['inputs']})\n"
    )
    print("| " + " | ".join(["point", *[f"eps={e}" for e in eps], "mean"]) + " |")
    print("|" + "---|" * (len(eps) + 2))
    for r in result["rows"]:
        point = ", ".join(f"{k}={v}" for k, v in r["point"].items()) or "(recipe)"
        cells = [f"{r['val_accuracy'][e]:.3f}" for e in eps]
        print(f"| {point} | " + " | ".join(cells) + f" | {r['mean_over_eps']:.3f} |")


# ----------------------------------------------------------------------------- final table


def run_final(args) -> dict:
    base = _base(args)
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for eps in _parse_epsilons(args.epsilons):
            runs = []
            for seed in seeds:
                values = {"train.seed": seed}
                if math.isinf(eps):
                    values.update(
                        {
                            "dp.enabled": False,
                            "train.batch_size": base.dp.expected_batch_size,
                            "train.microbatch_size": None,
                        }
                    )
                else:
                    values["dp.epsilon"] = eps
                recipe = settings.with_values(base, values)
                tic = time.perf_counter()
                summary = train_recipe(recipe, Path(tmp) / f"{eps}-{seed}", show_progress=False)
                _say(
                    f"  eps={eps} seed={seed}: eval {summary['eval_accuracy']:.4f} "
                    f"spent {summary.get('epsilon')} ({time.perf_counter() - tic:.0f}s)"
                )
                runs.append(summary)
            accs = [s["eval_accuracy"] for s in runs]
            rows.append(
                {
                    "epsilon": str(eps),
                    "eval_accuracy": statistics.mean(accs),
                    "eval_std": statistics.pstdev(accs),
                    "per_seed": accs,
                    "epsilon_spent": max((s.get("epsilon") or 0.0) for s in runs)
                    if not math.isinf(eps)
                    else None,
                    "noise_multiplier": runs[0].get("noise_multiplier"),
                    "sampling_prob": runs[0].get("sampling_prob"),
                    "steps": runs[0]["steps"],
                }
            )
    result = {"recipe": args.recipe, "set": args.set or [], "seeds": seeds, "rows": rows}
    if args.plot:
        result["plot"] = plot(result, args.plot)
    return result


def _print_final(result: dict) -> None:
    print(f"\n{result['recipe']}: eval accuracy, mean ± std over seeds {result['seeds']}\n")
    print("| epsilon | eval accuracy | per seed | sigma | q | steps | epsilon spent |")
    print("|---|---|---|---|---|---|---|")
    for r in result["rows"]:
        sigma = f"{r['noise_multiplier']:.3f}" if r["noise_multiplier"] else "-"
        q = f"{r['sampling_prob']:.3f}" if r["sampling_prob"] else "-"
        spent = f"{r['epsilon_spent']:.4f}" if r["epsilon_spent"] is not None else "-"
        per = ", ".join(f"{a:.3f}" for a in r["per_seed"])
        print(
            f"| {r['epsilon']} | {r['eval_accuracy']:.3f} ± {r['eval_std']:.3f} | {per} | {sigma} | "
            f"{q} | {r['steps']} | {spent} |"
        )


def plot(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    finite = [r for r in result["rows"] if r["epsilon"] != "inf"]
    finite.sort(key=lambda r: float(r["epsilon"]))
    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=120)
    xs = [float(r["epsilon"]) for r in finite]
    ax.errorbar(
        xs,
        [r["eval_accuracy"] for r in finite],
        yerr=[r["eval_std"] for r in finite],
        marker="o",
        capsize=4,
        label=f"DP-SGD (mean \u00b1 std, {len(result['seeds'])} seeds)",
    )
    for r in finite:
        ax.annotate(
            f"{r['eval_accuracy']:.3f}",
            (float(r["epsilon"]), r["eval_accuracy"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=9,
        )
    for r in result["rows"]:
        if r["epsilon"] == "inf":
            ax.axhline(
                r["eval_accuracy"],
                color="gray",
                linestyle="--",
                label=f"no DP (eps = inf): {r['eval_accuracy']:.3f}",
            )
    ax.set_xscale("log")
    ax.set_xlim(min(xs) / 1.3, max(xs) * 1.6)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}" for x in xs])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("epsilon (delta = 1e-5)")
    ax.set_ylabel("eval accuracy")
    ax.set_title(f"{result['recipe']}: accuracy against privacy budget")
    ax.set_ylim(0, 1)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("sweep", help="grid on a validation split carved from the training data")
    p.add_argument("--recipe", default="digits-mlp-dp")
    p.add_argument("--epsilons", default="8,3,1")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--grid", action="append", metavar="SECTION.FIELD=V1,V2,...")
    p.add_argument("--val-size", type=int, default=VAL_SIZE, help="validation rows (default %(default)s)")
    p.add_argument(
        "--inputs",
        default="unit",
        choices=["unit", "centered", "standardized"],
        help="input map for the sweep only (the recipe always trains on the data as loaded)",
    )
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override the recipe")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    p = sub.add_parser("final", help="eval accuracy of the recipe at each epsilon, mean over seeds")
    p.add_argument("--recipe", default="digits-mlp-dp")
    p.add_argument("--epsilons", default="inf,8,3,1")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--plot", metavar="FILE.png")
    p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE", help="override the recipe")
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON")
    args = parser.parse_args(argv)
    if args.mode == "sweep":
        result = run_sweep(args)
        _print_sweep(result)
    else:
        result = run_final(args)
        _print_final(result)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
