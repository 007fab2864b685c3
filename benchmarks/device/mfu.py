"""zoo's training step against a plain-JAX step, side by side in one process: ms/step, MFU.

    python benchmarks/device/mfu.py                                  # a TPU: GPT-2 124M, T 1024
    python benchmarks/device/mfu.py --batch 8,16 --zoo splash:none,splash:dots --plain splash:none
    python benchmarks/device/mfu.py --profile zoo:splash:none:8,plain:splash:none:8 --top 30
    python benchmarks/device/mfu.py --small                          # a CPU, tiny (the test)
    python benchmarks/device/mfu.py --batch 16 --zoo dense:dots --plain sdpa:dots,xla:dots  # a GPU

Rows are ``zoo:ATTENTION:POLICY:BATCH`` (the step ``zoo train`` runs, ``zoo.bench.step``: the
recipe's AdamW after the global-norm clip, the remat policy over the scanned stack, the
precision policy) and ``plain:ATTENTION:POLICY:BATCH`` (``plain_step.py``: about a hundred
lines of JAX handed the same optax optimizer; ATTENTION ``xla``, ``splash`` or ``sdpa``
(``jax.nn.dot_product_attention``: cuDNN's fused attention on a GPU), POLICY
``none``, ``full`` or ``dots``). Every row of one batch size takes turns in the same rounds;
the rows of one program family share one state (each step donates it to the next), so the
chip holds two copies of the weights and optimizer state, not one per row.

Figures: the median ms/step over rounds, tokens/s, MFU (``devicekit.step_mfu``: zoo's one
FLOP count, ``zoo.train.throughput.step_flops``: 6 per matrix weight per token, the tied head
once, plus 12 L B T^2 d for the attention scores and values, the causal half not subtracted;
over the time and the chip's peak), XLA's compiled temp bytes, and the row's tokens/s over the
fastest plain row's at its batch (the plain splash step on a TPU, the cuDNN one on a GPU).
``--profile ROWS`` adds ``jax.profiler``'s per-operation time of those rows, added up by part
(``op_profile.py``), and ``--top N`` their N slowest operations.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import op_profile  # beside this script: its folder is sys.path[0]
import plain_step
from devicekit import footprint, step_mfu

from zoo.bench.common import memory_stats, time_in_rounds
from zoo.bench.step import compile_step, step_recipe
from zoo.models import canonical, splash
from zoo.models.registry import get_config


@dataclasses.dataclass(frozen=True)
class Row:
    family: str  # "zoo" or "plain"
    attention: str
    policy: str
    batch: int

    @property
    def name(self) -> str:
        return f"{self.family}:{self.attention}:{self.policy}:{self.batch}"


def parse_rows(family: str, text: str, batches: list[int]) -> list[Row]:
    rows = []
    for item in filter(None, text.split(",")):
        attention, policy = item.split(":")
        rows += [Row(family, attention, policy, b) for b in batches]
    return rows


def batch_of(cfg, batch: int, seq: int, seed: int = 0):
    x = jax.random.randint(jax.random.key(seed), (batch, seq), 0, cfg.vocab_size, jnp.int32)
    return x, jnp.roll(x, -1, axis=1)


def splash_fields(block: int, fused: bool) -> dict:
    """zoo's model settings for splash with every block ``block`` tokens and the ``fused``
    backward or not (``model.splash_*``: the plain step takes the same two)."""
    return {**{f"splash_{name}": block for name in splash.FIELDS}, "splash_fused_backward": fused}


def zoo_rows(cfg, rows: list[Row], seq: int, precision: str) -> dict:
    """Compiled zoo steps (from shapes) and one real state per batch size that they share."""
    built, states = {}, {}
    for row in rows:
        row_cfg = dataclasses.replace(cfg, attention=row.attention)
        x, y = batch_of(cfg, row.batch, seq)
        step = compile_step(row_cfg, x, y, remat=row.policy, precision=precision)
        if row.batch not in states:
            params = canonical.init_params(row_cfg, 0)
            state, frozen = step.engine.init_state(params, 0)
            batch = step.engine.place_batch({"x": x, "y": y, "mask": jnp.ones((row.batch,), jnp.float32)})
            states[row.batch] = {"state": state, "frozen": frozen, "batch": batch}
        shared = states[row.batch]

        def call(n, c=step.compiled, s=shared):
            for _ in range(n):
                s["state"], s["out"] = c(s["state"], s["frozen"], s["batch"])
            jax.block_until_ready((s["state"], s["out"]))

        built[row] = (call, step.compiled, step.compile_s)
    return built


def plain_rows(cfg, rows: list[Row], seq: int, precision: str, block: int, fused: bool) -> dict:
    optimizer = step_recipe_optimizer()
    built, states = {}, {}
    for row in rows:
        step = plain_step.make_step(
            optimizer, cfg.num_heads, row.attention, row.policy, block, jnp.dtype(precision), fused
        )
        x, y = batch_of(cfg, row.batch, seq)
        if row.batch not in states:
            params = plain_step.init(
                jax.random.key(0),
                cfg.vocab_size,
                cfg.d_model,
                cfg.num_layers,
                cfg.num_heads,
                cfg.d_ff,
                cfg.max_len,
            )
            states[row.batch] = {"params": params, "opt": optimizer.init(params), "x": x, "y": y}
        s = states[row.batch]
        tic = time.perf_counter()
        compiled = step.lower(s["params"], s["opt"], x, y).compile()
        compile_s = time.perf_counter() - tic

        def call(n, c=compiled, s=s):
            for _ in range(n):
                s["params"], s["opt"], s["out"] = c(s["params"], s["opt"], s["x"], s["y"])
            jax.block_until_ready((s["params"], s["out"]))

        built[row] = (call, compiled, compile_s)
    return built


def step_recipe_optimizer():
    """The optax optimizer ``zoo train``'s step uses by default (AdamW, global-norm clip)."""
    from zoo.train.state import make_optimizer

    recipe = step_recipe()
    return make_optimizer(recipe.optim, recipe.train.steps)


def measure(args) -> dict:
    overrides = {"vocab_size": args.vocab} if args.vocab else {}
    if args.vocab_multiple > 1:  # zoo's rows only: the model option (the plain step keeps its vocabulary)
        overrides["vocab_multiple"] = args.vocab_multiple
    cfg = get_config(args.preset, **overrides, **splash_fields(args.block, args.fused))
    seq = args.seq or cfg.max_len
    zoo_list = parse_rows("zoo", args.zoo, args.batch)
    plain_list = parse_rows("plain", args.plain, args.batch)
    built = {**plain_rows(cfg, plain_list, seq, args.precision, args.block, args.fused)}
    built.update(zoo_rows(cfg, zoo_list, seq, args.precision))
    result = {
        "device": jax.devices()[0].device_kind,
        "jax": jax.__version__,
        "preset": args.preset,
        "seq": seq,
        "vocab": cfg.vocab_size,
        "vocab_multiple": cfg.vocab_multiple,
        "block": args.block,
        "fused_backward": args.fused,
        "rows": [],
    }
    for b in args.batch:
        group = {row: v for row, v in built.items() if row.batch == b}
        times = time_in_rounds({row.name: v[0] for row, v in group.items()}, args.rounds, args.steps)
        for row, (_, compiled, compile_s) in group.items():
            ms = statistics.median(times[row.name]) * 1e3
            result["rows"].append(
                {
                    "row": row.name,
                    "ms": ms,
                    "tokens_per_s": b * seq / ms * 1e3,
                    "mfu": step_mfu(cfg, b, seq, ms / 1e3, args.precision),
                    "temp_mib": memory_stats(compiled)["temp_size_in_bytes"] / 2**20,
                    # The step's device footprint: what the HBM must hold for it (the process
                    # peak below leaves the compiled temp out on a TPU v5e with JAX 0.10.2).
                    "footprint_mib": footprint(compiled) / 2**20,
                    "compile_s": compile_s,
                }
            )
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:  # the runtime's peak over every row (not the temp: above)
        result["hbm_peak_gib"] = stats["peak_bytes_in_use"] / 2**30
        result["hbm_limit_gib"] = stats.get("bytes_limit", 0) / 2**30
    for wanted in filter(None, args.profile.split(",")):
        match = [(row, v) for row, v in built.items() if row.name == wanted]
        if match:
            row, (call, compiled, _) = match[0]
            result.setdefault("profiles", {})[wanted] = op_profile.op_times(
                lambda c=call: c(1), compiled.as_text()
            )
    return result


def table(result: dict) -> str:
    lines = [
        f"{result['preset']} T={result['seq']} vocab={result['vocab']} splash block={result['block']} "
        f"{', fused backward' if result['fused_backward'] else ''} on {result['device']}, jax {result['jax']}"
        + (f"; HBM peak of the process {result['hbm_peak_gib']:.2f} GiB" if "hbm_peak_gib" in result else ""),
        "",
        "| row | ms/step | MFU | tokens/s | temp MiB | x fastest plain (tokens/s) | compile s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        batch = r["row"].rsplit(":", 1)[1]
        base = [o for o in result["rows"] if o["row"].startswith("plain:") and o["row"].endswith(f":{batch}")]
        best = max((o["tokens_per_s"] for o in base), default=None)
        ratio = f"{r['tokens_per_s'] / best:.2f}" if best else "n/a"
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        lines.append(
            f"| {r['row']} | {r['ms']:.2f} | {mfu} | {r['tokens_per_s']:,.0f} | {r['temp_mib']:,.0f} "
            f"| {ratio} | {r['compile_s']:.1f} |"
        )
    profiles = result.get("profiles", {})
    if profiles:
        lines += ["", "Per-operation profile (ms per step, by part):", "", op_profile.compare(profiles)]
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="gpt2-124m")
    parser.add_argument(
        "--seq", type=int, default=0, help="tokens per sequence (default: the preset's context)"
    )
    parser.add_argument("--batch", default="8", help="comma-separated batch sizes")
    parser.add_argument("--zoo", default="splash:none,splash:full,dense:full", help="ATTENTION:POLICY,...")
    parser.add_argument("--plain", default="xla:full,splash:full,splash:none", help="ATTENTION:POLICY,...")
    parser.add_argument("--precision", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--vocab", type=int, default=0, help="override the vocabulary (e.g. 50304)")
    parser.add_argument("--vocab-multiple", type=int, default=1, help="zoo's model.vocab_multiple (e.g. 128)")
    parser.add_argument(
        "--block", type=int, default=splash.SplashBlocks().block_q, help="splash block size (both steps)"
    )
    parser.add_argument("--fused", action="store_true", help="splash's fused backward kernel (both steps)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per round")
    parser.add_argument("--profile", default="", help="rows to profile, comma-separated")
    parser.add_argument("--top", type=int, default=0, help="print each profiled row's N slowest ops")
    parser.add_argument("--json", default="", help="write every figure here")
    parser.add_argument("--small", action="store_true", help="a CPU: a 2-layer d=128 model at T=128, batch 2")
    args = parser.parse_args(argv)
    args.batch = [int(b) for b in args.batch.split(",")]
    if args.small:
        args.preset, args.seq, args.batch, args.rounds, args.steps = "gpt2-124m", 128, [2], 1, 1
        args.small_overrides = True
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if getattr(args, "small_overrides", False):
        import zoo.models.registry as registry

        small = dataclasses.replace(
            registry.PRESETS["gpt2-124m"],
            d_model=128,
            num_heads=2,
            num_layers=2,
            d_ff=256,
            vocab_size=512,
            max_len=128,
        )
        registry.PRESETS["mfu-small"] = small
        args.preset = "mfu-small"
    result = measure(args)
    print(table(result))
    for name, rows in result.get("profiles", {}).items():
        if args.top:
            print(f"\n{name}: the {args.top} slowest operations\n\n{op_profile.top(rows, args.top)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
