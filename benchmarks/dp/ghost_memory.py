"""The ghost step's temp memory over the non-private step's, compiled (not run) on this machine.

Compiles the ``non-private`` and ``ghost`` rows of ``zoo bench dp`` (the same programs: the
engine's steps under the bench's SGD with momentum, :mod:`zoo.bench.dp_rows`) for GPT-2-shaped
models and prints XLA's ``temp_size_in_bytes`` of each and their ratio. Nothing is run, so a
CPU gives the figures of a chip's shapes (its own buffer assignment, and dense attention where a
TPU runs a kernel: the ratios, not the bytes, are what carry over).

    .venv/bin/python benchmarks/dp/ghost_memory.py                      # the small GPT-2 shapes
    .venv/bin/python benchmarks/dp/ghost_memory.py --gpt2               # + gpt2-124m at T 256, 1024
    .venv/bin/python benchmarks/dp/ghost_memory.py --forms tpu          # the norm forms a TPU's formula takes
    PYTHONPATH=OTHER_CHECKOUT .venv/bin/python benchmarks/dp/ghost_memory.py   # another zoo's

``--forms tpu`` makes this machine's formula weigh bytes as a TPU v5e does
(``zoo.dp.ghost.forms.BALANCE``), so the ghost row takes the forms the chip's would: the Gram form
at GPT-2's T 256, the materialised one at T 1024. A CPU's own formula counts multiply-adds alone.
"""

from __future__ import annotations

import argparse
import json

import jax

from zoo.bench import dp_rows
from zoo.models.registry import get_config
from zoo.precision import get_precision

# GPT-2's proportions at a CPU's size: T / d_model as GPT-2 124M's at T 256 and T 1024
# (0.33, 1.33), a tied head, and a vocabulary many times d_model (GPT-2: 65x).
SMALL = {"d_model": 192, "num_heads": 4, "num_layers": 4, "d_ff": 768, "vocab_size": 8192, "max_len": 256}
SMALL_SEQS = (64, 256)
GPT2_SEQS = (256, 1024)
ROWS = (dp_rows.BASELINE, dp_rows.GHOST)


def temps(cfg, batch: int, seq: int, remat: str, precision: str) -> dict:
    """``{row: temp bytes}`` of the non-private and ghost rows, compiled at ``batch x seq``."""
    setup, params = dp_rows.setup_for(
        cfg, "nnx", batch, batch, (), 0, remat=remat, precision=get_precision(precision)
    )
    data = dp_rows.synthetic_batch(cfg, batch, seq, 0)
    runs = dp_rows.compile_rows(list(ROWS), dp_rows.methods(), setup, params, data, 0, None)
    return {name: run["temp"] for name, run in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--remats", default="none,dots")
    parser.add_argument("--gpt2", action="store_true", help="also gpt2-124m at T 256 and 1024")
    parser.add_argument("--only-gpt2", action="store_true", help="gpt2-124m alone")
    parser.add_argument("--seqs", default=None, help="gpt2-124m's lengths (default 256,1024)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--forms", choices=("own", "tpu"), default="own", help="whose formula picks the norm forms"
    )
    args = parser.parse_args()
    if args.forms == "tpu":
        from zoo.dp.ghost import forms

        forms.BALANCE[jax.devices()[0].platform] = forms.BALANCE["tpu"]
    cases = (
        []
        if args.only_gpt2
        else [("gpt2-small-shaped", get_config("gpt2-124m", **SMALL), s) for s in SMALL_SEQS]
    )
    if args.gpt2 or args.only_gpt2:
        seqs = [int(s) for s in args.seqs.split(",")] if args.seqs else GPT2_SEQS
        cases += [("gpt2-124m", get_config("gpt2-124m"), seq) for seq in seqs]
    out = []
    for name, cfg, seq in cases:
        for remat in args.remats.split(","):
            t = temps(cfg, args.batch, seq, remat, args.precision)
            row = {"model": name, "batch": args.batch, "seq": seq, "remat": remat, **t}
            row["ratio"] = round(t[dp_rows.GHOST] / t[dp_rows.BASELINE], 3)
            out.append(row)
            if not args.json:
                print(
                    f"{name} B {args.batch} T {seq} {remat}: non-private {t[dp_rows.BASELINE] / 2**20:.1f} MiB, "
                    f"ghost {t[dp_rows.GHOST] / 2**20:.1f} MiB, ratio {row['ratio']:.3f}",
                    flush=True,
                )
    if args.json:
        print(json.dumps({"platform": jax.devices()[0].platform, "precision": args.precision, "rows": out}))


if __name__ == "__main__":
    main()
