"""What accounting for truncation costs (docs/dp.md, "Fixed shapes").

A Poisson batch is padded to a fixed size P; a draw larger than P is truncated. Before, P was the
smallest size with a truncation probability of at most 1e-9 per step, and the event was left out
of the reported delta. Now P is sized so that truncation adds at most delta/1000 over the run
(for the larger of two neighbours, N + 1 examples), and the reported delta includes what it adds
(``zoo.dp.accounting.guaranteed_privacy``).

Prints, for every DP recipe at epsilon 1, 3 and 8: N, q, T, the padded rows before and after, and
the delta each guarantees (before: the recipe's delta plus the unreported truncation term; after:
what the summary reports). Then the step time of ``--time-recipes`` at epsilon 8 with the two
paddings, side by side in one process (``zoo.bench.common.time_in_rounds``): interleaved rounds,
medians, the median of per-round ratios after/before.

    .venv/bin/python benchmarks/dp/truncation.py [--rounds 30] [--calls 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax

from zoo import recipes
from zoo.bench.common import call_stepper, median_ratio, time_in_rounds
from zoo.commands import settings
from zoo.dp import accounting
from zoo.dp.sampling import PoissonSampler
from zoo.train import stages
from zoo.train.run import build_run

DP_RECIPES = (
    "digits-mlp-dp",
    "digits-transformer-dp",
    "python-docs-lm-dp",
    "digits-mlp-dp-finetune",
    "digits-transformer-dp-lora",
)
EPSILONS = (1.0, 3.0, 8.0)
OLD_TRUNCATION = 1e-9


def plans(name: str, epsilon: float) -> dict:
    recipe = recipes.load_recipe(name)
    dp, steps = recipe.dp, recipe.train.steps
    multiple = recipe.train.microbatch_size or 1
    at_eps = settings.with_values(recipe, {"dp.epsilon": epsilon, "dp.noise_multiplier": None})
    # N from the data stage of `zoo train`. Before: loaded as then, without the DP loader (which
    # splits before it drops the rows outside data.classes) and, for a DP LM, with the
    # vocabulary fitted on its own text (data.vocabulary unset), which a DP run now refuses.
    fitted = settings.with_values(
        recipe, {"data.vocabulary": None, "dp.enabled": False, "train.microbatch_size": None}
    )
    n_before = stages.load_data(fitted).num_train
    task = stages.load_data(at_eps)
    n_after = task.num_train
    row = {"recipe": name, "epsilon": epsilon, "steps": steps}
    for when, n in (("before", n_before), ("after", n_after)):
        q = dp.expected_batch_size / n
        if when == "before":
            sigma = accounting.calibrate_noise_multiplier(
                epsilon=epsilon, delta=dp.delta, sampling_prob=q, steps=steps, accountant=dp.accountant
            )
            sampler = PoissonSampler.for_expected_batch(
                n, dp.expected_batch_size, 0, OLD_TRUNCATION, pad_to_multiple=multiple
            )
        else:  # the plan `zoo train` makes (its DP plan stage), on one device
            start = stages.config_start(at_eps.model_config)  # the plan reads its layout alone
            plan = stages.dp_plan(at_eps, task, start, steps, stages.root_key(at_eps))
            sigma, sampler = plan.noise_multiplier, plan.sampler
        got = accounting.guaranteed_privacy(
            sampler, noise_multiplier=sigma, delta=dp.delta, steps=steps, accountant=dp.accountant
        )
        row |= {f"n_{when}": n, f"q_{when}": q, f"P_{when}": sampler.padded_batch_size}
        row |= {f"delta_{when}": got["delta"], f"eps_{when}": got["epsilon"]}
    return row


def step_times(name: str, rounds: int, calls: int, padded: dict[str, int]) -> dict[str, float]:
    """Median seconds per DP step at each padded size, interleaved in one process."""
    recipe = settings.with_values(recipes.load_recipe(name), {"dp.epsilon": None, "dp.noise_multiplier": 1.0})
    run = build_run(recipe)
    engine = run.engine
    state, frozen = engine.init_state(run.params, 0)
    step = jax.jit(engine.train_step_fn)
    steppers = {}
    for label, size in padded.items():
        sampler = dataclasses.replace(run.dp.sampler, padded_batch_size=size)
        indices, mask, _ = sampler.batch_indices(0)
        steppers[label] = call_stepper(step, state, frozen, run.task.examples(indices, mask))
    times = time_in_rounds(steppers, rounds, calls)
    return {
        **{k: statistics.median(v) for k, v in times.items()},
        "ratio": median_ratio(times["after"], times["before"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--recipes", default=",".join(DP_RECIPES))
    parser.add_argument("--time-recipes", default="digits-mlp-dp,digits-transformer-dp")
    args = parser.parse_args()
    print("| recipe (T) | eps | N | q | P before | P after | delta before | delta after |")
    print("|---|---|---|---|---|---|---|---|")
    rows = {}
    for name in args.recipes.split(","):
        for eps in EPSILONS:
            r = plans(name, eps)
            rows[(name, eps)] = r
            n = r["n_after"] if r["n_after"] == r["n_before"] else f"{r['n_before']} / {r['n_after']}"
            print(
                f"| {name} ({r['steps']}) | {eps:g} | {n} | {r['q_after']:.3f} | {r['P_before']} | "
                f"{r['P_after']} | {r['delta_before']:.3g} | {r['delta_after']:.6g} |"
            )
    print()
    print("| recipe at eps 8 | P before | P after | step before | step after | after / before |")
    print("|---|---|---|---|---|---|")
    for name in filter(None, args.time_recipes.split(",")):
        r = rows.get((name, 8.0)) or plans(name, 8.0)
        t = step_times(name, args.rounds, args.calls, {"before": r["P_before"], "after": r["P_after"]})
        print(
            f"| {name} | {r['P_before']} | {r['P_after']} | {1e3 * t['before']:.2f} ms | "
            f"{1e3 * t['after']:.2f} ms | {t['ratio']:.3f} |"
        )


if __name__ == "__main__":
    main()
