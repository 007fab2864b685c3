"""The largest batch that fits: ``zoo train``'s step for a preset at sequence length T, under a
remat policy and an in-program ``[train] placement``, each batch tried in a process of its own.

    .venv/bin/python benchmarks/device/fits.py llama-1b --seq 2048 --remat full --placement offload-optimizer
    .venv/bin/python benchmarks/device/fits.py llama-1b --small        # CPU, tiny: the kind's small config

Batches double from 1 until a step fails (out of memory, or past ``--max-batch``), then the
gap is bisected. Each row is one child process (``memory_stats()``'s peak never resets): it
compiles the step (``zoo.bench.step.compile_step``, real arrays), runs ``--steps`` timed steps
after one warm-up (the initial params drawn in host memory, so that the device's peak is the
training state's and the step's), and prints a JSON line: the HBM peak (below), ms/step,
tokens/s and MFU (``devicekit.step_mfu``: zoo's one FLOP count over the step time and the
device's peak; None where the peak is not known). The result is the row of the largest batch
that fits, as one JSON line (and ``--out FILE``).

HBM peak: ``hbm_peak_bytes`` is the larger of ``peak_bytes`` (``memory_stats()``'s
``peak_bytes_in_use``; None on a CPU, which has none) and ``compiled_bytes``, the compiled
step's device footprint from ``memory_analysis()`` (``devicekit.footprint``: the larger of
XLA's peak and arguments + outputs - aliased + temp, device memory only: an offloaded state's
``pinned_host`` bytes do not count on a chip). On the TPU v5e under JAX 0.10.2 ``peak_bytes_in_use`` does not
see a program's temp (1.86 GiB for every remat policy), so neither figure alone is the peak
(docs/device.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the peak is the step's own
if "--small" in sys.argv[1:] and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    # Tiny runs are all compile time; LLVM's optimisation passes double it on CPU.
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"


def hbm_peak(stats_peak: int | None, compiled: int) -> dict:
    """Both peaks and the larger as ``hbm_peak_bytes``: ``memory_stats()``'s (None where the
    backend has none) and the compiled step's device footprint."""
    return {
        "peak_bytes": stats_peak,
        "compiled_bytes": compiled,
        "hbm_peak_bytes": max(stats_peak or 0, compiled),
    }


def row(args, batch: int) -> dict:
    """Compile and time ``zoo train``'s step at ``batch`` rows (in this process)."""
    import devicekit  # beside this script: its folder is sys.path[0]
    import jax

    import zoo
    from zoo import recipes
    from zoo.bench.common import memory_stats
    from zoo.bench.step import compile_step
    from zoo.models import canonical
    from zoo.parallel.placement import host_device

    cfg = devicekit.config(args.preset, args.small)
    seq = args.seq if not args.small else cfg.max_len
    x = zoo.example_batch(cfg, batch, seq_len=seq)
    y = zoo.example_labels(cfg, x)
    with jax.default_device(host_device() or jax.devices()[0]):  # on the host: the peak is the step's alone
        params = canonical.init_params(cfg, 0)
    base = recipes.parse_recipe({"train": {"placement": args.placement}}, "fits")
    step = compile_step(cfg, x, y, remat=args.remat, precision=args.precision, params=params, recipe=base)
    run = {"state": step.state, "out": None}
    stepper = step.stepper(run)
    seconds = devicekit.median_step_seconds(stepper, args.steps)
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    analysis = memory_stats(step.compiled)
    compiled = devicekit.footprint(step.compiled)
    mfu = devicekit.step_mfu(cfg, batch, seq, seconds, args.precision)
    return {
        "preset": args.preset if not args.small else f"{args.preset} (small: {cfg.kind} small config)",
        "seq": seq,
        "remat": args.remat,
        "placement": args.placement,
        "precision": args.precision,
        "batch": batch,
        "fits": True,
        **hbm_peak(stats.get("peak_bytes_in_use"), compiled),
        "analysis_bytes": analysis["temp_size_in_bytes"] + analysis["argument_size_in_bytes"],
        "host_temp_bytes": analysis["host_temp_size_in_bytes"],
        "ms_per_step": round(seconds * 1e3, 3),
        "tokens_per_s": round(batch * seq / seconds, 1),
        "mfu": None if mfu is None else round(mfu, 4),
        "compile_s": round(step.compile_s, 3),
        "loss": float(run["out"]["loss"]),
        "device": jax.devices()[0].device_kind,
    }


def child(args, batch: int) -> dict:
    """One row in a child process; a failed step (out of memory) is ``fits: False``."""
    argv = [sys.executable, os.path.abspath(__file__), args.preset, "--row", str(batch)]
    argv += ["--seq", str(args.seq), "--remat", args.remat, "--placement", args.placement]
    argv += ["--precision", args.precision, "--steps", str(args.steps), *(["--small"] if args.small else [])]
    done = subprocess.run(argv, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1])
    from devicekit import out_of_memory  # imports JAX, but this process never starts a backend

    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    memory = out_of_memory(done.stderr)
    return {"batch": batch, "fits": False, "out_of_memory": memory, "error": tail[:300]}


def search(args) -> tuple[dict | None, list[dict]]:
    """``(the largest batch's row that fits, every row tried)``: doubling, then bisection."""
    tried, best, batch, failed = [], None, 1, None
    while batch <= args.max_batch:
        result = child(args, batch)
        tried.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
        if not result["fits"]:
            failed = batch
            break
        best, batch = result, batch * 2
    low, high = (best["batch"] if best else 0), (failed or args.max_batch + 1)
    while high - low > 1 and best is not None:
        mid = (low + high) // 2
        result = child(args, mid)
        tried.append(result)
        print(json.dumps(result), file=sys.stderr, flush=True)
        if result["fits"]:
            best, low = result, mid
        else:
            high = mid
    return best, tried


def main(argv=None) -> int:
    from zoo.configs import STATE_PLACEMENTS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", help="a model preset, e.g. llama-1b")
    p.add_argument("--seq", type=int, default=2048, help="tokens per row (T)")
    p.add_argument("--remat", default="full", help="remat policy (zoo remat-policies)")
    p.add_argument("--placement", default="device", choices=STATE_PLACEMENTS[:-1])  # one program each
    p.add_argument("--precision", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--steps", type=int, default=5, help="timed steps per row (after one warm-up)")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--small", action="store_true", help="the kind's small config at its max_len (CPU)")
    p.add_argument("--row", type=int, default=None, help=argparse.SUPPRESS)  # a child's one batch
    p.add_argument("--out", default=None, help="also write the result as JSON here")
    args = p.parse_args(argv)
    if args.row is not None:
        print(json.dumps(row(args, args.row)), flush=True)
        return 0
    best, tried = search(args)
    result = {"largest": best, "tried": len(tried)}
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({**result, "rows": tried}, f, indent=1)
    return 0 if best else 1


if __name__ == "__main__":
    sys.exit(main())
