"""Compiled temp memory of value-and-grad of attention alone: dense against chunked.

    python benchmarks/remat/attention.py --seq 2048 --batch 2 --heads 4 --head-dim 32 --chunks 64,128,256

Compile only (XLA's memory_analysis), nothing is run or timed. Prints one JSON line per
variant and a table with each chunked variant's temp as a fraction of dense.
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp

from zoo.models.attention import attention


def temp_bytes(fn, batch: int, seq: int, width: int) -> int:
    spec = jax.ShapeDtypeStruct((batch, seq, width), jnp.float32)
    grad = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(fn(q, k, v)), argnums=(0, 1, 2)))
    return grad.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--chunks", default="64,128,256")
    args = parser.parse_args()
    width = args.heads * args.head_dim
    dense = temp_bytes(lambda q, k, v: attention(q, k, v, args.heads), args.batch, args.seq, width)
    rows = [{"attention": "dense", "chunk": None, "temp_bytes": dense, "of_dense": 1.0}]
    for chunk in (int(c) for c in args.chunks.split(",")):
        fn = lambda q, k, v, c=chunk: attention(q, k, v, args.heads, kind="chunked", chunk=c)  # noqa: E731
        t = temp_bytes(fn, args.batch, args.seq, width)
        rows.append(
            {"attention": "chunked", "chunk": chunk, "temp_bytes": t, "of_dense": round(t / dense, 4)}
        )
    for row in rows:
        print(json.dumps({**vars(args), **row}))
    print(
        f"\n| attention | chunk | temp MiB | of dense |  (B={args.batch}, T={args.seq}, H={args.heads}, d={args.head_dim})"
    )
    print("|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['attention']} | {row['chunk'] or '-'} | {row['temp_bytes'] / 2**20:.1f} | {row['of_dense']:.3f} |"
        )


if __name__ == "__main__":
    main()
