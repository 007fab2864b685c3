"""What DP-SGD costs on the MNIST recipes, side by side in one process (``zoo.bench.dp``).

The non-private, ghost, vmap and ``jax_privacy.clipped_grad`` steps of each DP recipe at its
expected batch size and of ``mlp-s`` at B=256, with the ratios (median and quartiles over rounds
of the per-round ratio), a Markdown table at the end; and the norm form ghost clipping takes per
conv layer. Run from the repository root with the project venv::

    python benchmarks/dp/mnist_cost.py
    python benchmarks/dp/mnist_cost.py --recipes mnist-cnn-dp --presets "" --rounds 41
"""

from __future__ import annotations

import argparse
import json

COST_METHODS = {  # the cost table's columns: bench row -> column
    "non-private": "non_private",
    "ghost": "ghost",
    "zoo vmap": "vmap",
    "jax_privacy clipped_grad": "jax_privacy",
}


def _ratio(rows, top: str, bottom: str) -> dict:
    """Median and quartiles over rounds of ``top``'s step time over ``bottom``'s (same round)."""
    from zoo.bench.common import ratio_spread

    return ratio_spread(rows[top]["round_ms"], rows[bottom]["round_ms"]).rounded(3)


def _cost_workloads(args):
    """``(name, model, its config, batch)``: each DP recipe's model start from ``zoo train``'s
    first two stages (fitted to its data, with its DP-PCA projection frozen when it has one) at
    its expected batch, then each ``PRESET@B``."""
    from zoo import recipes
    from zoo.models.registry import get_config
    from zoo.train import stages

    for name in filter(None, args.recipes.split(",")):
        recipe = recipes.load_recipe(name)
        start = stages.model_start(recipe, stages.load_data(recipe))
        yield name, start, start.cfg, recipe.dp.expected_batch_size
    for spec in filter(None, args.presets.split(",")):
        preset, _, batch = spec.partition("@")
        yield preset, preset, get_config(preset), int(batch)


def cmd_cost(args) -> None:
    import jax

    from zoo.bench.dp import bench_dp
    from zoo.dp import ghost

    table = []
    for name, model, cfg, batch in _cost_workloads(args):
        result = bench_dp(
            model,
            batch=batch,
            methods=list(COST_METHODS),
            memory_sweep=False,
            rounds=args.rounds,
            steps_per_round=args.steps_per_round,
        )
        rows = {r["method"]: r for r in result["rows"]}
        line = {
            "workload": name,
            "batch": batch,
            "rounds": args.rounds,
            "steps_per_round": args.steps_per_round,
        }
        line.update({f"{col}_ms": rows[method]["step_ms"] for method, col in COST_METHODS.items()})
        line["ghost_over_non_private"] = _ratio(rows, "ghost", "non-private")
        line["vmap_over_non_private"] = _ratio(rows, "zoo vmap", "non-private")
        line["jax_privacy_over_non_private"] = _ratio(rows, "jax_privacy clipped_grad", "non-private")
        line["jax_privacy_over_ghost"] = _ratio(rows, "jax_privacy clipped_grad", "ghost")
        line["ghost_temp_ratio"] = rows["ghost"]["temp_ratio"]
        line["conv_norm_forms"] = ghost.layer_methods(
            cfg, jax.ShapeDtypeStruct(cfg.input_spec(batch).shape, "float32")
        )
        print(json.dumps(line), flush=True)
        table.append(line)
    print(cost_table(table))


def cost_table(lines) -> str:
    """The cost table in Markdown: step times, then ratios as median (quartiles) over rounds."""

    def r(x):
        return f"{x['median']:.2f} ({x['q1']:.2f}-{x['q3']:.2f})"

    out = [
        "| workload | B | non-private ms | ghost ms | vmap ms | jax_privacy ms | ghost / non-private "
        "| vmap / non-private | jax_privacy / non-private | jax_privacy / ghost |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for x in lines:
        out.append(
            f"| `{x['workload']}` | {x['batch']} | {x['non_private_ms']:.1f} | {x['ghost_ms']:.1f} | "
            f"{x['vmap_ms']:.1f} | {x['jax_privacy_ms']:.1f} | {r(x['ghost_over_non_private'])} | "
            f"{r(x['vmap_over_non_private'])} | {r(x['jax_privacy_over_non_private'])} | "
            f"{r(x['jax_privacy_over_ghost'])} |"
        )
    return "\n".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipes", default="mnist-cnn-dp,mnist-mlp-dp", help="DP recipes, at their batch")
    parser.add_argument("--presets", default="mlp-s@256", help="PRESET@BATCH workloads after the recipes")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--steps-per-round", type=int, default=2)
    cmd_cost(parser.parse_args(argv))


if __name__ == "__main__":
    main()
