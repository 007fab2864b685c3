"""benchmarks/device/mfu.py at --small on a CPU (splash in Pallas' interpret mode), so the
benchmark the TPU runs cannot rot: both steps compile and run on one shared state each, the
table has every row, and the per-operation profile adds up to what its operations took.
Figures are not asserted: speed lives in the benchmark's output, not in tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "mfu.py"


@pytest.mark.slow
def test_the_mfu_benchmark_runs_both_steps_and_profiles_them(tmp_path):
    out = tmp_path / "mfu.json"
    cmd = [sys.executable, str(SCRIPT), "--small", "--zoo", "splash:none", "--plain", "splash:none"]
    cmd += ["--profile", "zoo:splash:none:2", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [r["row"] for r in result["rows"]] == ["plain:splash:none:2", "zoo:splash:none:2"]
    for row in result["rows"]:
        assert row["ms"] > 0 and row["tokens_per_s"] > 0 and row["mfu"] is None  # no peak for a CPU
        assert f"| {row['row']} |" in done.stdout
    ops = result["profiles"]["zoo:splash:none:2"]
    assert ops and all(op["ms"] >= 0 for op in ops)
    assert any("splash" in op["jax"] for op in ops), "the kernel's operations are named in the profile"
    assert "| total |" in done.stdout
