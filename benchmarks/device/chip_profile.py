"""Where the chip's time goes, op by op: the profile that comes before a speed change.

    python benchmarks/device/chip_profile.py --parts dp,host,decode,info --out "$OUT"
    python benchmarks/device/chip_profile.py --small --parts dp,host,decode,info --out /tmp/prof   # a CPU

Parts (each prints as it goes; ``--out`` keeps the raw rows as JSON and the programs' HLO, gzipped,
so that the profile can be read again without the chip):

* ``dp``: GPT-2 124M, bf16 on float32 masters, B 8: the non-private step beside the DP step (ghost,
  ``auto``) at 256 x 8 (no remat) and 1024 x 8 (``dots``), each the exact program ``zoo bench dp``
  times (:func:`zoo.bench.dp_rows.compile_rows`). XLA's per-operation times
  (:mod:`op_profile`), their sum by part, and the DP step's costliest operations.
* ``host``: the trip up and down of the update on the host (:mod:`zoo.train.host_update`) for
  ``llama-1b``'s params, cut into its pieces: the host's float32 -> bf16 cast, the copy of the
  cast tree (one leaf at a time, as the step makes it), the same bytes as one array, and the
  float32 gradient's trip down (a tree, and one array).
* ``decode``: one greedy generation at B 64 (prompt 512, 128 new) of ``gpt2-124m``, its
  operations summed by part.
* ``info``: what the device says of its memory (``memory_stats``) and whether this JAX has
  ``pltpu.get_tpu_info``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import op_profile  # noqa: E402
from devicekit import config  # noqa: E402

from zoo.bench import dp_rows  # noqa: E402
from zoo.models import canonical  # noqa: E402
from zoo.precision import get_precision  # noqa: E402


def say(message: str) -> None:
    print(f"profile: {message}", flush=True)


def _save(out: Path | None, name: str, payload) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    if isinstance(payload, str):
        with gzip.open(out / f"{name}.txt.gz", "wt") as f:
            f.write(payload)
    else:
        (out / f"{name}.json").write_text(json.dumps(payload, indent=1))


def dp_part(args, out: Path | None) -> dict:
    cfg = config("gpt2-124m", args.small)
    shapes = [(8, "none"), (16, "dots")] if args.small else [(256, "none"), (1024, "dots")]
    methods = dp_rows.methods()  # "ghost backward" is a row of the bench
    result = {}
    for seq, remat in shapes:
        setup, params = dp_rows.setup_for(
            cfg, "nnx", 8, 8, (), 0, remat=remat, precision=get_precision("bfloat16")
        )
        data = jax.device_put(dp_rows.synthetic_batch(cfg, 8, seq, 0))
        names = [dp_rows.BASELINE, *args.dp_methods.split(",")]
        tic = time.perf_counter()
        runs = dp_rows.compile_rows(names, methods, setup, params, data, 0, say)
        say(f"T {seq} {remat}: compiled {len(runs)} rows in {time.perf_counter() - tic:.1f} s")
        profiles, hlo = {}, {}
        for name, run in runs.items():
            state = {"s": run["state"]}

            def call(run=run, state=state, data=data):
                state["s"], metrics = run["compiled"](state["s"], run["frozen"], data)
                jax.block_until_ready(metrics)

            hlo[name] = run["compiled"].as_text()
            profiles[name] = op_profile.op_times(call, hlo[name], calls=args.calls)
            total = sum(r["ms"] for r in profiles[name])
            say(
                f"T {seq} {remat} {name}: {total:.2f} ms of operations a step, temp {run['temp'] / 2**20:.0f} MiB"
            )
        key = f"T{seq}-{remat}"
        print(f"\n### {key}: milliseconds per step by part\n")
        print(op_profile.compare(profiles))
        for name in names[1:]:
            print(f"\n### {key}: the {args.top} costliest operations of `{name}`\n")
            print(op_profile.top(profiles[name], args.top))
        result[key] = {
            "temp_bytes": {n: r["temp"] for n, r in runs.items()},
            "buckets": {n: op_profile.buckets(p) for n, p in profiles.items()},
        }
        _save(out, f"dp-{key}", profiles)
        for name, text in hlo.items():
            _save(out, f"hlo-{key}-{name.replace(' ', '_')}", text)
        del runs
    return result


def _median_s(fn, rounds: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(rounds):
        tic = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def host_part(args, out: Path | None) -> dict:
    cfg = config("llama-1b", args.small)
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    cpu = jax.devices("cpu")[0]
    device = jax.devices()[0]
    with jax.default_device(cpu):
        masters = jax.tree.map(lambda s: jnp.full(s.shape, 0.01, jnp.float32), shapes)
    masters = jax.block_until_ready(jax.device_put(masters, cpu))
    leaves = jax.tree.leaves(masters)
    n = sum(x.size for x in leaves)
    cast = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(jnp.bfloat16), t))
    half = jax.block_until_ready(cast(masters))
    flat_half = jax.block_until_ready(jax.device_put(jnp.zeros((n,), jnp.bfloat16), cpu))
    flat_half_np = np.zeros((n,), dtype=jnp.bfloat16)
    half_np = jax.tree.map(np.asarray, half)
    rows = {
        "params": n,
        "leaves": len(leaves),
        "cast on the host (f32 -> bf16, jitted)": _median_s(lambda: cast(masters), args.rounds),
        "up: the bf16 tree (jax CPU arrays)": _median_s(lambda: jax.device_put(half, device), args.rounds),
        "up: the bf16 tree (numpy arrays)": _median_s(lambda: jax.device_put(half_np, device), args.rounds),
        "up: one bf16 array (jax CPU array)": _median_s(
            lambda: jax.device_put(flat_half, device), args.rounds
        ),
        "up: one bf16 array (numpy)": _median_s(lambda: jax.device_put(flat_half_np, device), args.rounds),
    }
    grads = jax.block_until_ready(jax.device_put(masters, device))
    flat_grad = jax.block_until_ready(jnp.zeros((n,), jnp.float32, device=device))
    rows["down: the f32 tree (device_put to CPU)"] = _median_s(
        lambda: jax.device_put(grads, cpu), args.rounds
    )
    rows["down: one f32 array (device_put to CPU)"] = _median_s(
        lambda: jax.device_put(flat_grad, cpu), args.rounds
    )
    rows["down: one f32 array (np.asarray)"] = _median_s(
        lambda: np.asarray(flat_grad + 0), args.rounds
    ) - _median_s(lambda: flat_grad + 0, args.rounds)
    for k, v in rows.items():
        if isinstance(v, float):
            byte = 2 if "bf16" in k else 4
            say(f"host: {k}: {v * 1e3:.1f} ms ({n * byte / max(v, 1e-9) / 1e9:.2f} GB/s)")
    _save(out, "host", rows)
    return rows


def decode_part(args, out: Path | None) -> dict:
    from zoo.generate import Model, generate

    cfg = config("gpt2-124m", args.small)
    batch, prompt, new = (4, 8, 8) if args.small else (64, 512, 128)
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), canonical.init_params(cfg, 0))
    model = Model(cfg, "nnx", params, "bfloat16")
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, cfg.vocab_size, prompt)) for _ in range(batch)]

    def call():
        jax.block_until_ready(generate(model, prompts, max_new_tokens=new, temperature=0).tokens)

    rows = op_profile.op_times(call, "", calls=2)
    total = sum(r["ms"] for r in rows)
    say(f"decode B {batch}: {total:.1f} ms of operations per generate call")
    print(f"\n### decode gpt2-124m B {batch}: the {args.top} costliest operations\n")
    print(op_profile.top(rows, args.top))
    _save(out, "decode", rows)
    return {"total_ms": total}


def info_part(args, out: Path | None) -> dict:
    device = jax.devices()[0]
    info = {"kind": device.device_kind, "jax": jax.__version__, "memory_stats": device.memory_stats()}
    try:
        from jax.experimental.pallas import tpu as pltpu

        tpu = pltpu.get_tpu_info()
        info["tpu_info"] = {k: str(v) for k, v in vars(tpu).items()} if hasattr(tpu, "__dict__") else str(tpu)
    except Exception as error:  # noqa: BLE001 - what this JAX lacks is the answer
        info["tpu_info"] = f"{type(error).__name__}: {error}"[:300]
    say(f"info: {json.dumps(info, default=str)}")
    _save(out, "info", info)
    return info


PARTS = {"dp": dp_part, "host": host_part, "decode": decode_part, "info": info_part}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parts", default="info,dp,host,decode", help=f"comma-separated of {sorted(PARTS)}")
    p.add_argument(
        "--dp-methods", default="ghost,ghost backward", help="zoo bench dp rows beside the non-private one"
    )
    p.add_argument("--calls", type=int, default=3, help="profiled calls of each step")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each transfer")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--small", action="store_true", help="a CPU: the kinds' small configs")
    p.add_argument("--out", default="", help="folder for the raw rows (JSON) and programs (HLO, gzipped)")
    args = p.parse_args(argv)
    out = Path(args.out) if args.out else None
    parts = args.parts.split(",")
    for part in parts:
        if part not in PARTS:
            raise SystemExit(f"profile: unknown part {part!r}; the parts: {', '.join(PARTS)}")
    for part in parts:
        tic = time.perf_counter()
        PARTS[part](args, out)
        say(f"{part}: {time.perf_counter() - tic:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
