"""What the DP noise costs per sampler (docs/dp-mechanisms.md, "The noise sampler").

Times :func:`zoo.dp.add_gaussian_noise` (jitted, per-leaf draws in the engine's order) on the
trainable parameters of a few presets, for every sampler in ``zoo.dp.noise.NOISE_PRNGS``. The
samplers run in interleaved rounds (``zoo.bench.common.time_in_rounds``); each figure is the median over rounds, and the ratio is the
median of per-round ratios to ``threefry2x32`` (JAX's default key). A ``copy`` row, the same
tree through ``x + 0``, shows the fixed cost of one call. The ``philox4x32 partitioned`` row
draws the same numbers through the twin in ``zoo/dp/philox.py``, which a program on a device
mesh uses (JAX's own lowering, ``lax.mulhi``, does not partition).

``--normals N`` times instead one flat draw of N float32 normals per sampler (``chip_normals``:
GPT-2 124M's count by default), the figure ``zoo.dp.noise.FASTEST`` is set from on a chip:

    .venv/bin/python benchmarks/dp/noise.py [--rounds 30] [--calls 20]
    python benchmarks/dp/noise.py --normals 124000000      # on the chip: median ms per sampler
"""

from __future__ import annotations

import argparse
import statistics

import jax

from zoo.bench.common import call_stepper, median_ratio, time_in_rounds
from zoo.dp.noise import NOISE_PRNGS, add_gaussian_noise, noise_key, resolve_noise_prng
from zoo.models import canonical
from zoo.models.registry import get_config

PRESETS = ("mlp-s", "mlp-m", "transformer-xs")
REFERENCE = "threefry2x32"
PARTITIONED = "philox4x32 partitioned"
COLUMNS = (*NOISE_PRNGS, PARTITIONED, "copy")


def samplers():
    fns = {
        name: jax.jit(
            lambda tree, key, name=name: add_gaussian_noise(
                tree, key, noise_multiplier=1.0, l2_clip_norm=1.0, prng=name
            )
        )
        for name in NOISE_PRNGS
    }
    fns[PARTITIONED] = jax.jit(
        lambda tree, key: add_gaussian_noise(
            tree, key, noise_multiplier=1.0, l2_clip_norm=1.0, prng="philox4x32", partitioned=True
        )
    )
    fns["copy"] = jax.jit(lambda tree, key: jax.tree.map(lambda x: x + 0.0, tree))
    return fns


def time_preset(preset: str, rounds: int, calls: int) -> dict:
    params = canonical.init_params(get_config(preset), 0)
    count = sum(x.size for x in jax.tree.leaves(params))
    key = jax.random.key(0)
    steppers = {name: call_stepper(fn, params, key) for name, fn in samplers().items()}
    times = time_in_rounds(steppers, rounds, calls)
    ref = times[REFERENCE]
    return {
        "preset": preset,
        "params": count,
        "leaves": len(jax.tree.leaves(params)),
        "rows": {
            name: {
                "ms": 1e3 * statistics.median(t),
                "ratio": median_ratio(t, ref),
            }
            for name, t in times.items()
        },
    }


GPT2_124M = 124_439_808  # gpt2-124m's parameters: the normals a DP step of it draws


def chip_normals(count: int = GPT2_124M, rounds: int = 10, calls: int = 5) -> dict:
    """``{sampler: median ms}`` of one jitted draw of ``count`` float32 normals, from the noise
    key of one step (:func:`zoo.dp.noise.noise_key`), for every sampler in interleaved rounds;
    with the platform's ``auto`` choice. What the noise of a step costs at its fewest leaves."""
    key = jax.random.key(0)
    draws = {
        name: jax.jit(lambda k, name=name: jax.random.normal(noise_key(k, name), (count,), jax.numpy.float32))
        for name in NOISE_PRNGS
    }
    times = time_in_rounds({name: call_stepper(fn, key) for name, fn in draws.items()}, rounds, calls)
    return {
        "platform": jax.devices()[0].platform,
        "count": count,
        "auto": resolve_noise_prng("auto"),
        "ms": {name: round(1e3 * statistics.median(t), 3) for name, t in times.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--calls", type=int, default=20, help="calls per round")
    parser.add_argument("--presets", default=",".join(PRESETS))
    parser.add_argument(
        "--normals", type=int, default=None, help="time one draw of this many normals instead"
    )
    args = parser.parse_args()
    if args.normals:
        r = chip_normals(args.normals, args.rounds, args.calls)
        print(
            f"{r['platform']}: {r['count']:,} float32 normals, median ms of {args.rounds} rounds (auto = {r['auto']})"
        )
        for name, ms in sorted(r["ms"].items(), key=lambda item: item[1]):
            print(f"  {name:14s} {ms:9.3f} ms")
        return
    print(f"| preset (params, leaves) | {' | '.join(COLUMNS)} |")
    print("|---|" + "---:|" * len(COLUMNS))
    for preset in args.presets.split(","):
        r = time_preset(preset, args.rounds, args.calls)
        cells = [f"{r['rows'][n]['ms']:.3f} ms ({r['rows'][n]['ratio']:.2f}x)" for n in COLUMNS]
        print(f"| {preset} ({r['params']:,}, {r['leaves']}) | {' | '.join(cells)} |")
    print(
        f"\n{jax.devices()[0].platform}; median of {args.rounds} rounds of {args.calls} calls; "
        f"(ratio) = median per-round ratio to {REFERENCE}"
    )


if __name__ == "__main__":
    main()
