"""Where a ghost-clipped DP step's time goes, part by part, beside the non-private step.

    .venv/bin/python benchmarks/dp/ghost_profile.py                        # mnist-cnn-dp, B=512
    .venv/bin/python benchmarks/dp/ghost_profile.py --workload mlp-s --rounds 60
    .venv/bin/python benchmarks/dp/ghost_profile.py --clock cpu            # process CPU time
    .venv/bin/python benchmarks/dp/ghost_profile.py --ops 25               # + XLA's per-op profile

Every row is a jitted program on the same params and batch, timed in interleaved rounds in one
process (each row one untimed call, then one timed call, per round); the table gives the
median time and the median over rounds of the row's time over the non-private step's, with
its quartiles. ``--clock cpu`` times the process's CPU time (all of XLA's threads) instead of
the wall clock: on a machine shared with other jobs it moves much less from round to round.

* ``non-private step`` and ``ghost step``: the engine's train steps (``zoo bench dp``'s rows):
  gradient, (clipping, noise,) SGD with momentum.
* The book-keeping ghost step cut into prefixes, each reduced to one scalar so that all of its
  work is done: ``forward`` (the model alone), ``+ backward with norms`` (``tap_pass``: one
  activation backward whose taps take every op's norms; nothing kept), ``+ kept pieces`` (the
  same pass handing out what the clipped sum needs), ``+ clip factors``, ``+ clipped sum``
  (``kept_sum``), ``+ noise`` (``privatize``). The step minus the last prefix is the update. Differences of medians are the parts' costs (noisy when small). Beside them, the
  other method's clipped sum and noise (``method="backward"``: norm taps in one backward pass,
  then a second forward and backward of the weighted loss).
* Per site, each alone on inputs computed beforehand: ``norm SITE`` (the rule built from the
  op's input and output gradient, and its squared norms), ``sum SITE`` (its share of the
  clipped sum, from the built rule) and ``weight gradient SITE`` (the op's plain weight
  gradient, what the non-private step's backward computes for it: the yardstick of the two).

``--ops N`` adds XLA's own per-operation profile of the two steps (``jax.profiler``): the N
operations with the most time, summed over XLA's CPU threads and divided by the calls.
"""

from __future__ import annotations

import argparse
import collections
import glob
import re
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

from zoo import recipes
from zoo.api import example_batch, example_labels
from zoo.bench.common import call_stepper, ratio_spread, state_stepper, time_in_rounds
from zoo.bench.dp import GHOST, compile_step, fresh_state, setup_for
from zoo.bench.dp_rows import BASELINE, CLIP, SIGMA, methods
from zoo.dp import ClipRequest, ghost, privatize
from zoo.dp.ghost.rules import RULES
from zoo.losses import per_example_loss
from zoo.models.registry import get_config
from zoo.train import stages

PRESETS = {"mlp-s": 256}  # workloads that are a preset at a batch size; the rest are DP recipes


def workload(name: str):
    """``(model config, batch)``: a DP recipe's model fitted to its data at its expected batch,
    or a preset of :data:`PRESETS`. A recipe's DP-PCA projection (``data.dp_pca``) is left out:
    the model reads the raw features (``mnist_cost.py`` times it with the frozen projection)."""
    if name in PRESETS:
        return get_config(name), PRESETS[name]
    recipe = recipes.load_recipe(name)
    raw = recipes.override(recipe, {"data": {"dp_pca": None}, "dp": {"pca_epsilon": None}})
    start = stages.model_start(raw, stages.load_data(raw))  # zoo train's first two stages
    return start.cfg, recipe.dp.expected_batch_size


def _total(tree) -> jax.Array:
    """One scalar that depends on every leaf: the work is done, nothing large is copied out."""
    return sum(jnp.sum(jnp.asarray(leaf, jnp.float32)) for leaf in jax.tree.leaves(tree))


def prefixes(cfg, shape):
    """The book-keeping ghost step's prefixes: ``name -> fn(params, x, y, mask, key) -> scalar``
    for inputs ``x`` of ``shape``. Everything is an argument, as in the engine's step (a
    constant batch would let XLA fold whatever depends on the data alone)."""
    gp = ghost.prepare(cfg, jax.ShapeDtypeStruct(shape, jnp.float32))

    def forward(p, x, y, mask, key):
        return _total(per_example_loss(ghost.ghost_forward(cfg, p, x)[0], y))

    def norms(p, x, y, mask, key):
        losses, sq, _ = ghost.tap_pass(gp, p, x, y)
        return _total((losses, sq))

    def kept(p, x, y, mask, key, total=True):
        losses, sq, pieces = ghost.tap_pass(gp, p, x, y, sums=True)
        factors = ghost.clip_factors(sq, mask > 0, CLIP)
        return _total((losses, pieces.out)) if total else (factors, pieces)

    def factored(p, x, y, mask, key):
        return _total(kept(p, x, y, mask, key, total=False)[0])

    def clipped(p, x, y, mask, key):
        (_, weights, use), pieces = kept(p, x, y, mask, key, total=False)
        return ghost.kept_sum(gp, p, pieces, weights, use)

    def noised(p, x, y, mask, key):
        return privatize(
            clipped(p, x, y, mask, key),
            key,
            noise_multiplier=SIGMA,
            l2_clip_norm=CLIP,
            expected_batch_size=x.shape[0],
        )

    def second_backward(p, x, y, mask, key):
        grads = ghost.ghost_clipped_grad_sum(
            cfg, p, x, y, ClipRequest(CLIP, example_mask=mask), method="backward"
        )
        return _total(
            privatize(
                grads[0], key, noise_multiplier=SIGMA, l2_clip_norm=CLIP, expected_batch_size=x.shape[0]
            )
        )

    return {
        "second backward instead (taps, then a weighted backward; + noise)": second_backward,
        "forward": forward,
        "+ backward with norms": norms,
        "+ kept pieces": kept,
        "+ clip factors": factored,
        "+ clipped sum": lambda *a: _total(clipped(*a)),
        "+ noise": lambda *a: _total(noised(*a)),
    }


def site_parts(cfg, params, x, y):
    """``name -> (fn, args)`` for each top-level site's norm and clipped sum, alone, and its
    plain weight gradient (``sum_i a_i^T delta_i``, by the Gram form's contraction: what a
    non-private backward computes for the op)."""
    gp = ghost.prepare(cfg, x)
    _, caps, deltas = jax.jit(lambda p, x, y: ghost.probe_pass(gp, p, x, y))(params, x, y)
    weights = jnp.full((x.shape[0],), 0.5, jnp.float32)
    use = jnp.ones((x.shape[0],), bool)
    parts = {}
    for site in gp.active:
        if site.stacked:
            continue  # the stack's sites take their norms in the scan's backward

        def norm(a, d, s=site):
            return _total(RULES[s.kind](a, d, s.leaves, s.rows).sq())

        def summed(rule):
            return _total(rule.grad(weights, use))

        def plain(a, d, s=site):
            return _total(RULES[s.kind](a, d, s.leaves, s.rows, "gram").grad(jnp.ones_like(weights), use))

        a, d = caps.get(site.key), deltas[site.key]
        rule = jax.jit(lambda a, d, s=site: RULES[s.kind](a, d, s.leaves, s.rows))(a, d)
        method = rule.static[0] if isinstance(rule.static, tuple) and rule.static else ""
        label = f"{site.key} ({site.kind}{', ' + method if isinstance(method, str) and method else ''})"
        parts[f"norm {label}"] = (norm, (a, d))
        parts[f"sum {label}"] = (summed, (rule,))
        parts[f"weight gradient {site.key}"] = (plain, (a, d))
    return parts


def measure(cfg, batch: int, rounds: int, ops: int, clock: str = "wall") -> dict:
    rows = methods()
    setup, params = setup_for(cfg, "nnx", batch, max(1, batch // 8), (), 0)
    x = example_batch(cfg, batch, seed=0)
    data = jax.device_put({"x": x, "y": example_labels(cfg, x), "mask": jnp.ones((batch,), jnp.float32)})
    steppers, compiled = {}, {}
    for name in (BASELINE, GHOST):
        step, optimizer = rows[name](setup)
        state, frozen = fresh_state(setup, params, optimizer, 0)
        compiled[name] = compile_step(step, state, frozen, data)
        run = {"state": state}
        steppers[f"{name} step"] = state_stepper(compiled[name], run, frozen, data)
    key = jax.random.key(0)
    args = (params, data["x"], data["y"], data["mask"], key)
    programs = {n: (f, args) for n, f in prefixes(cfg, data["x"].shape).items()}
    programs.update(site_parts(cfg, params, data["x"], data["y"]))
    for name, (fn, args) in programs.items():
        c = jax.jit(fn).lower(*args).compile()
        steppers[name] = call_stepper(c, *args)
    times = time_in_rounds(steppers, rounds, clock=CLOCKS[clock])
    base = times[f"{BASELINE} step"]
    spreads = {name: ratio_spread(ts, base) for name, ts in times.items()}
    table = {
        name: {
            "median_ms": 1e3 * statistics.median(ts),
            "ratio": spreads[name].median,
            "spread": (spreads[name].q1, spreads[name].q3),
        }
        for name, ts in times.items()
    }
    result = {"rows": table}
    if ops:
        result["ops"] = {name: op_profile(c, params, setup, data, name, ops) for name, c in compiled.items()}
    return result


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def op_profile(compiled, params, setup, data, name: str, top: int, calls: int = 5) -> list:
    """XLA's per-operation times of one compiled step: ``[(ms per call, op, shape, jax op)]``."""
    rows = methods()
    _, optimizer = rows[name](setup)
    state, frozen = fresh_state(setup, params, optimizer, 0)
    meta = {}
    for line in compiled.as_text().splitlines():
        m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ", line)
        if m:
            op = re.search(r'op_name="([^"]*)"', line)
            meta[m.group(1)] = (m.group(2), op.group(1) if op else "")
    for _ in range(2):
        state, out = compiled(state, frozen, data)
    jax.block_until_ready(out)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                state, out = compiled(state, frozen, data)
            jax.block_until_ready(out)
        trace = jax.profiler.ProfileData.from_file(glob.glob(f"{folder}/**/*.xplane.pb", recursive=True)[0])
    spent = collections.Counter()
    for plane in trace.planes:
        for line in plane.lines:
            if line.name.startswith("tf_XLAEigen"):  # XLA's CPU worker threads
                for event in line.events:
                    if not event.name.startswith(("ThunkExecutor", "SlinkyThreadPool")):
                        spent[event.name] += event.duration_ns
    return [(ns / calls / 1e6, op, *meta.get(op, ("?", "?"))) for op, ns in spent.most_common(top)] + [
        (sum(spent.values()) / calls / 1e6, "(all operations)", "", "")
    ]


def report(title: str, result: dict) -> str:
    lines = [
        f"### {title}, jax {jax.__version__} on {jax.devices()[0].platform}",
        "",
        "| part | median ms | part ms | / non-private step (quartiles) |",
        "|---|---:|---:|---:|",
    ]
    prev = 0.0
    for row, t in result["rows"].items():
        stage = row.startswith(("forward", "+ "))  # the prefixes, in order
        part = f"{t['median_ms'] - prev:+.2f}" if stage and row != "forward" else ""
        prev = t["median_ms"] if stage else prev
        lo, hi = t["spread"]
        lines.append(f"| {row} | {t['median_ms']:.2f} | {part} | {t['ratio']:.3f} ({lo:.3f}-{hi:.3f}) |")
    for step, ops in result.get("ops", {}).items():
        lines += ["", f"XLA operations of the {step} step (ms per call, summed over CPU threads):", ""]
        lines += [f"    {ms:8.2f}  {op:<36} {shape:<34} {jop[-70:]}" for ms, op, shape, jop in ops]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="mnist-cnn-dp", help=f"a DP recipe or one of {sorted(PRESETS)}")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or the process's CPU time (all threads): steadier on a loaded machine",
    )
    parser.add_argument("--ops", type=int, default=0, help="also print XLA's N costliest operations per step")
    args = parser.parse_args(argv)
    cfg, batch = workload(args.workload)
    result = measure(cfg, batch, args.rounds, args.ops, args.clock)
    print(
        report(f"{args.workload} (B={batch}), {args.rounds} rounds, {args.clock} clock", result), flush=True
    )


if __name__ == "__main__":
    main()
