"""What ``--remat auto`` chooses at several budgets, from one table of measured policies.

Runs ``zoo bench remat`` once (every policy compiled and timed side by side, in rounds), then
for each budget, given as a fraction of ``none``'s compiled temp, marks the policies whose
step fits (arguments + outputs - aliased + temp) and picks the fastest of them with the rule
``zoo train --remat auto --memory-budget`` and ``zoo bench remat --budget`` share
(``zoo.train.remat_search.pick``)::

    python benchmarks/remat/auto.py transformer-s --layers 12 --fractions 0.4,0.2,0.12
    python benchmarks/remat/auto.py transformer-s --layers 12 --attention chunked \
        --attention-chunk 32 --mlp-chunk 8

The budgets are fractions of the compiled temp of ``none`` on the model as configured by
default (dense attention, the MLP whole), so that a model with chunked attention or MLP is
offered the same budgets in bytes: with such overrides that baseline is compiled first (not
run), and the bench's own ``none`` row is the overridden model's.
"""

from __future__ import annotations

import argparse
import json

from zoo.api import example_batch, example_labels
from zoo.bench.common import memory_stats
from zoo.bench.remat import bench_remat
from zoo.bench.step import DEFAULT_SHAPES, compile_step
from zoo.configs import add_model_flags, model_flag_overrides
from zoo.models.registry import get_config
from zoo.remat import footprint
from zoo.train.remat_search import fits, pick


def default_none_temp(model: str, layers: int) -> int:
    """Compiled temp of ``none`` on the default config of ``model`` at the bench's shape."""
    cfg = get_config(model, num_layers=layers)
    x = example_batch(cfg, DEFAULT_SHAPES[model]["batch"], seed=0, seq_len=DEFAULT_SHAPES[model]["seq"])
    step = compile_step(cfg, x, example_labels(cfg, x), remat="none")  # zoo train's step
    return memory_stats(step.compiled)["temp_size_in_bytes"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="transformer-s")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--fractions", default="0.4,0.2,0.12")
    parser.add_argument("--repeats", type=int, default=5)
    add_model_flags(parser)
    parser.add_argument("--attention-chunk", type=int, default=None, help="override attention_chunk")
    args = parser.parse_args(argv)
    overrides = model_flag_overrides(args)
    if args.attention_chunk is not None:
        overrides["attention_chunk"] = args.attention_chunk
    result = bench_remat(args.model, num_layers=args.layers, repeats=args.repeats, overrides=overrides)
    rows = result["rows"]
    none = next(r for r in rows if r["policy"] == "none")["temp_bytes"]
    base = default_none_temp(args.model, args.layers) if overrides else none
    print(
        f"model overrides: {overrides or 'none'}; none's temp {none / 2**20:.1f} MiB, default model's {base / 2**20:.1f}"
    )
    print(f"{'policy':<22}{'temp MiB':>10}{'args MiB':>10}{'fp/base':>10}{'step ms':>10}")
    for r in rows:
        print(
            f"{r['policy']:<22}{r['temp_bytes'] / 2**20:>10.1f}{r['argument_bytes'] / 2**20:>10.1f}"
            f"{footprint(r) / base:>10.3f}{r['step_ms']:>10.1f}"
        )
    choices = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        budget = int(fraction * base)
        marked = [{**r, "fits": fits(r, budget)} for r in rows]
        best = pick(marked)  # zoo train --remat auto's rule, on this table
        chosen, fitting = best and best["policy"], [r["policy"] for r in marked if r["fits"]]
        choices.append({"fraction": fraction, "budget": budget, "chosen": chosen, "fitting": fitting})
        print(
            f"budget {fraction:.0%} of the default model's none temp ({budget / 2**20:.1f} MiB): "
            f"{chosen}; fitting: {fitting}"
        )
    print(
        json.dumps(
            {
                "model": args.model,
                "layers": args.layers,
                "overrides": overrides,
                "base_none_temp": base,
                "rows": rows,
                "choices": choices,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
