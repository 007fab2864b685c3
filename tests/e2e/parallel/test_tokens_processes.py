"""A language model on a token store, two processes x 4 devices against one process x 8, on
the same mesh: the same losses, and each process reads only its own rows of every batch."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.parallel.processes import run_processes
from tests.numerics import assert_close
from zoo.cli import main

MESH = "data=4,fsdp=2"
BATCH = 16
SEQ = 16
FLAGS = [
    "--no-progress",
    "--json",
    "--mesh",
    MESH,
    "--steps",
    "2",
    "--batch-size",
    str(BATCH),
    *("--set", "optim.name=sgd", "--set", "optim.lr=0.1", "--set", "train.log_every=1"),
    *("--set", "model.num_layers=1", "--set", "model.d_model=32", "--set", "model.d_ff=64"),
    *("--set", f"model.max_len={SEQ}", "--set", f"data.seq_len={SEQ}", "--set", "train.eval_batches=1"),
]
N = BATCH * SEQ * 64  # the float rule's reduction size: tokens x the widest fan-in (d_ff)

# Runs zoo train, counting the rows each read of training windows asks for (the reads made on
# the prefetch thread; eval batches are read whole by every process).
COUNTING = """
import json, sys, threading
from pathlib import Path
import zoo.data.batches as batches
read, rows = batches.read_windows, []
def counting(tokens, starts, length, vocab_size, *rest):
    if threading.current_thread().name == "zoo-prefetch":
        rows.append(len(starts))
    return read(tokens, starts, length, vocab_size, *rest)
batches.read_windows = counting
from zoo.cli import main
code = main(sys.argv[2:])
Path(sys.argv[1] + sys.argv[sys.argv.index("--process-id") + 1]).write_text(json.dumps(rows))
sys.exit(code)
"""


def losses(run_dir: Path) -> np.ndarray:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.asarray([line["loss"] for line in lines if "loss" in line])


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    (root / "corpus").mkdir()
    for i in range(20):
        (root / "corpus" / f"{i:02d}.txt").write_text(f"document {i}: " + "the zoo at night. " * 60)
    out = root / "store"
    assert (
        main(
            [
                "tokenize",
                f"text:{root / 'corpus'}",
                "--out",
                str(out),
                "--vocabulary",
                "bytes",
                "--no-progress",
            ]
        )
        == 0
    )
    return out


@pytest.mark.numerics
def test_two_processes_read_their_own_rows_and_train_like_one(store, tmp_path):
    one = tmp_path / "one"
    assert main(["train", "python-docs-lm", "--dataset", f"tokens:{store}", "--out", str(one), *FLAGS]) == 0
    # 4 devices each, at XLA's fast compile level (it changes rounding only, inside the float
    # rule: tests/conftest.py); an instruction-set cap of this session goes along (make test-isa)
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags = " ".join(
        [*kept, "--xla_force_host_platform_device_count=4", "--xla_backend_optimization_level=0"]
    )
    # 4 devices each, at XLA's fast compile level (it changes rounding only, inside the float
    # rule: tests/conftest.py); an instruction-set cap of this session goes along (make test-isa)
    kept = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags = " ".join(
        [*kept, "--xla_force_host_platform_device_count=4", "--xla_backend_optimization_level=0"]
    )
    two = tmp_path / "two"
    argv = ["train", "python-docs-lm", "--dataset", f"tokens:{store}", "--out", str(two), *FLAGS]
    command = [sys.executable, "-c", COUNTING, str(tmp_path / "rows"), *argv]
    results = run_processes(command, 2, {**os.environ, "XLA_FLAGS": flags}, timeout=240)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-2000:] + results[1][2][-2000:]
    summary = json.loads(results[0][1].strip().splitlines()[-1])
    assert (summary["devices"], summary["compile_count"]) == (8, 1)
    for i in range(2):  # 2 steps, each process its half of the 16 rows
        assert json.loads((tmp_path / f"rows{i}").read_text()) == [BATCH // 2] * 2
    assert_close(losses(two), losses(one), n=N, what="two processes vs one")
