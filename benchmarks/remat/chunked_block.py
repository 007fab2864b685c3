"""How far chunking takes a block's backward pass: compiled temp against `none` with dense attention.

    .venv/bin/python benchmarks/remat/chunked_block.py [--model transformer-s] [--layers 4]
        [--batch 16] [--seq 128] [--policies full,full-lean] [--attention-chunks 16,64]
        [--mlp-chunks 0,16,32] [--backend nnx]

Compiled temp bytes come from XLA's memory_analysis of the step `zoo train --remat POLICY` runs,
as `zoo bench remat` builds it (`zoo.bench.step.compile_step`: the run's stages, the recipe's optimizer);
with `--repeats N` every row's step is also run and timed, in N interleaved rounds (median ms
and the median per-round ratio to the baseline). The baseline is the model as configured by default -- dense attention, the MLP over the whole
sequence -- under `none`; every other row is a policy with dense or chunked attention
(`attention_chunk`) and the MLP whole or over chunks of tokens (`mlp_chunk`), side by side in
one process. Prints one JSON line per row and a table of temp bytes as a fraction of the
baseline.
"""

from __future__ import annotations

import argparse
import json
import statistics

from zoo.api import example_batch, example_labels
from zoo.bench.common import median_ratio, memory_stats, time_in_rounds
from zoo.bench.step import compile_step
from zoo.models import canonical
from zoo.models.registry import get_config


def temp_and_stepper(cfg, policy: str, backend: str, x, y, run: bool):
    """``(temp bytes, stepper or None)`` of the train step of ``cfg`` under ``policy``."""
    params = canonical.init_params(cfg, 0) if run else None  # None: compiled from shapes alone
    step = compile_step(cfg, x, y, backend=backend, remat=policy, params=params)
    temp = memory_stats(step.compiled)["temp_size_in_bytes"]
    return temp, step.stepper({"state": step.state, "out": None}) if run else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer-s")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--policies", default="full,full-lean")
    parser.add_argument("--attention-chunks", default="16,64", help="chunked attention's key chunks")
    parser.add_argument("--mlp-chunks", default="0,16,32", help="tokens per MLP chunk (0: whole sequence)")
    parser.add_argument("--backend", default="nnx", choices=["nnx", "eqx"])
    parser.add_argument("--repeats", type=int, default=0, help="timed rounds (0: compile only)")
    args = parser.parse_args()
    base_cfg = get_config(args.model, num_layers=args.layers)
    x = example_batch(base_cfg, args.batch, seed=0, seq_len=args.seq)
    y = example_labels(base_cfg, x)
    run = args.repeats > 0
    base, stepper = temp_and_stepper(base_cfg, "none", args.backend, x, y, run)
    rows = [{"policy": "none", "attention": "dense", "mlp_chunk": 0, "temp_bytes": base, "of_none": 1.0}]
    steppers = [stepper]
    attentions = [("dense", None)] + [("chunked", int(c)) for c in args.attention_chunks.split(",")]
    for policy in args.policies.split(","):
        for attention, chunk in attentions:
            for mlp_chunk in (int(c) for c in args.mlp_chunks.split(",")):
                over = {"attention": attention, "mlp_chunk": mlp_chunk}
                if chunk:
                    over["attention_chunk"] = chunk
                cfg = get_config(args.model, num_layers=args.layers, **over)
                t, stepper = temp_and_stepper(cfg, policy, args.backend, x, y, run)
                steppers.append(stepper)
                rows.append({"policy": policy, **over, "temp_bytes": t, "of_none": round(t / base, 4)})
                print(json.dumps({**vars(args), **rows[-1]}), flush=True)
    if run:
        times = time_in_rounds(dict(enumerate(steppers)), args.repeats)
        for i, row in enumerate(rows):
            row["step_ms"] = round(1e3 * statistics.median(times[i]), 1)
            row["step_ratio"] = round(median_ratio(times[i], times[0]), 3)
            print(json.dumps({**vars(args), **row}), flush=True)
    print(
        f"\n{args.model}, L={args.layers}, B={args.batch}, T={args.seq} ({args.backend}): "
        f"`none` with dense attention and a whole MLP = {base / 2**20:.1f} MiB"
    )
    timed = " step ms | step / none |" if run else ""
    print("| policy | attention | mlp_chunk | temp MiB | of none |" + timed)
    print("|---|---|---|---|---|" + ("---|---|" if run else ""))
    for row in rows:
        attention = row["attention"] + (f" ({row['attention_chunk']})" if row.get("attention_chunk") else "")
        print(
            f"| {row['policy']} | {attention} | {row['mlp_chunk'] or '-'} | "
            f"{row['temp_bytes'] / 2**20:.1f} | {row['of_none']:.3f} |"
            + (f" {row['step_ms']:.0f} | {row['step_ratio']:.2f} |" if run else "")
        )


if __name__ == "__main__":
    main()
