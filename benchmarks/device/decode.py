"""Decoding on the chip against its HBM roofline: tokens/s of ``zoo.generate`` per model and batch.

    python benchmarks/device/decode.py                                   # gpt2-124m, llama-1b; batch 1, 64
    python benchmarks/device/decode.py --models gpt2-124m --batches 1 --prompt 512 --new 128
    python benchmarks/device/decode.py --small                           # a CPU, tiny
    python benchmarks/device/decode.py --hlo "$OUT/decode"               # + each row's decode program and op profile

Each row decodes ``--new`` tokens after prompts of ``--prompt`` random ids, greedy, with the
key/value cache: the prefill, then the decode loop, one compiled program each
(``zoo.generate``). The params are held in bf16 (what a decoding chip holds), under the bf16
precision policy. The decode time is the whole call's minus the prefill's, timed alone.

The roofline: a decode step must read every parameter once (the tied head reads the whole
token table) and each sequence's cache up to its length, so its time is at least those bytes
over the chip's HBM bandwidth (``--bandwidth``; default the chip's, ``zoo.train.throughput.chip``,
and 819 GB/s, a v5e's datasheet figure, where none is known). Tokens/s at the roofline is
the batch over that time, with the cache at its mean length over the decode (prompt + new/2).

``--hlo DIR`` also writes, per row, the compiled decode loop's text (``decode-MODEL-bB.txt.gz``)
and the operation profile of one decode call alone, prefill excluded
(``profile-decode-MODEL-bB.json``, :mod:`op_profile`), and prints its costliest operations.
``benchmarks/generate/decode_cost.py`` reads the same program's cost without a chip.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from zoo.generate import Model, Sampling, generate, loop
from zoo.models import canonical, decode
from zoo.models.registry import get_config
from zoo.train import throughput

V5E_HBM = 819e9  # bytes/s


def roofline(cfg, params, batch: int, prompt: int, new: int, bandwidth: float) -> dict:
    param_bytes = sum(math.prod(a.shape) * a.dtype.itemsize for a in jax.tree.leaves(params))
    spec = decode.cache_spec(cfg)
    per_slot = 2 * cfg.num_layers * spec.kv_heads(cfg) * spec.head_dim(cfg) * 2  # k and v, bf16
    cache_bytes = per_slot * (prompt + new / 2) * batch
    step_s = (param_bytes + cache_bytes) / bandwidth
    return {
        "param_bytes": param_bytes,
        "cache_bytes_read": cache_bytes,
        "roofline_tokens_per_s": batch / step_s,
    }


def dump(folder: str, name: str, batch: int, cfg, params, start, new: int, width: int) -> None:
    """The decode loop's compiled text and the op profile of one call of it; ``start()``
    makes a fresh prefilled state (a call takes its state over)."""
    import gzip

    import op_profile

    greedy, stops = Sampling(temperature=0.0), np.full(8, -1, np.int32)
    states = [start() for _ in range(2)]  # the warm-up call's and the traced call's

    def call():
        state = states.pop()
        jax.block_until_ready(
            loop.decode_steps(cfg, "nnx", greedy, params, state, np.int32(new), stops, width=width)
        )

    text = loop.decode_steps.lower(cfg, "nnx", greedy, params, states[0], np.int32(new), stops, width=width)
    text = text.compile().as_text()
    rows = op_profile.op_times(call, text, calls=1)
    Path(folder).mkdir(parents=True, exist_ok=True)
    with gzip.open(Path(folder) / f"decode-{name}-b{batch}.txt.gz", "wt") as f:
        f.write(text)
    Path(folder, f"profile-decode-{name}-b{batch}.json").write_text(json.dumps(rows, indent=1))
    print(f"\n{name} B {batch}: {sum(r['ms'] for r in rows):.1f} ms of operations per decode call\n")
    print(op_profile.top(rows, 12))


def row(name: str, cfg, batch: int, prompt: int, new: int, bandwidth: float, hlo: str = "") -> dict:
    params = jax.tree.map(lambda a: a.astype(jnp.bfloat16), canonical.init_params(cfg, 0))
    model = Model(cfg, "nnx", params, "bfloat16")
    rng = np.random.default_rng(0)
    prompts = [list(rng.integers(0, cfg.vocab_size, prompt)) for _ in range(batch)]
    generate(model, prompts, max_new_tokens=new, temperature=0)  # compiles both programs
    lengths = np.full(batch, prompt, np.int32)
    width = loop.bucket(prompt)
    lanes, dtype = decode.row_lanes(), model.in_compute()[1]  # the cache generate() makes
    static = dict(
        length=width + loop.bucket(new), new=loop.bucket(new), keep_logits=False, dtype=dtype, lanes=lanes
    )
    padded = np.zeros((batch, width), np.int32)
    prefill = loop.prefill(cfg, "nnx", params, padded, lengths, np.uint32(0), **static)
    jax.block_until_ready(prefill)
    start = time.perf_counter()
    jax.block_until_ready(loop.prefill(cfg, "nnx", params, padded, lengths, np.uint32(0), **static))
    prefill_s = time.perf_counter() - start
    start = time.perf_counter()
    out = generate(model, prompts, max_new_tokens=new, temperature=0)
    total_s = time.perf_counter() - start
    made = sum(len(t) for t in out.tokens)
    if hlo:
        start = functools.partial(loop.prefill, cfg, "nnx", params, padded, lengths, np.uint32(0), **static)
        dump(hlo, name, batch, cfg, params, start, new, width)
    decode_s = max(total_s - prefill_s, 1e-9)
    roof = roofline(cfg, params, batch, prompt, new, bandwidth)
    rate = made / decode_s
    return {
        "model": name,
        "batch": batch,
        "prompt": prompt,
        "new": new,
        "tokens": made,
        "prefill_s": prefill_s,
        "decode_s": decode_s,
        "decode_tokens_per_s": rate,
        **roof,
        "of_roofline": rate / roof["roofline_tokens_per_s"],
    }


def table(rows: list[dict]) -> str:
    lines = [
        f"decode on {jax.devices()[0].device_kind}, jax {jax.__version__}",
        "",
        "| model | batch | prompt + new | decode tokens/s | roofline tokens/s | of roofline | prefill s | params MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['prompt']} + {r['new']} | {r['decode_tokens_per_s']:,.0f} "
            f"| {r['roofline_tokens_per_s']:,.0f} | {100 * r['of_roofline']:.0f}% | {r['prefill_s']:.3f} "
            f"| {r['param_bytes'] / 1e6:,.0f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="gpt2-124m,llama-1b")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new", type=int, default=128)
    parser.add_argument("--bandwidth", type=float, default=0, help="HBM bytes/s (default: the chip's)")
    parser.add_argument("--json", default="")
    parser.add_argument("--small", action="store_true", help="a CPU: a tiny GPT-2 shape, batch 1 and 2")
    parser.add_argument("--hlo", default="", help="a folder for each row's decode program and its op profile")
    args = parser.parse_args(argv)
    chip = throughput.chip()  # get_tpu_info's bandwidth on a TPU; a v5e's where none is known
    args.bandwidth = args.bandwidth or (chip.bandwidth if chip else V5E_HBM)
    models = {name: get_config(name) for name in args.models.split(",")}
    batches = [int(b) for b in args.batches.split(",")]
    if args.small:
        models = {"gpt2-small-test": get_config("gpt2-124m", d_model=64, num_heads=2, num_layers=2, d_ff=128)}
        batches, args.prompt, args.new = [1, 2], 16, 8
    rows = [
        row(n, cfg, b, args.prompt, args.new, args.bandwidth, args.hlo)
        for n, cfg in models.items()
        for b in batches
    ]
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
