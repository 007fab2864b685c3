"""Device bytes of a LoRA run's params and optimizer state, float32 against bfloat16.

The engine a LoRA run builds (the run stages' model start, adapters on a frozen base:
``zoo.bench.finetune.lora_start``, and engine: ``zoo.train.engine.make_engine``) is made under each precision policy (``zoo.precision``) and its state placed on the device:
the bytes of the trainable adapters, their AdamW state and the frozen base, as placed, and the
argument bytes XLA's ``memory_analysis()`` reports for the compiled step (the batch included).
``--base-dtype bfloat16`` starts from a bf16 base, as ``zoo import --dtype bfloat16`` gives::

    .venv/bin/python benchmarks/precision/lora_bytes.py --preset llama-s
    .venv/bin/python benchmarks/precision/lora_bytes.py --preset llama-s --base-dtype bfloat16
"""

from __future__ import annotations

import argparse
import json

import jax
import jax.numpy as jnp
import numpy as np

import zoo
from zoo.bench.common import memory_stats
from zoo.bench.finetune import lora_start
from zoo.configs import LoraConfig, OptimConfig
from zoo.models import canonical
from zoo.precision import PRECISIONS, Precision
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.state import make_optimizer

TARGETS = ("attn.q", "attn.v", "mlp.*")  # the python-docs-llama-lora and hf-lm-lora recipes'


def device_bytes(tree) -> int:
    return sum(a.nbytes for a in jax.tree.leaves(tree))


def measure(preset: str, base_dtype: str, rank: int, batch: int, seq: int) -> list[dict]:
    base_cfg = zoo.get_config(preset)
    base = jax.tree.map(lambda a: a.astype(base_dtype), canonical.init_params(base_cfg, 0))
    start = lora_start(base_cfg, base, LoraConfig(rank=rank, targets=TARGETS))
    x = zoo.example_batch(start.cfg, batch, seq_len=seq)
    place = {"x": x, "y": zoo.example_labels(start.cfg, x), "mask": np.ones((batch,), np.float32)}
    rows = []
    for precision in PRECISIONS:
        optimizer = make_optimizer(OptimConfig(lr=3e-3), 100)
        engine = make_engine(start, GradientSettings("nnx", optimizer, precision=Precision(precision)))
        state, frozen = engine.init_state(start.params, 0)
        compiled = engine.train_step.lower(state, frozen, place).compile()
        rows.append(
            {
                "precision": precision,
                "adapters": device_bytes(state.params),
                "optimizer_state": device_bytes(state.opt_state),
                "frozen_base": device_bytes(frozen),
                "frozen_dtypes": sorted({str(a.dtype) for a in jax.tree.leaves(frozen)}),
                "total": device_bytes((state.params, state.opt_state, frozen)),
                "step_argument_bytes": memory_stats(compiled)["argument_size_in_bytes"],
            }
        )
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="llama-s")
    parser.add_argument("--base-dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args.preset, jnp.dtype(args.base_dtype), args.rank, args.batch, args.seq)
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{args.preset}, LoRA rank {args.rank} on {', '.join(TARGETS)}, base stored {args.base_dtype}")
    print("| precision | adapters | AdamW state | frozen base | params + optimizer | step arguments |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        kib = {k: f"{r[k] / 2**10:,.1f} KiB" for k in ("adapters", "optimizer_state", "frozen_base", "total")}
        print(
            f"| {r['precision']} | {kib['adapters']} | {kib['optimizer_state']} | {kib['frozen_base']} "
            f"({'/'.join(r['frozen_dtypes'])}) | {kib['total']} | {r['step_argument_bytes'] / 2**10:,.1f} KiB |"
        )
    f32, bf16 = rows
    print(
        f"\nfrozen base bf16/float32: {bf16['frozen_base'] / f32['frozen_base']:.3f}; "
        f"params + optimizer: {bf16['total'] / f32['total']:.3f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
