"""benchmarks/device/session.sh at its tiny CPU size (``SMALL=1``): the user's session that the
chip runs as one prepared call, here with the same commands and flags on tiny presets, so the
call cannot rot. Every step must pass: zoo tokenize of the offline corpus, a gpt2-124m-tokens run
interrupted by SIGINT and resumed, zoo eval and zoo sample, its uninterrupted twin, zoo import of
Llama checkpoints written in Hugging Face's layout and the LoRA fine-tunes from them, llama-1b-tokens
with the update on the host, the DP recipe and the frozen-layer run. The resumed run's losses must
equal the twin's bitwise, read here from the two runs' files (not from the script's own check).
About 20 processes, each importing JAX and zoo: 149 s of CPU, 435 s of wall time on a 2-core
machine at load 11.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.numerics import assert_bitwise_equal

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device" / "session.sh"
STEPS = {
    "corpus", "vocab", "tokenize_gpt2", "tokenize_llama", "gpt2_train", "gpt2_resume", "gpt2_eval",
    "gpt2_sample", "gpt2_twin", "same_losses", "harness_gpt2", "full_llama1b", "hf_llama1b", "import_llama1b",
    "lora_llama1b", "hf_llama3b", "import_llama3b", "lora_llama3b", "dp_gpt2", "frozen_llama1b",
}  # fmt: skip


def _figures(run: Path) -> dict[str, np.ndarray]:
    """Each logged figure of ``run``'s metrics.jsonl (loss, gradient norm, eval loss) by step."""
    rows: dict[int, dict] = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        rows.setdefault(record["step"], {}).update(record)
    steps = sorted(rows)
    return {
        key: np.array([(s, rows[s][key]) for s in steps if key in rows[s]], np.float64)
        for key in ("loss", "grad_norm", "eval_loss")
    }


@pytest.mark.slow
def test_the_session_runs_every_step_and_the_resumed_run_equals_the_uninterrupted_one(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "SMALL": "1", "PY": sys.executable, "OUT": str(out), "WORK": str(work)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=3300)
    with (out / "steps.tsv").open() as f:
        steps = {row["step"]: row for row in csv.DictReader(f, delimiter="\t")}
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert set(steps) == STEPS and all(row["status"] == "ok" for row in steps.values()), steps
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "session.json", "session.md", "steps.tsv"]

    # the interrupt was a real one, mid-run, and the resume continued from a checkpoint before it
    log = (work / "logs" / "gpt2_train.log").read_text()
    assert "interrupted after step" in log and steps["gpt2_train"]["exit"] == "130"
    resumed = json.loads((work / "runs" / "gpt2" / "summary.json").read_text())
    twin = json.loads((work / "runs" / "gpt2-twin" / "summary.json").read_text())
    assert 0 < resumed["resumed_from_step"] < resumed["steps"] == twin["steps"]
    a, b = _figures(work / "runs" / "gpt2"), _figures(work / "runs" / "gpt2-twin")
    assert all(len(v) for v in a.values()) and a["loss"][-1, 0] == resumed["steps"]
    assert_bitwise_equal(a, b)

    # the table reads the CLI's own figures back, and the llama-1b run took the recipe's placement
    table = json.loads((out / "session.json").read_text())["rows"]
    full = next(r for r in table if r["step"] == "full_llama1b")
    assert full["offload"] == "optimizer+params" and full["update_on"] == "host" and full["tokens_per_s"] > 0
    assert all(r["ex_per_s"] for r in table if r["step"].startswith(("lora_", "gpt2_twin", "dp_")))

    # the harness's plain step in both attentions (sdpa: cuDNN's on a GPU), the fastest beside the CLI's
    harness = json.loads((out / "session.json").read_text())["harness"]
    plains = [
        r
        for r in json.loads((work / "logs" / "harness_gpt2.json").read_text())["rows"]
        if "plain:" in r["row"]
    ]
    assert sorted(r["row"] for r in plains) == ["plain:sdpa:dots:2", "plain:xla:dots:2"]
    assert harness["plain"]["tokens_per_s"] == max(r["tokens_per_s"] for r in plains)
