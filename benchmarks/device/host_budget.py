"""The host bytes each leaf's update holds in the pipelined host step (``zoo.parallel.host_step.
HostStep``), by XLA's analysis of the programs it compiles, on abstract arrays (no memory: a CPU
answers for llama-1b): each leaf's float32 bytes and its update's, their sum (what the pipeline
without a budget queued at once) and the default budgets: the trips' (the whole float32
gradient) and the updates' (the largest update's own bytes beyond its gradient).

    python benchmarks/device/host_budget.py --preset llama-1b
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import zoo
from zoo import recipes
from zoo.models import canonical
from zoo.parallel.host_leaves import CHUNK_BYTES, LeafUpdates, down_pieces, row_bounds
from zoo.precision import Precision
from zoo.train.state import make_optimizer

GIB = 2**30


def leaf_bytes(preset: str, precision: str, chunk_bytes: int) -> list[tuple[tuple, int, int]]:
    """``(shape, float32 bytes, update bytes)`` of each trainable leaf of ``preset`` under the
    default recipe's optimizer."""
    params = jax.eval_shape(lambda: canonical.init_params(zoo.get_config(preset), 0))
    optimizer = make_optimizer(recipes.parse_recipe({}, "host-budget").optim, 1000)
    updates = LeafUpdates(optimizer, Precision(precision))
    leaves, treedef = jax.tree.flatten(params)
    moments, shared = updates.prepare(jax.eval_shape(optimizer.init, params), treedef)
    host = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    on_host = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=host)  # noqa: E731
    norm = jax.ShapeDtypeStruct((), jnp.float32, sharding=host)
    rows = []
    for p, m in zip(leaves, moments, strict=True):
        p, m = on_host(p), tuple(on_host(x) for x in m)
        edges = row_bounds(p.shape, p.size * 4, chunk_bytes)
        down = down_pieces(p, edges, host)
        updates.compile(p, m, shared, norm, down, edges)
        rows.append((p.shape, p.size * 4, updates.held_bytes(p, down, edges)))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--precision", default="bfloat16")
    parser.add_argument("--chunk-mib", type=int, default=CHUNK_BYTES // 2**20)
    args = parser.parse_args(argv)
    rows = leaf_bytes(args.preset, args.precision, args.chunk_mib * 2**20)
    for shape, f32, held in rows:
        print(
            f"{shape}: float32 {f32 / GIB:.3f} GiB, update holds {held / GIB:.3f} GiB ({held / max(f32, 1):.2f}x)"
        )
    total = sum(f32 for _, f32, _ in rows)
    print(
        f"{len(rows)} leaves, params {total / GIB:.2f} GiB float32, state {3 * total / GIB:.2f} GiB; "
        f"every update at once {sum(h for *_, h in rows) / GIB:.2f} GiB; "
        f"default budgets: trips {total / GIB:.2f} GiB + updates {max(h - f for _, f, h in rows) / GIB:.2f} GiB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
