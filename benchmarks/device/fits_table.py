"""What fits on one chip, in one process: the largest batch of ``zoo train``'s step per row
(preset, remat policy, ``[train] offload``, fine-tuning mode), with its ms/step, tokens/s, MFU
and HBM peak. A bounded-time companion of ``fits.py`` (which runs one process per batch tried).

    python benchmarks/device/fits_table.py --rows llama-1b:full:optimizer,gpt2-355m:dots:none --seq 2048
    python benchmarks/device/fits_table.py --rows llama-3b:full:none:lora --seq 2048
    python benchmarks/device/fits_table.py --small                  # a CPU: tiny configs, quick

A row is ``PRESET:POLICY:OFFLOAD[:MODE]``; MODE is ``full`` (every weight trains: AdamW),
``lora`` (rank-16 adapters on q, v and the MLP, the base frozen and held in bf16) or ``frozen``
(the token table and the first 3/4 of the layers frozen).

How a row finds its batch, with few compiles (each takes seconds on a chip):
1. the state the step keeps on the device (params, optimizer state, frozen weights: the
   ``offload`` setting moves some of it to host memory) is counted from shapes; more than the
   chip's ``bytes_limit`` and the row does not fit at any batch, with nothing compiled;
2. the step is compiled from shapes (nothing allocated) at batch 1, 2, 4, ... until its device
   footprint is over the limit (or it fails to compile for memory), then the gap is bisected.
   The footprint is XLA's ``memory_analysis()``: the larger of ``peak_memory_in_bytes`` and
   arguments + outputs - aliased + temp in device memory. It is not linear in the batch (on a
   TPU v5e, ``llama-1b`` LoRA's grew 0.22 GiB from batch 1 to 2 and about 1.1 GiB a row from 2
   to 10), so it is compiled, not extrapolated;
3. that batch is compiled with real arrays and run (one warm-up, then ``--steps`` timed); an
   out-of-memory error at run time steps the batch down by one.
The HBM peak of a row is the larger of the compiled footprint and ``memory_stats()``'s
``peak_bytes_in_use`` (on a TPU v5e with JAX 0.10.2 the latter leaves the compiled temp out, so
it read 1.86 GiB for every remat policy of GPT-2 124M).

One JSON line per row on stdout; ``--json FILE`` writes them all; ``--deadline S`` stops
starting rows after S seconds (the rest are listed as not measured).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from devicekit import config, footprint, host_params, median_step_seconds, out_of_memory, say, step_mfu  # noqa: E402

import zoo  # noqa: E402
from zoo import recipes  # noqa: E402
from zoo.bench.common import state_stepper  # noqa: E402
from zoo.bench.step import bench_start, compile_step  # noqa: E402
from zoo.models import canonical  # noqa: E402
from zoo.parallel.placement import placement_named  # noqa: E402
from zoo.train import stages  # noqa: E402

MODES = {
    "full": {},
    "lora": {"lora": {"rank": 16, "alpha": 32.0, "targets": ["attn.q", "attn.v", "mlp.*"]}},
    "frozen": None,  # built per config: the token table and the first 3/4 of the layers
}


def parse_row(text: str) -> dict:
    parts = text.split(":")
    if len(parts) not in (3, 4) or (len(parts) == 4 and parts[3] not in MODES):
        raise SystemExit(
            f"fits_table: bad row {text!r}: PRESET:POLICY:OFFLOAD[:MODE], MODE in {sorted(MODES)}"
        )
    return {
        "preset": parts[0],
        "remat": parts[1],
        "offload": parts[2],
        "mode": parts[3] if len(parts) == 4 else "full",
    }


def recipe_for(cfg, row: dict, precision: str, batch_size: int = 64, microbatch_size: int | None = None):
    extra = MODES[row["mode"]]
    if extra is None:
        cut = max(1, 3 * cfg.num_layers // 4)
        extra = {"freeze": {"patterns": ["embed.*", f"blocks[0:{cut}].*"]}}
    train = {
        "offload": row["offload"],
        "precision": precision,
        "remat": row["remat"],
        "batch_size": batch_size,
    }
    if microbatch_size is not None:
        train["microbatch_size"] = microbatch_size
    return recipes.parse_recipe({"train": train, **extra}, "fits")


def compile_for(cfg, recipe, params, batch: int, seq: int):
    """``zoo train``'s step for ``recipe`` at ``batch`` rows (``zoo.bench.step.compile_step``:
    the recipe's LoRA or freeze patterns too); from shapes, nothing allocated, without ``params``."""
    x = zoo.example_batch(cfg, batch, seq_len=seq)
    y = zoo.example_labels(cfg, x)
    if params is None:
        x, y = (jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, y))
    t = recipe.train
    return compile_step(cfg, x, y, remat=t.remat, precision=t.precision, params=params, recipe=recipe)


def resident_bytes(cfg, recipe, params_shapes) -> int:
    """Bytes of the train state the step keeps in device memory between steps (the fields
    ``[train] offload`` keeps in host memory left out)."""
    start = bench_start(cfg, recipe, params_shapes)
    engine = stages.engine(recipe, start, None, recipe.train.steps)
    state, frozen = jax.eval_shape(lambda p: engine.init_state(p, 0), start.params)
    away = placement_named(recipe.train.placement).host_fields
    kept = [frozen] + [getattr(state, f.name) for f in dataclasses.fields(state) if f.name not in away]
    return sum(math.prod(a.shape) * jnp.dtype(a.dtype).itemsize for a in jax.tree.leaves(kept))


def largest(fits, most: int) -> int:
    """The largest batch in 1..``most`` that ``fits``, doubling from 1 and then bisecting the gap
    (0 when batch 1 does not): about 2 log2(batch) calls."""
    low, high = 0, None
    batch = 1
    while batch <= most:
        if not fits(batch):
            high = batch
            break
        low, batch = batch, batch * 2
    high = high or most + 1  # every power of two up to the cap fitted: bisect up to the cap
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def row_seq(cfg, args) -> int:
    """A row's sequence length: ``--seq``, at most its model's context (a table of gpt2-355m,
    ``max_len`` 1,024, beside llama-1b at 2,048), and the small config's own on a CPU."""
    return cfg.max_len if args.small else min(args.seq, cfg.max_len)


def measure_row(row: dict, args, limit: int) -> dict:
    cfg = config(row["preset"], args.small)
    seq = row_seq(cfg, args)
    recipe = recipe_for(cfg, row, args.precision)
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    out = {**row, "seq": seq, "precision": args.precision, "limit_bytes": limit}
    out["resident_bytes"] = resident_bytes(cfg, recipe, shapes)
    if out["resident_bytes"] > limit:
        return {**out, "fits": False, "batch": 0, "why": "the resident train state alone is over the limit"}

    def compiled_at(batch: int, params=None):
        return compile_for(cfg, recipe, params, batch, seq)

    if args.batch:  # a given batch: no search, one compile and run
        say(f"{row}: resident {out['resident_bytes'] / 2**30:.2f} GiB; batch {args.batch} as given")
        found = run_at(compiled_at, args.batch, host_params(cfg), cfg, seq, args, limit)
        return {**out, **found, "batch_given": True}
    say(f"{row}: resident {out['resident_bytes'] / 2**30:.2f} GiB; compiling from shapes")
    sizes = {}

    def fits_at(b: int) -> bool:  # a compile from shapes: nothing allocated
        try:
            step = compiled_at(b)
            compiled, compile_s = step.compiled, step.compile_s
        except Exception as e:  # noqa: BLE001 - a compile-time out-of-memory is a result
            if not out_of_memory(e):
                raise
            sizes[b] = None
            return False
        sizes[b] = footprint(compiled)
        out.setdefault("compile_s", []).append(round(compile_s, 2))
        return sizes[b] <= limit

    batch = largest(fits_at, args.max_batch)
    out["footprints"] = {str(b): v for b, v in sorted(sizes.items())}
    if batch < 1:
        why = f"batch 1 needs {sizes[1] / 2**30:.2f} GiB" if sizes.get(1) else "batch 1 does not compile"
        return {**out, "fits": False, "batch": 0, "why": why}
    params = host_params(cfg)
    say(f"{row}: batch {batch}, footprints {out['footprints']}")
    while batch >= 1:
        try:
            found = run_at(compiled_at, batch, params, cfg, seq, args, limit)
            if args.accumulate_rows > batch and row["mode"] == "full":
                found["accumulated"] = accumulated(cfg, row, args, batch, params, seq, limit)
            return {**out, **found}
        except Exception as e:  # noqa: BLE001
            if not out_of_memory(e):
                raise
            out.setdefault("stepped_down", []).append(batch)
            batch -= 1
    return {**out, "fits": False, "batch": 0, "why": "every batch ran out of memory"}


def accumulated(cfg, row: dict, args, micro: int, params, seq: int, limit: int) -> dict:
    """The row's step over about ``--accumulate-rows`` rows, in microbatches of its largest batch:
    one update (and one round trip of the offloaded state) per step. One timed step."""
    rows = args.accumulate_rows // micro * micro
    say(f"{row}: accumulating {rows // micro} x {micro} rows")
    recipe = recipe_for(cfg, row, args.precision, batch_size=rows, microbatch_size=micro)
    try:
        one = argparse.Namespace(**{**vars(args), "steps": 1})
        return run_at(lambda b, p: compile_for(cfg, recipe, p, b, seq), rows, params, cfg, seq, one, limit)
    except Exception as e:  # noqa: BLE001 - reported, the row's own figures stand
        return {"fits": False, "error": str(e)[:300]}


def run_at(compiled_at, batch: int, params, cfg, seq: int, args, limit: int) -> dict:
    step = compiled_at(batch, params)
    compiled, state, frozen, data, compile_s = (
        step.compiled,
        step.state,
        step.frozen,
        step.batch,
        step.compile_s,
    )
    fp = footprint(compiled)
    if fp > limit:
        raise RuntimeError(f"RESOURCE_EXHAUSTED: footprint {fp} over the limit {limit}")
    run = {"state": state, "out": None}
    stepper = state_stepper(lambda st: compiled(st, frozen, data), run)
    seconds = median_step_seconds(stepper, args.steps)
    stats = jax.devices()[0].memory_stats() or {}
    kind = jax.devices()[0].device_kind
    mfu = step_mfu(step.engine.cfg, batch, seq, seconds, args.precision, step.engine.freeze)
    peak_in_use = stats.get("peak_bytes_in_use")
    return {
        "fits": True,
        "batch": batch,
        "footprint_bytes": fp,
        "peak_bytes_in_use": peak_in_use,
        "hbm_peak_gib": round(max(fp, peak_in_use or 0) / 2**30, 3),
        "ms_per_step": round(seconds * 1e3, 2),
        "tokens_per_s": round(batch * seq / seconds, 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "compile_s": round(compile_s, 2),
        "loss": float(run["out"]["loss"]),
        "device": kind,
    }


def plot(rows: list[dict], path: str) -> None:
    """Two panels, a bar per row: the largest batch (with its HBM peak) and tokens/s; a row that
    does not fit shows an empty bar labelled so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [f"{r['preset']} {r['mode']}\nremat {r['remat']}, offload {r['offload']}" for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 0.7 * len(rows) + 1.5), sharey=True)
    ys = range(len(rows))
    left.barh(ys, [r.get("batch") or 0 for r in rows], color="tab:blue")
    right.barh(ys, [r.get("tokens_per_s") or 0 for r in rows], color="tab:green")
    for y, r in zip(ys, rows, strict=True):
        label = (
            f" {r['hbm_peak_gib']:.1f} GiB"
            if r.get("fits")
            else " does not fit"
            if r.get("fits") is False
            else " not measured"
        )
        left.text(r.get("batch") or 0, y, label, va="center", fontsize=8)
    left.set_yticks(list(ys), names, fontsize=8)
    left.invert_yaxis()
    left.set_xlabel("largest batch (rows of T tokens), HBM peak")
    right.set_xlabel("tokens/s at that batch")
    seq = next((r["seq"] for r in rows if r.get("seq")), "?")
    device = next((r["device"] for r in rows if r.get("device")), "device")
    fig.suptitle(f"What fits on one {device} at T {seq}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="", help="PRESET:POLICY:OFFLOAD[:MODE],...")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--precision", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--accumulate-rows", type=int, default=0, help="also run full rows at ~R rows a step")
    p.add_argument("--batch", type=int, default=0, help="run every row at this batch (no search)")
    p.add_argument("--deadline", type=float, default=0, help="seconds: start no row after this")
    p.add_argument("--limit-gib", type=float, default=0, help="the memory limit (default: the device's)")
    p.add_argument("--json", default="")
    p.add_argument("--small", action="store_true", help="a CPU: the kinds' small configs")
    p.add_argument("--plot", default="", help="draw the rows into this PNG")
    p.add_argument("--from-json", default="", help="measure nothing: plot the rows of this file")
    args = p.parse_args(argv)
    if args.from_json:
        with open(args.from_json) as f:
            plot(json.load(f), args.plot or "fits.png")
        return 0
    if args.small and not args.rows:
        args.rows = "llama-1b:full:optimizer,llama-1b:none:none:lora,gpt2-355m:dots:none:frozen"
    rows = [parse_row(r) for r in args.rows.split(",") if r]
    stats = jax.devices()[0].memory_stats() or {}
    limit = int(args.limit_gib * 2**30) or stats.get("bytes_limit") or 2**30
    start, results = time.time(), []
    for row in rows:
        if args.deadline and time.time() - start > args.deadline:
            results.append({**row, "fits": None, "why": "not measured: past --deadline"})
        else:
            tic = time.time()
            results.append({**measure_row(row, args, limit), "row_s": round(time.time() - tic, 1)})
        print(json.dumps(results[-1]), flush=True)
        if args.json:  # after every row: a call cut short keeps what it measured
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
