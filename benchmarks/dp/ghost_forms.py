"""The two norm forms of a dense op (``zoo.dp.ghost.rules.Dense``), Gram and materialised,
side by side in one process at few positions, and the form ``dense_method`` picks.

A record's dense op on a sequence of T tokens has T positions; a user's op on ``k`` single-row
records (``dp.unit = "user"``) has ``k``. Each cell times the rule's norms and its clipped
sum (``sq()`` and ``grad()``) on ``--rows`` rows cut into examples of ``positions`` rows, in
interleaved rounds (``zoo.bench.common.time_in_rounds``); the figure is the median of the
per-round ratios materialised / Gram::

    .venv/bin/python benchmarks/dp/ghost_forms.py [--rows 5000] [--rounds 9]
"""

from __future__ import annotations

import argparse
import json
import statistics

import jax
import jax.numpy as jnp

from zoo.bench.common import call_stepper, median_ratio, time_in_rounds
from zoo.dp.ghost.rules import Dense, dense_method

POSITIONS = (2, 4, 8, 16, 32, 64)
SHAPES = ((64, 2), (32, 32), (64, 64), (256, 64))  # (d_in, d_out)


def form_stepper(a, d, form: str):
    """A stepper of one form's norms and clipped sum on ``a`` [B, T, d_in], ``d`` [B, T, d_out]."""
    weights, use = jnp.ones(a.shape[0]), jnp.ones(a.shape[0], bool)

    def norms_and_sum(a, d):
        rule = Dense(a, d, ("w", "b"), force=form)
        return rule.sq(), rule.grad(weights, use)

    return call_stepper(jax.jit(norms_and_sum).lower(a, d).compile(), a, d)


def cell(positions: int, d_in: int, d_out: int, rows: int, rounds: int) -> dict:
    examples = max(rows // positions, 1)
    key_a, key_d = jax.random.split(jax.random.key(0))
    a = jax.random.normal(key_a, (examples, positions, d_in))
    d = jax.random.normal(key_d, (examples, positions, d_out))
    steppers = {form: form_stepper(a, d, form) for form in ("gram", "materialise")}
    times = time_in_rounds(steppers, rounds, 5)
    return {
        "positions": positions,
        "d_in": d_in,
        "d_out": d_out,
        "examples": examples,
        "gram_ms": round(1e3 * statistics.median(times["gram"]), 3),
        "materialise_ms": round(1e3 * statistics.median(times["materialise"]), 3),
        "materialise_over_gram": round(median_ratio(times["materialise"], times["gram"]), 2),
        "fewer_flops": "materialise" if d_in * d_out <= positions * (d_in + d_out) else "gram",
        "picked": dense_method(positions, d_in, d_out),
        "device": jax.devices()[0].device_kind,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=5000)
    p.add_argument("--rounds", type=int, default=9)
    args = p.parse_args(argv)
    print(
        "| positions | d_in x d_out | Gram ms | materialised ms | materialised / Gram | fewer flops | picked |"
    )
    print("|---|---|---|---|---|---|---|")
    for positions in POSITIONS:
        for d_in, d_out in SHAPES:
            row = cell(positions, d_in, d_out, args.rows, args.rounds)
            print(json.dumps(row), flush=True)
            print(
                f"| {positions} | {d_in} x {d_out} | {row['gram_ms']} | {row['materialise_ms']} | "
                f"{row['materialise_over_gram']} | {row['fewer_flops']} | {row['picked']} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
