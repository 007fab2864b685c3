"""Ghost clipping on a tied GPT-2-like config (attention biases, LM head tied to the token
table): one DP step per method, side by side in one process (``zoo.bench.dp.bench_dp``:
interleaved rounds, medians, ratios to the non-private step).

    .venv/bin/python benchmarks/dp/ghost_tied.py [--batch 16] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json

import zoo
from zoo.bench.common import median_ratio
from zoo.bench.dp import bench_dp


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    cfg = zoo.get_config(
        "transformer-s", vocab_size=256, d_model=64, num_heads=4, d_ff=256, num_layers=2, max_len=64,
        attn_bias=True, tie_head=True,
    )  # fmt: skip
    methods = ["non-private", "zoo vmap", "jax_privacy clipped_grad", "ghost"]
    result = bench_dp(cfg, batch=args.batch, methods=methods, memory_sweep=False, rounds=args.rounds)
    rows = {r["method"]: r for r in result["rows"]}
    print(f"{'method':<26} {'step ms':>9} {'/ non-private':>14} {'temp MiB':>9}")
    for label, r in rows.items():
        print(f"{label:<26} {r['step_ms']:>9.2f} {r['step_ratio']:>14.2f} {r['temp_bytes'] / 2**20:>9.1f}")
    jp, ghost = rows["jax_privacy clipped_grad"], rows["ghost"]
    print(
        f"jax_privacy / ghost (median of per-round ratios): {median_ratio(jp['round_ms'], ghost['round_ms']):.2f}"
    )
    print(json.dumps({"batch": result["batch"], "seq": result["seq"], "device": result["device"]}))


if __name__ == "__main__":
    main()
