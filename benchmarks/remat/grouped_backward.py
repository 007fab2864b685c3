"""Grouped stacks (nested, recursive): the hand-written backward against autodiff's.

    .venv/bin/python benchmarks/remat/grouped_backward.py [--model transformer-s] [--depths 16,64]
                                                    [--batch 16] [--repeats 5]

``zoo.grouped`` writes the backward pass of a grouped stack by hand (one gradient buffer,
parameters read by index). The autodiff version it replaced -- nested ``jax.checkpoint`` around
nested ``lax.scan``, every level slicing its groups' parameters -- is rebuilt here, and both
are compiled side by side in one process for each policy and depth: the step ``zoo train
--remat POLICY`` runs, as ``zoo bench remat`` builds it (``zoo.bench.step.compile_step``), XLA's
compiled temp bytes, and (with ``--repeats``) the median step
time over interleaved rounds at the shallowest depth. Both must give the same gradients; the
script checks that too, at the shallowest depth.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics

import jax
import jax.numpy as jnp

from zoo import scan
from zoo.api import apply_fn, example_batch, example_labels
from zoo.bench.common import memory_stats, time_in_rounds
from zoo.bench.step import compile_step
from zoo.losses import per_example_loss
from zoo.models import canonical
from zoo.models.registry import get_config
from zoo.remat import get_policy

# ``zoo.scan`` hands a stack of two or more levels to ``run_grouped``; the bench swaps it.
HAND_WRITTEN = scan.run_grouped


def _plain_scan(body, xs, h):
    """``(h, ys)`` of ``body(x, h) -> (h, y)`` scanned over the leading axis of ``xs``."""
    return jax.lax.scan(lambda carry, x: body(x, carry), h, xs)


def autodiff_levels(body, stacked, h, levels):
    """The previous implementation: each level a scan of ``full``-checkpointed groups."""
    if len(levels) == 1:
        return _plain_scan(body, stacked, h)
    outer, inner = levels[0], levels[1:]
    grouped = jax.tree_util.tree_map(lambda a: a.reshape(outer, a.shape[0] // outer, *a.shape[1:]), stacked)
    group_body = get_policy("full").wrap(lambda group, carry: autodiff_levels(body, group, carry, inner))
    h, ys = _plain_scan(group_body, grouped, h)
    return h, jax.tree_util.tree_map(lambda a: a.reshape(a.shape[0] * a.shape[1], *a.shape[2:]), ys)


@contextlib.contextmanager
def backward(kind: str):
    scan.run_grouped = HAND_WRITTEN if kind == "hand-written" else autodiff_levels
    try:
        yield
    finally:
        scan.run_grouped = HAND_WRITTEN


def loss_fn(apply, x, y, policy):
    return lambda p: per_example_loss(apply(p, x, policy), y).mean()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="transformer-s")
    parser.add_argument("--depths", default="16,64")
    parser.add_argument("--policies", default="nested,recursive")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument(
        "--repeats", type=int, default=5, help="timed rounds at the shallowest depth (0: none)"
    )
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    policies = args.policies.split(",")
    kinds = ("autodiff", "hand-written")
    rows, steppers, grads = [], {}, {}
    for depth in depths:
        cfg = get_config(args.model, num_layers=depth)
        x = example_batch(cfg, args.batch, seed=0, seq_len=args.seq)
        y = example_labels(cfg, x)
        apply = apply_fn(cfg, "nnx")
        for policy in policies:
            for kind in kinds:
                with backward(kind):
                    params = canonical.init_params(cfg, 0)
                    step = compile_step(cfg, x, y, remat=policy, params=params)
                    if depth == depths[0]:
                        grads[policy, kind] = jax.jit(jax.grad(loss_fn(apply, x, y, policy)))(params)
                        if args.repeats:
                            steppers[policy, kind] = step.stepper({"state": step.state, "out": None})
                temp = memory_stats(step.compiled)["temp_size_in_bytes"]
                rows.append({"policy": policy, "backward": kind, "layers": depth, "temp_bytes": temp})
                print(json.dumps(rows[-1]), flush=True)
    for policy in policies:
        a, b = (jax.tree.leaves(grads[policy, kind]) for kind in kinds)
        diff = max(float(jnp.max(jnp.abs(u - v))) for u, v in zip(a, b, strict=True))
        print(f"{policy} at L={depths[0]}: max |gradient, autodiff - hand-written| = {diff:.3g}")
    times = time_in_rounds(steppers, args.repeats) if args.repeats else {}
    print(
        f"\n| policy | backward | temp L={depths[0]} | temp L={depths[-1]} | growth | step ms L={depths[0]} |"
    )
    print("|---|---|---|---|---|---|")
    for policy in policies:
        for kind in kinds:
            t = {
                r["layers"]: r["temp_bytes"] for r in rows if r["policy"] == policy and r["backward"] == kind
            }
            first, last = t[depths[0]], t[depths[-1]]
            ms = f"{1000 * statistics.median(times[policy, kind]):.0f}" if times else "-"
            print(
                f"| {policy} | {kind} | {first / 2**20:.1f} MiB | {last / 2**20:.1f} MiB "
                f"| x{last / first:.2f} | {ms} |"
            )


if __name__ == "__main__":
    main()
