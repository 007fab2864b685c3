"""One layer's cached read on this machine: one head to a cache row, and a TPU's rows of 128 lanes.

    .venv/bin/python benchmarks/generate/cache_reads.py                    # transformer-s, gpt2-124m, llama-1b shapes
    .venv/bin/python benchmarks/generate/cache_reads.py --batch 8 --slots 640 --dtype bfloat16

``zoo.models.attention.attention`` reads a cache of ``--slots`` slots for one new token
(``CacheSlice``), jitted, side by side in one process: the cache in rows of one head (what
``zoo.generate`` lays out off a TPU) and in rows of p heads (``decode.heads_per_row``, a TPU's
layout), both timed in turns, best of ``--repeat``. Why the layout is the device's pick
(``decode.row_lanes``): a row of p heads is contracted whole against queries spread over its
lanes, p times the products for the same bytes, which a TPU's tiles want and a CPU pays for.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp

from zoo.models.attention import CacheSlice, attention
from zoo.models.cache_rows import LANES, heads_per_row

SHAPES = {  # heads, kv heads, head width
    "transformer-s": (4, 4, 32),
    "gpt2-124m": (12, 12, 64),
    "llama-1b": (32, 8, 64),
}


def rows_of(x, per_row: int):
    """[B, KV, T, d] -> [B, KV / p, T, p * d]."""
    b, kv, t, d = x.shape
    return jnp.swapaxes(x.reshape(b, kv // per_row, per_row, t, d), 2, 3).reshape(
        b, kv // per_row, t, per_row * d
    )


def row(name: str, batch: int, slots: int, dtype: str, repeat: int) -> dict:
    heads, kv, d = SHAPES[name]
    keys = jax.random.split(jax.random.key(0), 5)
    q = jax.random.normal(keys[0], (batch, 1, heads * d), dtype)
    k, v = (jax.random.normal(key, (batch, 1, kv * d), dtype) for key in keys[1:3])
    ck, cv = (jax.random.normal(key, (batch, kv, slots, d), dtype) for key in keys[3:])
    pad, slot = jnp.zeros(batch, jnp.int32), jnp.int32(slots)
    read = jax.jit(lambda q, k, v, a, b: attention(q, k, v, heads, kv, cache=CacheSlice(a, b, pad, slot)))
    layouts = {p: (q, k, v, rows_of(ck, p), rows_of(cv, p)) for p in sorted({1, heads_per_row(kv, d, LANES)})}
    best = dict.fromkeys(layouts, float("inf"))
    for args in layouts.values():
        jax.block_until_ready(read(*args))
    for _ in range(repeat):
        for p, args in layouts.items():
            start = time.perf_counter()
            jax.block_until_ready(read(*args))
            best[p] = min(best[p], time.perf_counter() - start)
    return {
        "shape": name,
        "batch": batch,
        "slots": slots,
        "dtype": dtype,
        "ms": {p: 1e3 * s for p, s in best.items()},
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--slots", type=int, default=640)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args(argv)
    rows = [row(name, args.batch, args.slots, args.dtype, args.repeat) for name in args.shapes.split(",")]
    print(f"one layer's cached read on {jax.devices()[0].device_kind}, jax {jax.__version__}\n")
    print("| shape | batch | slots | dtype | one head a row, ms | heads a row (p) | p heads a row, ms |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p = max(r["ms"])
        print(
            f"| {r['shape']} | {r['batch']} | {r['slots']} | {r['dtype']} | {r['ms'][1]:.2f} | {p} | {r['ms'][p]:.2f} |"
        )
    return rows


if __name__ == "__main__":
    main()
