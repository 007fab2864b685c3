"""The peak memory of a training run on a token store does not grow with the store.

One subprocess trains the same tiny LM on a store of 64K tokens and on one of 128M tokens (256
MB of uint16 ids), after a first run that warms the process up. Before each run the kernel's
peak-RSS mark is reset (``/proc/self/clear_refs``); a run's peak is how far it rose above the
RSS it started from. The small and the large store's peaks must agree within ``MARGIN_KB``
(the runs of one process differ by a few tens of MB, whatever their data: the allocator). The
same measurement on the large store with a planted bug, its ids read into memory as int32 (what
the in-memory path holds), must exceed it: the metric sees a loader that reads the store whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from zoo.data.tokenizer import CharTokenizer
from zoo.data.tokens.writer import StoreWriter

MARGIN_KB = 100 * 1024  # the large store is 256 MB on disk, 512 MB as int32 in memory
SMALL, LARGE = 1 << 16, 1 << 27  # tokens
CHUNK = 1 << 23

RUNS = """
import dataclasses, json, sys
from pathlib import Path
import numpy as np
from zoo import recipes
from zoo.commands import settings
from zoo.data.forms import tokens as form
from zoo.train.loop import train_recipe

TINY = {"model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64, "model.max_len": 16,
        "data.seq_len": 16, "train.steps": 1, "train.batch_size": 8, "train.eval_batches": 1}
opened = form.open_store

def planted(root):  # the bug: the ids read whole, into memory
    store = opened(root)
    return dataclasses.replace(store, train=np.array(store.train, np.int32), eval=np.array(store.eval, np.int32))

def status_kb(field):
    line = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field)][0]
    return int(line.split()[1])

peaks = {}
for name, root, bug in json.loads(sys.argv[1]):
    form.open_store = planted if bug else opened
    recipe = settings.with_values(recipes.load_recipe("python-docs-lm"), {**TINY, "data.dataset": f"tokens:{root}"})
    Path("/proc/self/clear_refs").write_text("5")  # the peak mark starts again at the current RSS
    before = status_kb("VmRSS")
    train_recipe(recipe, Path(root).parent / f"run-{name}", show_progress=False)
    peaks[name] = status_kb("VmHWM") - before
print(json.dumps(peaks))
"""


def random_store(out: Path, tokens: int) -> Path:
    rng = np.random.default_rng(0)
    with StoreWriter(out, CharTokenizer.utf8_bytes(), "bytes", separator="\n", about={}) as writer:
        for split, count in (("train", tokens), ("eval", max(tokens // 64, 1024))):
            for begin in range(0, count, CHUNK):
                ids = rng.integers(1, 257, min(CHUNK, count - begin), dtype=np.int64)
                writer.add(split, ids, starts_document=begin == 0)
        return writer.finish()


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux's /proc/self/clear_refs")
def test_peak_rss_of_a_run_does_not_grow_with_the_store(tmp_path):
    small, large = random_store(tmp_path / "small", SMALL), random_store(tmp_path / "large", LARGE)
    runs = [("warm-up", str(small), False), ("small", str(small), False)]
    runs += [("large", str(large), False), ("planted", str(large), True)]
    fast = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0",
    }
    done = subprocess.run(
        [sys.executable, "-c", RUNS, json.dumps(runs)], capture_output=True, text=True, timeout=300, env=fast
    )
    assert done.returncode == 0, done.stderr[-3000:]
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    assert abs(peaks["large"] - peaks["small"]) < MARGIN_KB, peaks
    assert peaks["planted"] - peaks["small"] > MARGIN_KB, peaks  # the measurement catches a whole read
