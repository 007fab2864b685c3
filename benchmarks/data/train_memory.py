"""Peak RSS and first-step latency of a training run against the corpus size, the text read
in memory (``text:``) against the token store (``tokens:DIR``).

    .venv/bin/python benchmarks/data/train_memory.py --sizes 10,200,2000 --in-memory-max 200

For each size a corpus is generated (``corpus.py``, under ``--root``; not committed) and
tokenized once into a byte-vocabulary store. Each row is a fresh interpreter running
``train_recipe`` on ``python-docs-lm`` (transformer-s, batch 32 x 64 tokens, byte vocabulary)
for one step: the seconds until its data are loaded (``zoo.train.stages.load_data``), until the first step's
metrics line is written (from interpreter start: imports and compilation included, the same
for every row), and the process's peak RSS (``VmHWM``). The in-memory path needs about ten
times the text's size in RAM; ``--in-memory-max`` (MB) keeps it to what the machine holds.
``--clean`` removes the corpora and stores afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import corpus

SETTINGS = {
    "train.steps": 1,
    "train.log_every": 1,
    "train.eval_batches": 1,
    "data.vocabulary": "bytes",
}

CHILD = """
import time
T0 = time.perf_counter()
import json, sys
from pathlib import Path
marks = {}
from zoo.train import runlog, stages
write, load = runlog.MetricsLog.write, stages.load_data
def first_write(self, record):
    marks.setdefault("first_step_s", time.perf_counter() - T0)
    return write(self, record)
def timed_load(*args, **kwargs):
    tic = time.perf_counter()
    task = load(*args, **kwargs)
    marks["data_s"] = time.perf_counter() - tic
    return task
runlog.MetricsLog.write, stages.load_data = first_write, timed_load
from zoo import recipes
from zoo.commands import settings
from zoo.train.loop import train_recipe
recipe = settings.with_values(recipes.load_recipe("python-docs-lm"), json.loads(sys.argv[1]))
train_recipe(recipe, sys.argv[2], show_progress=False)
peak = [int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")][0]
print(json.dumps({**marks, "peak_rss_mb": peak / 1024}))
"""


def child_run(dataset: str, out: Path) -> dict:
    cache = tempfile.mkdtemp(prefix="zoo-hf-cache-")  # every in-memory run converts the text afresh
    env = {**os.environ, "HF_DATASETS_CACHE": cache, "PYTHONWARNINGS": "ignore"}
    try:
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps({**SETTINGS, "data.dataset": dataset}), str(out)],
            capture_output=True,
            text=True,
            env=env,
        )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1][:200]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def store_for(root: Path, mb: float, files: list[Path]) -> Path:
    from zoo.data.tokens.build import tokenize

    store = root / f"store-{mb:g}mb"
    if not (store / "store.json").exists():
        tokenize(f"text:{root / f'corpus-{mb:g}mb'}", store, "bytes")
    return store


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10,200,2000", help="corpus sizes in MB")
    parser.add_argument("--in-memory-max", type=float, default=200, help="largest size (MB) run in memory")
    parser.add_argument("--root", default="/tmp/zoo-data-bench")
    parser.add_argument("--clean", action="store_true", help="remove the corpora and stores afterwards")
    args = parser.parse_args()
    root = Path(args.root)
    rows = []
    for mb in (float(s) for s in args.sizes.split(",")):
        files = corpus.make(root / f"corpus-{mb:g}mb", mb)
        store = store_for(root, mb, files)
        runs = {"tokens:DIR": f"tokens:{store}"}
        if mb <= args.in_memory_max:
            runs["text: (in memory)"] = "text:" + ",".join(map(str, files))
        for path, dataset in runs.items():
            rows.append((path, mb, child_run(dataset, root / "run")))
            print(json.dumps({"path": path, "mb": mb, **rows[-1][2]}), flush=True)
    print(f"\n{'path':<18} {'corpus MB':>9} {'data s':>7} {'first step s':>12} {'peak RSS MB':>11}")
    for path, mb, r in sorted(rows, key=lambda row: (row[0], row[1])):
        if "error" in r:
            print(f"{path:<18} {mb:>9,.0f}  failed: {r['error']}")
            continue
        print(
            f"{path:<18} {mb:>9,.0f} {r['data_s']:>7.2f} {r['first_step_s']:>12.1f} {r['peak_rss_mb']:>11,.0f}"
        )
    if args.clean:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
