"""benchmarks/generate/decode_cost.py on the CPU, and benchmarks/device/decode.py --hlo at --small:
a decode step's cost counts the layer loop once per layer, the cache layout read is the one the
loop carries, and the chip's call leaves the decode program and its op profile behind. Figures
are not asserted: they live in the benchmarks' output."""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from zoo.models import canonical, decode
from zoo.models.registry import get_config

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "generate" / "decode_cost.py"


def load():
    spec = importlib.util.spec_from_file_location("decode_cost", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_reads_every_layers_weights_and_the_whole_cache():
    cost = load()
    cfg = get_config("gpt2-124m", d_model=64, num_heads=2, num_layers=4, d_ff=256, vocab_size=64, max_len=64)
    text = cost.compile_decode(cfg, 2, 16, 16, jax.devices("cpu")[0], "float32").as_text()
    step = cost.step_cost(text, cfg.num_layers)
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    params = sum(math.prod(a.shape) * 4 for a in jax.tree.leaves(shapes))
    cache = 2 * decode.cache_bytes(cfg, 32, "float32")  # two sequences, 16 + 16 slots each
    assert step["bytes accessed"] >= params + cache
    assert step["flops"] > 0
    shape = decode.cache_shape(cfg, 2, 32, decode.row_lanes("cpu"))
    assert shape == (4, 2, 2, 32, 32)  # one 32-wide head to a row off a TPU
    layout = cost.cache_layout(text, shape)
    assert layout["cache_layout"].startswith("f32[4,2,2,32,32]")
    assert layout["cache_tiles_over_bytes"] == layout["write_tiles_over_bytes"] == 1.0  # a CPU has no tiles
    assert layout["copy_bytes"] == 0


def test_tiles_count_their_padding():
    cost = load()
    plain = 2 * 12 * 64 * 12 * 640 * 64
    assert cost._tiled_bytes("bf16[12,64,12,640,64]{4,3,2,1,0:T(8,128)(2,1)}") == (
        plain,
        2 * plain,
    )  # 64 of 128 lanes
    assert cost._tiled_bytes("bf16[12,64,12,640,64]{3,4,2,1,0:T(8,128)(2,1)}") == (
        plain,
        plain,
    )  # slots along the lanes
    update = "bf16[16,64,8,1,64]{3,4,2,1,0:T(8,128)(2,1)}"  # one slot of such a cache: 1 of 128 lanes
    assert cost._tiled_bytes(update) == (2 * 16 * 64 * 8 * 64, 128 * 2 * 16 * 64 * 8 * 64)


@pytest.mark.slow
def test_the_decode_benchmark_leaves_each_rows_program_and_profile(tmp_path):
    folder = tmp_path / "hlo"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "device" / "decode.py"), "--small", "--hlo", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for batch in (1, 2):
        with gzip.open(folder / f"decode-gpt2-small-test-b{batch}.txt.gz", "rt") as f:
            assert "HloModule jit_decode_steps" in f.read()
        rows = json.loads((folder / f"profile-decode-gpt2-small-test-b{batch}.json").read_text())
        assert all({"op", "opcode", "ms"} <= set(r) for r in rows)
    assert "ms of operations per decode call" in done.stdout
