"""Clipping styles side by side (``zoo bench dp``'s rows, one process): the non-private step,
ghost clipping all-layer (``auto``: book-keeping here), by its second backward, and layer-wise
(each op of each layer its own group, its clipped sum formed in its tap in the one backward),
with step time and compiled temp memory as ratios to the non-private step, and layer-wise over
all-layer. Run from the repository root with the project venv::

    python benchmarks/dp/clip_styles.py
    python benchmarks/dp/clip_styles.py --workloads transformer-xs@32x64 --rounds 21
"""

from __future__ import annotations

import argparse
import json

ROWS = ("non-private", "ghost", "ghost backward", "ghost layer-wise")


def main(argv=None) -> None:
    from zoo.bench.common import ratio_spread
    from zoo.bench.dp import bench_dp

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workloads", default="transformer-xs@32x64,mlp-s@256", help="PRESET@BATCH[xSEQ], comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--remat", default="none")
    args = parser.parse_args(argv)
    table = []
    for spec in args.workloads.split(","):
        preset, _, size = spec.partition("@")
        batch, _, seq = size.partition("x")
        result = bench_dp(
            preset,
            batch=int(batch),
            seq=int(seq) if seq else None,
            methods=list(ROWS),
            memory_sweep=False,
            rounds=args.rounds,
            remat=args.remat,
        )
        rows = {r["method"]: r for r in result["rows"]}
        line = {"workload": spec, "remat": args.remat}
        for name in ROWS[1:]:
            line[name] = {
                "ran": rows[name]["ran"],
                "step_ms": rows[name]["step_ms"],
                "over_non_private": rows[name]["step_ratio"],
                "temp_ratio": rows[name]["temp_ratio"],
                "program": rows[name]["program"],
            }
        line["layer_wise_over_all_layer"] = ratio_spread(
            rows["ghost layer-wise"]["round_ms"], rows["ghost"]["round_ms"]
        ).rounded(3)
        line["non_private_ms"] = rows["non-private"]["step_ms"]
        print(json.dumps(line), flush=True)
        table.append(line)
    print(
        "| workload | non-private ms | ghost (ran) x | ghost backward x | layer-wise x | layer-wise / ghost | temp x (ghost, layer-wise) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for x in table:
        g, b, lw = x["ghost"], x["ghost backward"], x["ghost layer-wise"]
        spread = x["layer_wise_over_all_layer"]
        print(
            f"| `{x['workload']}` | {x['non_private_ms']:.1f} | {g['over_non_private']:.2f} ({g['ran']}) | "
            f"{b['over_non_private']:.2f} | {lw['over_non_private']:.2f} | "
            f"{spread['median']:.2f} ({spread['q1']:.2f}-{spread['q3']:.2f}) | {g['temp_ratio']:.2f}, {lw['temp_ratio']:.2f} |"
        )


if __name__ == "__main__":
    main()
