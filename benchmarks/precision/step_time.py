"""Train-step time in bfloat16 against float32, side by side in one process.

For each workload the engine's step (the run stages' ``zoo.train.engine.make_engine``, AdamW; with ``dp`` a
ghost-clipped DP-SGD step) is compiled under each precision policy (``zoo.precision``); the
two steps then take turns in timed rounds (``zoo.bench.common.time_in_rounds``), and the
figure is the median over rounds of the per-round ratio bf16 / float32. On a CPU, XLA may
widen bf16 dots to float32 (the GPU row of ``benchmarks/device/device_check.py`` is the speed
figure)::

    .venv/bin/python benchmarks/precision/step_time.py --rounds 15
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import numpy as np
import optax

import zoo
from zoo.bench.common import median_ratio, state_stepper, time_in_rounds
from zoo.dp.plan import fixed_batch_plan
from zoo.precision import PRECISIONS, Precision
from zoo.train import stages
from zoo.train.engine import GradientSettings, make_engine

# name -> (preset, batch, seq, overrides, DP clipping or None)
WORKLOADS = {
    "transformer-s": ("transformer-s", 32, 64, {}, None),  # python-docs-lm's shape
    "llama-s": ("llama-s", 32, 64, {}, None),  # python-docs-llama's
    "cnn-mnist-dp": ("cnn-mnist", 512, None, {"activation": "tanh"}, "ghost"),  # mnist-cnn-dp's
}


def stepper(preset, batch, seq, overrides, clipping, precision):
    cfg = zoo.get_config(preset, **overrides)
    start = stages.config_start(cfg, seed=0)
    dp = fixed_batch_plan(batch, noise_multiplier=1.0, clip_norm=0.1, clipping=clipping) if clipping else None
    engine = make_engine(
        start, GradientSettings("nnx", optax.adamw(1e-3), precision=Precision(precision)), dp=dp
    )
    state, frozen = engine.init_state(start.params, 0, jax.random.key(0))
    x = zoo.example_batch(cfg, batch, seq_len=seq)
    data = {"x": x, "y": zoo.example_labels(cfg, x), "mask": np.ones((batch,), np.float32)}
    run = {"state": state, "out": None}
    return state_stepper(lambda s, f, b: engine.train_step(s, f, b), run, frozen, data)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps-per-round", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = []
    for name in args.workloads.split(","):
        steppers = {p: stepper(*WORKLOADS[name], p) for p in PRECISIONS}
        times = time_in_rounds(steppers, args.rounds, args.steps_per_round)
        rows.append(
            {
                "workload": name,
                "float32_ms": round(1e3 * statistics.median(times["float32"]), 2),
                "bfloat16_ms": round(1e3 * statistics.median(times["bfloat16"]), 2),
                "ratio": round(median_ratio(times["bfloat16"], times["float32"]), 3),
                "rounds": args.rounds,
                "device": jax.devices()[0].device_kind,
            }
        )
        print(json.dumps(rows[-1]) if args.json else rows[-1], flush=True)
    if not args.json:
        print("| workload | float32 ms | bfloat16 ms | bf16 / float32 (median of per-round ratios) |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['workload']} | {r['float32_ms']} | {r['bfloat16_ms']} | {r['ratio']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
