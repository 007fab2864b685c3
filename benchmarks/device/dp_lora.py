"""DP-LoRA of the ``llama-1b`` shape at a logical batch of 1,024 sequences of 1,024 tokens (issue
59, item 4): ``zoo bench dp``'s non-private and ghost rows on a LoRA start (the
``llama-1b-tokens-dp-lora`` recipe's adapters: rank 16 on q, v and the MLP; the base frozen and
held in bf16), each taking the batch ``--microbatch`` sequences at a time under one scan, the
noise added once.

    python benchmarks/device/dp_lora.py --preset llama-1b --seq 1024 --batch 1024 --microbatch 8
    python benchmarks/device/dp_lora.py --small --batch 16 --microbatch 4     # a CPU: tiny, quick

One JSON object: ``zoo bench dp``'s (its rows' ms/step, ratios and compiled temp bytes), with
tokens/s and MFU per row (``devicekit.step_mfu``: the model's FLOPs, the same count for every
row, so a DP row's extra work lowers its MFU) and the chip's ``memory_stats()`` peak after the
rows ran.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
from devicekit import config, host_params, step_mfu  # noqa: E402

from zoo import recipes  # noqa: E402
from zoo.bench.dp import bench_dp  # noqa: E402
from zoo.bench.step import bench_start  # noqa: E402
from zoo.precision import Precision  # noqa: E402

RECIPE = "llama-1b-tokens-dp-lora"  # whose [lora] section the start takes


def lora_start(cfg, precision: str):
    """The recipe's LoRA start on ``cfg``: fresh base params (drawn on the chip, kept on the
    host), the adapters, and the frozen base held in ``precision``, all then on the chip."""
    lora = recipes.load_recipe(RECIPE).lora
    recipe = recipes.override(recipes.parse_recipe({}, "dp-lora"), {"lora": {
        "rank": lora.rank, "alpha": lora.alpha, "targets": list(lora.targets)}})  # fmt: skip
    start = bench_start(cfg, recipe, host_params(cfg))
    trainable, frozen = start.freeze.split(start.params)
    held = Precision(precision).held(frozen)  # cast on the host: the float32 base never goes up
    params = jax.device_put(start.freeze.merge(trainable, held), jax.devices()[0])
    return start.with_params(params)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--remat", default="full")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--methods", default="ghost")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--small", action="store_true", help="the kind's small config (a CPU)")
    args = parser.parse_args(argv)
    cfg = config(args.preset, args.small)
    seq = cfg.max_len if args.small else args.seq
    start = lora_start(cfg, args.precision)
    result = bench_dp(
        start,
        batch=args.batch,
        seq=seq,
        microbatch=args.microbatch,
        memory_sweep=False,
        methods=[m.strip() for m in args.methods.split(",")],
        rounds=args.rounds,
        steps_per_round=args.steps,
        precision=args.precision,
        remat=args.remat,
        progress=lambda m: print(m, file=sys.stderr, flush=True),
    )
    for row in result["rows"]:
        row["tokens_per_s"] = round(args.batch * seq / (row["step_ms"] / 1e3), 1)
        row["mfu"] = step_mfu(start.cfg, args.batch, seq, row["step_ms"] / 1e3, args.precision, start.freeze)
    stats = jax.devices()[0].memory_stats() or {}
    result["peak_bytes_in_use"] = stats.get("peak_bytes_in_use")
    result["device_kind"] = jax.devices()[0].device_kind
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
