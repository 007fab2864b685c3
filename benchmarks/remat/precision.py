"""Compiled temp memory of the train step in bfloat16 against float32, per remat policy.

The step ``zoo train --remat POLICY --precision P`` runs, as ``zoo bench remat`` builds it
(``zoo.bench.step.compile_step``: the run's stages, the recipe's optimizer), compiled
(not run) under each precision policy (``zoo.precision``), in one process: XLA's
``memory_analysis()`` temp bytes, and the activation bytes the residual inspector says the
policy keeps on device and on host. Ratios are bfloat16 over float32::

    .venv/bin/python benchmarks/remat/precision.py transformer-s --layers 12
    .venv/bin/python benchmarks/remat/precision.py transformer-s --layers 12 --json
"""

from __future__ import annotations

import argparse
import json

from zoo.api import example_batch, example_labels
from zoo.bench.common import memory_stats
from zoo.bench.step import bench_shape, compile_step
from zoo.configs import add_model_flags, model_flag_overrides
from zoo.models.registry import get_config
from zoo.precision import PRECISIONS
from zoo.residuals import residual_report

POLICIES = "none,full,minimal,offload-layer-input,offload-minimal"


def compiled_row(cfg, policy: str, precision: str, batch: int, seq: int | None) -> dict:
    """Temp and argument bytes of one compiled step, and the residual inspector's totals."""
    x = example_batch(cfg, batch, seed=0, seq_len=seq)
    step = compile_step(cfg, x, example_labels(cfg, x), remat=policy, precision=precision)
    stats = memory_stats(step.compiled)
    report = residual_report(cfg, policy, batch=batch, seq=seq, precision=precision)
    return {
        "temp_bytes": stats["temp_size_in_bytes"],
        "argument_bytes": stats["argument_size_in_bytes"],
        "residual_device_bytes": report["total_device_bytes"],
        "residual_host_bytes": report["total_host_bytes"],
    }


def measure(model: str, layers: int, policies: list[str], overrides: dict, batch=None, seq=None) -> dict:
    cfg = get_config(model, num_layers=layers, **overrides)
    batch, seq = bench_shape(model, cfg, batch, seq)
    rows = []
    for policy in policies:
        by = {p: compiled_row(cfg, policy, p, batch, seq) for p in PRECISIONS}
        f32, bf16 = by["float32"], by["bfloat16"]

        def ratio(key, a=bf16, b=f32):
            return round(a[key] / b[key], 4) if b[key] else None

        rows.append(
            {
                "policy": policy,
                "temp_float32": f32["temp_bytes"],
                "temp_bfloat16": bf16["temp_bytes"],
                "temp_ratio": ratio("temp_bytes"),
                "residual_device_ratio": ratio("residual_device_bytes"),
                "residual_host_ratio": ratio("residual_host_bytes"),
                "argument_ratio": ratio("argument_bytes"),
                "float32": f32,
                "bfloat16": bf16,
            }
        )
    return {
        "model": model,
        "layers": layers,
        "batch": batch,
        "seq": seq,
        "overrides": overrides,
        "rows": rows,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="transformer-s")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--batch", type=int, default=None)
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    add_model_flags(parser)
    args = parser.parse_args(argv)
    result = measure(
        args.model,
        args.layers,
        [p.strip() for p in args.policies.split(",") if p.strip()],
        model_flag_overrides(args),
        args.batch,
        args.seq,
    )
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{result['model']} L={result['layers']}, batch {result['batch']} x {result['seq']} (compile only)")
    print(
        "| policy | temp f32 MiB | temp bf16 MiB | temp bf16/f32 | residuals device bf16/f32 | host bf16/f32 |"
    )
    print("|---|---|---|---|---|---|")
    for r in result["rows"]:
        print(
            f"| {r['policy']} | {r['temp_float32'] / 2**20:.1f} | {r['temp_bfloat16'] / 2**20:.1f} | "
            f"{r['temp_ratio']} | {r['residual_device_ratio']} | {r['residual_host_ratio']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
