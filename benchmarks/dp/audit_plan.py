"""The sampler settings of ``zoo train`` and ``zoo audit`` on a mesh, side by side (docs/dp-audit.md):
what the audit certifies is the pipeline training runs.

Builds both with the public API (``zoo.train.run.build_run``, ``zoo.audit.run.plan_audit``) for
a DP recipe on ``--mesh`` (default ``data=2``, on as many simulated CPU devices) and prints the
expected batch, q, the records the sampler draws, the padded batch, whether it splits over the
mesh's batch axes, the per-step truncation probability of the padding and the pad multiple.
The audit's q and padded batch differ from training's by its canaries alone: they are extra
records (q = E / (N + M/2)), and black-box canaries are extra rows of the padded batch.

    .venv/bin/python benchmarks/dp/audit_plan.py [--recipe digits-mlp-dp] [--mesh data=2] [--canaries 1000]
"""

from __future__ import annotations

import argparse
import os
import sys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--recipe", default="digits-mlp-dp")
    parser.add_argument("--mesh", default="data=2")
    parser.add_argument("--canaries", type=int, default=1000)
    args = parser.parse_args()
    sizes = dict(item.split("=") for item in args.mesh.split(","))
    devices = 1
    for value in sizes.values():
        devices *= int(value)
    if "jax" not in sys.modules:  # as many CPU devices as the mesh has
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"

    from scipy import stats

    from zoo import recipes
    from zoo.audit.run import plan_audit
    from zoo.commands import settings
    from zoo.train.run import build_run

    recipe = settings.with_values(
        recipes.load_recipe(args.recipe), {f"mesh.{axis}": int(v) for axis, v in sizes.items()}
    )
    run = build_run(recipe, choose_remat=False)
    ways = run.engine.layout.spec.batch_ways
    columns = {"zoo train": (run.dp, run.dp.sampler, run.task.num_train)}
    for mode in ("whitebox", "blackbox"):
        plan = plan_audit(recipe, args.canaries, mode)
        rows = plan.num_real + (args.canaries if mode == "blackbox" else 0)
        columns[f"zoo audit {mode}"] = (plan.engine.dp, plan.sampler, rows)
    table = {}
    for name, (dp, s, rows) in columns.items():
        table[name] = {
            "expected batch": f"{dp.expected_batch_size:g}",
            "q": f"{s.sampling_prob:.6f}",
            "records drawn by the sampler": s.num_examples,
            "padded batch": s.padded_batch_size,
            f"padded batch mod {ways} (the mesh's batch ways)": s.padded_batch_size % ways,
            "truncation per step": f"{stats.binom.sf(s.padded_batch_size, rows + 1, s.sampling_prob):.2g}",
            "pad multiple": dp.performance.pad_multiple,
        }
    print(f"{args.recipe} on mesh {args.mesh}, {args.canaries} canaries")
    print("| setting | " + " | ".join(table) + " |")
    print("|---" * (len(table) + 1) + "|")
    for key in next(iter(table.values())):
        print(f"| {key} | " + " | ".join(str(col[key]) for col in table.values()) + " |")


if __name__ == "__main__":
    main()
