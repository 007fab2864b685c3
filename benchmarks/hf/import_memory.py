"""Importing a random checkpoint of GPT-2 small's shapes (124M parameters, float32): wall
time and peak RSS of ``zoo import`` against the checkpoint's bytes, next to the peak RSS of a
process that imports the same modules and reads the config (the floor the import pays before
its first tensor).

    .venv/bin/python benchmarks/hf/import_memory.py [--dir /tmp/zoo-gpt2-124m]

The checkpoint is written here with NumPy (not committed): the keys, shapes and config of
``save_pretrained`` of ``GPT2LMHeadModel(GPT2Config())``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

V, T, D, L, F = 50257, 1024, 768, 12, 3072


def write_checkpoint(out: Path) -> int:
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    out.mkdir(parents=True, exist_ok=True)
    shapes = {"transformer.wte.weight": (V, D), "transformer.wpe.weight": (T, D)}
    for i in range(L):
        h = f"transformer.h.{i}."
        shapes |= {
            h + "ln_1.weight": (D,), h + "ln_1.bias": (D,),
            h + "attn.c_attn.weight": (D, 3 * D), h + "attn.c_attn.bias": (3 * D,),
            h + "attn.c_proj.weight": (D, D), h + "attn.c_proj.bias": (D,),
            h + "ln_2.weight": (D,), h + "ln_2.bias": (D,),
            h + "mlp.c_fc.weight": (D, F), h + "mlp.c_fc.bias": (F,),
            h + "mlp.c_proj.weight": (F, D), h + "mlp.c_proj.bias": (D,),
        }  # fmt: skip
    shapes |= {"transformer.ln_f.weight": (D,), "transformer.ln_f.bias": (D,)}
    tensors = {k: (0.02 * rng.standard_normal(s, dtype=np.float32)) for k, s in shapes.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "model_type": "gpt2",
        "vocab_size": V,
        "n_positions": T,
        "n_embd": D,
        "n_layer": L,
        "n_head": 12,
    }
    (out / "config.json").write_text(json.dumps(config))
    return sum(int(t.size) for t in tensors.values())


def child(code: str) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of a fresh interpreter running ``code``."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode:
        raise SystemExit(proc.stderr)
    rss = int(proc.stdout.strip().splitlines()[-1])
    return wall, rss


# VmHWM, not ru_maxrss: Linux carries ru_maxrss across fork and exec, so a child would report
# this parent's peak (it holds the checkpoint it just wrote).
PEAK = "print([int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith('VmHWM')][0])"


# What `zoo import` loads before its first tensor: zoo.train.hf, the checkpoint module it
# imports (orbax, tensorstore, the model registry: about 180 MiB) and the CPU client.
IMPORTS = "import jax, zoo.train.hf, zoo.train.checkpoint; jax.devices()"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", default="/tmp/zoo-gpt2-124m")
    args = parser.parse_args()
    src = Path(args.dir)
    count = write_checkpoint(src / "hf")
    size = (src / "hf" / "model.safetensors").stat().st_size
    rows = []
    floor = child(
        f"{IMPORTS}; from zoo.models import hf_io, canonical; "
        f"canonical.canonical_shapes(hf_io.read_config({str(src / 'hf')!r})[0]); {PEAK}"
    )
    rows.append(("imports + config, no tensors (floor)", *floor))
    load = child(f"{IMPORTS}; from zoo.models import hf_io; cfg, p = hf_io.load({str(src / 'hf')!r}); {PEAK}")
    rows.append(("hf_io.load (canonical NumPy tree)", *load))
    shutil.rmtree(src / "zoo", ignore_errors=True)
    code = (
        "from zoo.train.hf import import_checkpoint; "
        f"import_checkpoint({str(src / 'hf')!r}, {str(src / 'zoo')!r}); {PEAK}"
    )
    rows.append(("zoo import (to a zoo checkpoint)", *child(code)))
    # the same write with the params compressed (zstd, orbax's default): the cause of the excess
    shutil.rmtree(src / "zoo", ignore_errors=True)
    zstd = (
        "import jax; from zoo.models import hf_io; from zoo.models.paths import flat_by_path, nest_by_path; "
        f"from zoo.train import checkpoint; cfg, p = hf_io.load({str(src / 'hf')!r}); f = flat_by_path(p); del p; "
        "p = nest_by_path({k: jax.device_put(f.pop(k)) for k in list(f)}); "
        f"checkpoint.save({str(src / 'zoo')!r}, 0, None, p, {{}}, compress=True); {PEAK}"
    )
    rows.append(("same write, params zstd-compressed", *child(zstd)))
    shutil.rmtree(src / "zoo", ignore_errors=True)
    rows.append(("imports of zoo.train.hf only", *child(f"import zoo.train.hf; {PEAK}")))
    print(f"checkpoint: {count:,} parameters, {size / 2**20:.1f} MiB")
    print(f"{'what':<36} {'wall s':>7} {'peak RSS MiB':>13} {'/ ckpt':>7} {'(RSS - floor) / ckpt':>21}")
    for what, wall, rss in rows:
        print(
            f"{what:<36} {wall:>7.1f} {rss / 2**20:>13.0f} {rss / size:>7.2f} {(rss - floor[1]) / size:>21.2f}"
        )


if __name__ == "__main__":
    main()
