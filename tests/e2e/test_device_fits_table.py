"""benchmarks/device/fits_table.py on the CPU, so the script a TPU runs cannot rot: its batch
search against a brute-force scan (with a planted off-by-one it catches), and one --small row
under a memory limit that the search must respect."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "fits_table.py"


def _module():
    spec = importlib.util.spec_from_file_location("fits_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(SCRIPT.parent))
    spec.loader.exec_module(module)
    return module


def _check_search(largest) -> None:
    for most in (1, 5, 64):
        for true in (0, 1, 2, 3, 7, 10, 33, 64, 100):
            calls = []

            def fits(b, true=true, calls=calls):
                calls.append(b)
                return b <= true

            assert largest(fits, most) == min(true, most), (most, true)
            assert len(set(calls)) == len(calls) and len(calls) <= 2 * most.bit_length() + 1


def test_the_search_finds_the_largest_fitting_batch_in_few_compiles():
    _check_search(_module().largest)


def test_the_search_check_catches_an_off_by_one():
    real = _module().largest
    with pytest.raises(AssertionError):
        _check_search(
            lambda fits, most: max(0, real(fits, most) - 1) if real(fits, most) > 2 else real(fits, most)
        )


def test_a_small_row_fits_under_the_limit_it_was_given(tmp_path):
    out = tmp_path / "rows.json"
    limit_gib = 400_000 / 2**30  # about 400 kB: the llama small config fits a few rows, not 16
    argv = [sys.executable, str(SCRIPT), "--small", "--rows", "llama-1b:full:optimizer", "--steps", "1"]
    argv += ["--max-batch", "16", "--limit-gib", repr(limit_gib), "--json", str(out)]
    argv += ["--plot", str(tmp_path / "rows.png")]
    done = subprocess.run(argv, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    (row,) = json.loads(out.read_text())
    limit = row["limit_bytes"]
    assert row["fits"] and 1 <= row["batch"] < 16 and row["footprint_bytes"] <= limit
    sizes = {int(b): v for b, v in row["footprints"].items()}
    assert sizes[row["batch"]] <= limit and sizes[row["batch"] + 1] > limit
    assert row["ms_per_step"] > 0 and row["device"] == "cpu"
    assert (tmp_path / "rows.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
