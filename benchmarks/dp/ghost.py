"""Ghost clipping vs the other ways to take a DP-SGD step, side by side in one process.

    .venv/bin/python benchmarks/dp/ghost.py                 # both workloads, 30 rounds
    .venv/bin/python benchmarks/dp/ghost.py --rounds 60 --only mlp --json out.json

Workloads: ``mlp-s`` at B=256 and ``transformer-xs`` at B=32, T=64 (its training shape).
Every variant is a full jitted step -- gradient, (clipping and noise), SGD update -- on the
same params and batch:

* ``non-private``: ``jax.grad`` of the mean loss;
* ``ghost`` / ``ghost-backward``: :func:`zoo.dp.ghost.ghost_clipped_grad_sum` (book-kept
  clipped sum / norm taps and a second backward pass) + :func:`zoo.dp.privatize`; for the
  transformer also ``ghost-gram`` / ``ghost-materialise`` (one norm form forced everywhere);
* ``vmap``: :func:`zoo.dp.clipped_grad_sum` + :func:`zoo.dp.privatize`;
* ``jax_privacy``: ``jax_privacy.clipping.clipped_grad`` + :func:`zoo.dp.privatize`;
* ``optax-dpsgd``: ``vmap(grad)`` per-example gradients fed to ``optax.contrib.dpsgd``.

The machine may be shared, so the variants are timed round-robin (one untimed and one timed
call each per round, ``zoo.bench.common.time_in_rounds``) and we report the median per variant and the median over rounds of each variant's time
divided by the non-private time of the same round.  Memory is XLA's compiled
``temp_size_in_bytes``.  The transformer is also compared under ``--remat`` (default
``full``): non-private vs both ghost methods.  The ghost step is also cut into prefixes (forward; + probe backward;
+ norms; + book-kept sum; + noise; + update) whose median differences show where time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

if "--single-thread" in sys.argv:  # must be set before jax starts its CPU client
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    ).strip()

import jax
import jax.numpy as jnp
import optax

import zoo  # noqa: E402
from zoo.bench.common import call_stepper, median_ratio, time_in_rounds  # noqa: E402
from zoo.dp import ClipRequest, clipped_grad_sum, ghost, privatize  # noqa: E402
from zoo.losses import per_example_loss  # noqa: E402
from zoo.models.canonical import init_params  # noqa: E402

CLIP = 1.0
NOISE = 1.0
LR = 0.1
CLOCK = time.perf_counter
WORKLOADS = {"mlp": ("mlp-s", 256, None), "transformer": ("transformer-xs", 32, 64)}


def make_batch(cfg, b, seq):
    x = zoo.example_batch(cfg, b, seed=0, seq_len=seq)
    key = jax.random.key(1)
    if getattr(cfg, "num_classes", 0):
        y = jax.random.randint(key, (b,), 0, cfg.num_classes)
    else:
        y = jax.random.randint(key, x.shape[:2], 0, cfg.vocab_size)
    return x, y


def steps(cfg, b):
    """name -> (step(params, opt_state, x, y, key) -> (params, opt_state), optimizer)."""
    apply = zoo.apply_fn(cfg, "nnx")
    sgd = optax.sgd(LR)

    def one_loss(p, xi, yi):
        return per_example_loss(apply(p, xi[None]), yi[None])[0]

    def private(clipped_sum):
        def step(params, opt_state, x, y, key):
            grad_sum = clipped_sum(params, x, y)
            grads = privatize(grad_sum, key, noise_multiplier=NOISE, l2_clip_norm=CLIP, expected_batch_size=b)
            updates, opt_state = sgd.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return step, sgd

    def non_private(params, opt_state, x, y, key):
        grads = jax.grad(lambda p: per_example_loss(apply(p, x), y).mean())(params)
        updates, opt_state = sgd.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    jp_clipped = None
    try:
        from jax_privacy import clipping as jp_clipping

        jp_clipped = jp_clipping.clipped_grad(
            lambda p, x, y: per_example_loss(apply(p, x), y).sum(),
            l2_clip_norm=CLIP,
            batch_argnums=(1, 2),
            keep_batch_dim=True,
        )
    except ImportError:  # pragma: no cover - jax-privacy is a pinned dependency
        pass

    dpsgd = optax.contrib.dpsgd(LR, l2_norm_clip=CLIP, noise_multiplier=NOISE, seed=0)

    def optax_dpsgd(params, opt_state, x, y, key):
        per_example = jax.vmap(jax.grad(one_loss), in_axes=(None, 0, 0))(params, x, y)
        updates, opt_state = dpsgd.update(per_example, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    out = {
        "non-private": (non_private, sgd),
        "ghost": private(
            lambda p, x, y: ghost.ghost_clipped_grad_sum(
                cfg, p, x, y, ClipRequest(CLIP), method="bookkeeping"
            )[0]
        ),
        "ghost-backward": private(
            lambda p, x, y: ghost.ghost_clipped_grad_sum(cfg, p, x, y, ClipRequest(CLIP), method="backward")[
                0
            ]
        ),
        "vmap": private(lambda p, x, y: clipped_grad_sum(one_loss, p, x, y, request=ClipRequest(CLIP))[0]),
    }
    if cfg.max_len is not None:  # without a sequence axis there is one norm form only
        out["ghost-gram"] = private(
            lambda p, x, y: ghost.ghost_clipped_grad_sum(
                cfg, p, x, y, ClipRequest(CLIP), method="bookkeeping", dense="gram"
            )[0]
        )
        out["ghost-materialise"] = private(
            lambda p, x, y: ghost.ghost_clipped_grad_sum(
                cfg, p, x, y, ClipRequest(CLIP), method="bookkeeping", dense="materialise"
            )[0]
        )
    if jp_clipped is not None:
        out["jax_privacy"] = private(jp_clipped)
    out["optax-dpsgd"] = (optax_dpsgd, dpsgd)
    return out


def remat_steps(cfg, b, remat):
    """Non-private and both ghost methods under one remat policy (memory is the point)."""
    apply = zoo.apply_fn(cfg, "nnx")
    sgd = optax.sgd(LR)

    def non_private(params, opt_state, x, y, key):
        grads = jax.grad(lambda p: per_example_loss(apply(p, x, remat), y).mean())(params)
        updates, opt_state = sgd.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def ghost_step(method):
        def step(params, opt_state, x, y, key):
            grad_sum, _, _ = ghost.ghost_clipped_grad_sum(
                cfg, params, x, y, ClipRequest(CLIP), remat=remat, method=method
            )
            grads = privatize(grad_sum, key, noise_multiplier=NOISE, l2_clip_norm=CLIP, expected_batch_size=b)
            updates, opt_state = sgd.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        return step

    return {
        f"non-private, remat={remat}": (non_private, sgd),
        f"ghost auto (= backward), remat={remat}": (ghost_step("auto"), sgd),
        f"ghost bookkeeping, remat={remat}": (ghost_step("bookkeeping"), sgd),
    }


def _total(tree):
    """One scalar that depends on every leaf: forces the work without copying it out."""
    return sum(jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree))


def stages(cfg, b):
    """Prefixes of the (book-keeping) ghost step, each reduced to one scalar."""
    sgd = optax.sgd(LR)
    keep = jnp.ones((b,), bool)

    def forward(params, opt_state, x, y, key):
        logits, _ = ghost.ghost_forward(cfg, params, x)
        return _total(per_example_loss(logits, y))

    def probe(params, opt_state, x, y, key):
        gp = ghost.prepare(cfg, x)
        losses, _, kept = ghost.tap_pass(gp, params, x, y, sums=True)
        return _total((losses, kept.out))

    def norms(params, opt_state, x, y, key):
        gp = ghost.prepare(cfg, x)
        _, sq, _ = ghost.tap_pass(gp, params, x, y, sums=True)
        return _total(ghost.clip_factors(sq, keep, CLIP))

    def weighted(params, opt_state, x, y, key):
        return ghost.ghost_clipped_grad_sum(cfg, params, x, y, ClipRequest(CLIP), method="bookkeeping")[:2]

    def noised(params, opt_state, x, y, key):
        grad_sum, _ = weighted(params, opt_state, x, y, key)
        return privatize(grad_sum, key, noise_multiplier=NOISE, l2_clip_norm=CLIP, expected_batch_size=b)

    def updated(params, opt_state, x, y, key):
        updates, opt_state = sgd.update(noised(params, opt_state, x, y, key), opt_state, params)
        return _total(optax.apply_updates(params, updates))

    return {
        "forward": forward,
        "+ backward (norms taken, pieces kept)": probe,
        "+ norms and factors": norms,
        "+ book-kept sum": lambda *a: _total(weighted(*a)),
        "+ noise": lambda *a: _total(noised(*a)),
        "+ SGD update": updated,
    }, sgd


def compile_all(fns, args_of):
    compiled, memory = {}, {}
    for name, fn in fns.items():
        c = jax.jit(fn).lower(*args_of(name)).compile()
        stats = c.memory_analysis()
        compiled[name] = c
        memory[name] = int(getattr(stats, "temp_size_in_bytes", 0) or 0) if stats else 0
    return compiled, memory


def round_robin(compiled, args_of, rounds, reference):
    steppers = {name: call_stepper(c, *args_of(name)) for name, c in compiled.items()}
    times = time_in_rounds(steppers, rounds, clock=CLOCK)
    return {
        name: {
            "median_ms": 1e3 * statistics.median(ts),
            "min_ms": 1e3 * min(ts),
            "ratio": median_ratio(ts, times[reference]) if reference else None,
        }
        for name, ts in times.items()
    }


def _timed_table(fns, params, x, y, key, rounds, reference):
    states = {n: opt.init(params) for n, (_, opt) in fns.items()}
    args_of = lambda n: (params, states[n], x, y, key)  # noqa: E731
    compiled, memory = compile_all({n: f for n, (f, _) in fns.items()}, args_of)
    timing = round_robin(compiled, args_of, rounds, reference)
    for n in timing:
        timing[n]["temp_bytes"] = memory[n]
        timing[n]["temp_ratio"] = memory[n] / max(memory[reference], 1)
    return timing


def bench(workload: str, rounds: int, remat: str | None) -> dict:
    name, b, seq = WORKLOADS[workload]
    cfg = zoo.get_config(name)
    params = init_params(cfg, 0)
    x, y = make_batch(cfg, b, seq)
    key = jax.random.key(2)
    timing = _timed_table(steps(cfg, b), params, x, y, key, rounds, "non-private")
    remat_timing = None
    if remat and cfg.max_len is not None:
        remat_timing = _timed_table(
            remat_steps(cfg, b, remat), params, x, y, key, rounds, f"non-private, remat={remat}"
        )

    stage_fns, sgd = stages(cfg, b)
    state = sgd.init(params)
    stage_compiled, _ = compile_all(stage_fns, lambda n: (params, state, x, y, key))
    stage_times = round_robin(stage_compiled, lambda n: (params, state, x, y, key), rounds, None)
    shape = f"B={b}" + (f", T={seq}" if seq else "")
    return {
        "workload": f"{name} ({shape})",
        "steps": timing,
        "remat": remat_timing,
        "stages": {n: t["median_ms"] for n, t in stage_times.items()},
    }


def _table(rows: dict) -> list[str]:
    lines = [
        "| step | median ms | min ms | time / non-private | temp MB | temp / non-private |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, t in rows.items():
        lines.append(
            f"| {name} | {t['median_ms']:.2f} | {t['min_ms']:.2f} | {t['ratio']:.2f}x | "
            f"{t['temp_bytes'] / 1e6:.2f} | {t['temp_ratio']:.2f}x |"
        )
    return lines


def report(result: dict) -> str:
    steps_ = result["steps"]
    lines = [f"### {result['workload']}", "", *_table(steps_), ""]
    ghost_ms = steps_["ghost"]["median_ms"]
    for other in ("vmap", "jax_privacy", "optax-dpsgd"):
        if other in steps_:
            lines.append(
                f"- ghost is {steps_[other]['median_ms'] / ghost_ms:.1f}x faster than "
                f"{other} (ratio of medians)"
            )
    if result.get("remat"):
        lines += ["", *_table(result["remat"])]
    lines += ["", "| ghost step (book-keeping), cumulative | median ms | stage ms |", "|---|---:|---:|"]
    prev = 0.0
    for name, ms in result["stages"].items():
        lines.append(f"| {name} | {ms:.2f} | {ms - prev:+.2f} |")
        prev = ms
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    parser.add_argument(
        "--remat", default="full", help="also compare under this remat policy (transformer); '' to skip"
    )
    parser.add_argument(
        "--single-thread", action="store_true", help="one XLA CPU thread, timed by process CPU time"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    global CLOCK
    if args.single_thread:
        CLOCK = time.process_time
    print(
        f"jax {jax.__version__} on {jax.devices()[0].platform}, {args.rounds} rounds, "
        f"{'single-thread CPU time' if args.single_thread else 'wall time'}",
        flush=True,
    )
    results = []
    for workload in [args.only] if args.only else list(WORKLOADS):
        results.append(bench(workload, args.rounds, args.remat or None))
        print(report(results[-1]) + "\n", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
