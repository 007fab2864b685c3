"""What ``--remat auto`` chooses at several budgets, from one table of measured policies.

Runs ``zoo bench remat`` once (every policy compiled and timed side by side, in rounds), then
for each budget, given as a fraction of ``none``'s compiled temp, marks the policies whose
temp plus arguments fit and picks the fastest of them, exactly as
``zoo train --remat auto --memory-budget`` and ``zoo bench remat --budget`` do::

    python benchmarks/remat_auto.py transformer-s --layers 12 --fractions 0.4,0.2,0.12
"""

from __future__ import annotations

import argparse
import json

from zoo.bench.remat import bench_remat
from zoo.remat import choose_under_budget, footprint


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="transformer-s")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--fractions", default="0.4,0.2,0.12")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = bench_remat(args.model, num_layers=args.layers, repeats=args.repeats)
    rows = result["rows"]
    none = next(r for r in rows if r["policy"] == "none")
    print(f"{'policy':<22}{'temp MiB':>10}{'args MiB':>10}{'fp/none temp':>14}{'step ms':>10}")
    for r in rows:
        print(
            f"{r['policy']:<22}{r['temp_bytes'] / 2**20:>10.1f}{r['argument_bytes'] / 2**20:>10.1f}"
            f"{footprint(r) / none['temp_bytes']:>14.3f}{r['step_ms']:>10.1f}"
        )
    choices = []
    for fraction in (float(f) for f in args.fractions.split(",")):
        budget = int(fraction * none["temp_bytes"])
        chosen, marked = choose_under_budget(rows, budget)
        fitting = [r["policy"] for r in marked if r["fits"]]
        choices.append({"fraction": fraction, "budget": budget, "chosen": chosen, "fitting": fitting})
        print(
            f"budget {fraction:.0%} of none's temp ({budget / 2**20:.1f} MiB): {chosen}; fitting: {fitting}"
        )
    print(json.dumps({"model": args.model, "layers": args.layers, "rows": rows, "choices": choices}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
