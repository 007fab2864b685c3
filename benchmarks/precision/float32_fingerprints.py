"""Fingerprints of short float32 runs, to check that a change leaves the float32 program as it was.

Three AdamW steps on every registered kind (its small config at L=2) in both backends, with DP
(ghost and vmap clipping) and with chunked attention: the losses and a sha256 of the params.
Run it under two trees and compare the JSON files (bitwise: the same program on the same
machine gives the same bits)::

    PYTHONPATH=/path/to/before .venv/bin/python benchmarks/precision/float32_fingerprints.py before.json
    .venv/bin/python benchmarks/precision/float32_fingerprints.py after.json
    .venv/bin/python benchmarks/precision/float32_fingerprints.py --compare before.json after.json
"""

from __future__ import annotations

import hashlib
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax

import zoo
from zoo.dp.plan import fixed_batch_plan
from zoo.models import registry
from zoo.train import stages
from zoo.train.engine import GradientSettings, make_engine


def digest(tree) -> str:
    h = hashlib.sha256()
    for leaf in jax.tree_util.tree_leaves(tree):
        h.update(np.asarray(leaf).tobytes())
    return h.hexdigest()[:16]


def cases():
    for kind in registry.kinds():
        cfg = zoo.get_config(kind.small, num_layers=2)
        for backend in ("nnx", "eqx"):
            yield f"{kind.name}-{backend}", cfg, backend, None
        yield f"{kind.name}-ghost", cfg, "nnx", "ghost"
        yield f"{kind.name}-vmap", cfg, "nnx", "vmap"
        if getattr(cfg, "attention", None):
            chunked = zoo.get_config(cfg, attention="chunked", attention_chunk=4)
            yield f"{kind.name}-chunked", chunked, "nnx", None


def fingerprint(cfg, backend: str, clipping: str | None) -> dict:
    start = stages.config_start(cfg, seed=0)  # the run stages' model start and engine
    plan = fixed_batch_plan(4, noise_multiplier=1.0, clip_norm=1.0, clipping=clipping) if clipping else None
    engine = make_engine(start, GradientSettings(backend, optax.adamw(1e-2)), dp=plan)
    state, frozen = engine.init_state(start.params, 0, jax.random.key(5))
    x = zoo.example_batch(cfg, 4, seed=2, seq_len=8 if cfg.max_len else None)
    batch = {"x": x, "y": zoo.example_labels(cfg, x), "mask": jnp.ones((4,), jnp.float32)}
    losses = []
    for _ in range(3):
        state, metrics = engine.train_step(state, frozen, batch)
        losses.append(repr(float(metrics["loss"])))
    return {"params": digest(state.params), "loss": losses}


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--compare"]:
        a, b = (json.load(open(p)) for p in argv[1:3])
        differ = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        print(f"{len(a)} and {len(b)} runs; {'identical' if not differ else 'differ: ' + ', '.join(differ)}")
        return 1 if differ else 0
    out = {}
    for name, cfg, backend, clipping in cases():
        out[name] = fingerprint(cfg, backend, clipping)
        print(name, out[name], flush=True)
    with open(argv[0], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
