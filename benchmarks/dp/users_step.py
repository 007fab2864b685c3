"""User-level DP-SGD's step (ULS, ``dp.unit = "user"``) against record-level DP-SGD's at the
same number of records per step, side by side in one process.

Both runs are what ``zoo train`` builds (``zoo.train.run.build_run``) on one generated CSV of
users with a skewed number of records each (1 to 2k - 1; the record-level run reads the same
rows without the user column): ULS draws ``E`` users a step and
gives each ``[k]`` slots (``P * k`` rows, ``P`` the padded users), record-level DP draws
``E * k`` records a step (its own padded rows). Each step is the engine's
(``run.engine.train_step``) on that run's batch of step 0; the steps take turns in timed rounds
(``zoo.bench.common.time_in_rounds``) and the figure is the median of the per-round ratios
ULS / record-level (target: at most 1.2)::

    .venv/bin/python benchmarks/dp/users_step.py --rounds 15

``--same-rows`` instead gives the record-level run the expected batch whose padded batch has
(at least) ULS's ``P * k`` rows: the ratio is then the cost of clipping users rather than
records on the same rows, without the padding of fewer, larger units.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import jax
import numpy as np

from zoo import recipes
from zoo.bench.common import median_ratio, ratio_spread, state_stepper, time_in_rounds
from zoo.commands import settings
from zoo.dp.sampling import padded_size_for
from zoo.train.run import build_run, state_key, train_batch


def users_csv(folder: Path, users: int, k: int, features: int, seed: int = 0) -> tuple[Path, Path]:
    """Two CSVs of the same rows, ``f0..fF,label``, one with a ``user`` column first: user ``u``
    holds ``1 + u % (2k - 1)`` records (k on average)."""
    rng = np.random.default_rng(seed)
    header = ",".join([*(f"f{i}" for i in range(features)), "label"])
    rows = []
    for user in range(users):
        for _ in range(1 + user % (2 * k - 1)):
            x = rng.normal(size=features)
            rows.append((f"u{user}", ",".join([*(f"{v:.3f}" for v in x), str(int(x.sum() > 0))])))
    with_users, records = folder / "users.csv", folder / "records.csv"
    with_users.write_text("\n".join([f"user,{header}", *(f"{u},{r}" for u, r in rows)]) + "\n")
    records.write_text("\n".join([header, *(r for _, r in rows)]) + "\n")
    return with_users, records


def stepper(recipe):
    run = build_run(recipe)
    state, frozen = run.engine.init_state(run.params, recipe.train.seed, state_key(run))
    batch = run.engine.place_batch(train_batch(run, 0))
    holder = {"state": state, "out": None}
    step = state_stepper(lambda s, f, b: run.engine.train_step(s, f, b), holder, frozen, batch)
    return step, run.dp.sampler.padded_batch_size


def same_rows_batch(recipe, rows: int) -> int:
    """The smallest expected batch whose padded batch has at least ``rows`` rows, at the
    truncation bound of ``recipe``'s run (the bound moves little with the batch: the run is
    rebuilt at the answer and its own rows reported)."""
    plan = build_run(recipe).dp
    n, p = plan.sampler.num_examples, plan.accounting.truncation_prob
    lo, hi = 1, rows
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if padded_size_for(n, mid / n, p) < rows else (lo, mid)
    return lo


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=4000)
    p.add_argument("--users-per-step", type=int, default=64, help="E: expected users a ULS step draws")
    p.add_argument("--k", type=int, default=4, help="dp.records_per_user")
    p.add_argument("--features", type=int, default=32)
    p.add_argument("--clipping", default="vmap")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--steps-per-round", type=int, default=5)
    p.add_argument("--same-rows", action="store_true", help="record-level DP on as many padded rows as ULS")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        with_users, records = users_csv(Path(tmp), args.users, args.k, args.features)
        common = {
            "data.classes": [0, 1],
            "dp.clipping": args.clipping,
            "dp.epsilon": None,
            "dp.noise_multiplier": 1.0,
            "train.steps": 100,
        }
        base = recipes.load_recipe("digits-mlp-dp")
        uls = settings.with_values(
            base,
            {
                **common,
                "data.dataset": f"csv:{with_users}",
                "data.user_column": "user",
                "dp.unit": "user",
                "dp.records_per_user": args.k,
                "dp.expected_batch_size": args.users_per_step,
            },
        )
        # the same rows without their users: every row is a record
        record = settings.with_values(
            base,
            {
                **common,
                "data.dataset": f"csv:{records}",
                "dp.expected_batch_size": args.users_per_step * args.k,
            },
        )
        steppers, rows = {}, {}
        steppers["uls"], rows["uls"] = stepper(uls)
        if args.same_rows:
            record = settings.with_values(
                record, {"dp.expected_batch_size": same_rows_batch(record, rows["uls"])}
            )
        steppers["record"], rows["record"] = stepper(record)
        times = time_in_rounds(steppers, args.rounds, args.steps_per_round)
    spread = ratio_spread(times["uls"], times["record"])
    row = {
        "users": args.users,
        "users_per_step": args.users_per_step,
        "k": args.k,
        "clipping": args.clipping,
        "uls_rows": rows["uls"],
        "record_rows": rows["record"],
        "record_expected": record.dp.expected_batch_size,
        "uls_ms": round(1e3 * statistics.median(times["uls"]), 2),
        "record_ms": round(1e3 * statistics.median(times["record"]), 2),
        "ratio": round(median_ratio(times["uls"], times["record"]), 3),
        "ratio_quartiles": [round(spread.q1, 3), round(spread.q3, 3)],
        "rounds": args.rounds,
        "device": jax.devices()[0].device_kind,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
