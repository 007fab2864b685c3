"""benchmarks/device/fits.py at --small on CPU, so the script a TPU runs cannot rot. Figures
are not asserted beyond sanity: they belong in the script's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "fits.py"


def test_fits_small_finds_the_largest_batch_one_process_per_row(tmp_path):
    out = tmp_path / "fits.json"
    flags = [
        "--small",
        "--max-batch",
        "2",
        "--steps",
        "1",
        "--placement",
        "offload-optimizer",
        "--out",
        str(out),
    ]
    done = subprocess.run([sys.executable, str(SCRIPT), "llama-1b", *flags], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    best = result["largest"]
    assert result["tried"] == len(result["rows"]) == 2 and all(r["fits"] for r in result["rows"])
    assert (best["batch"], best["placement"], best["remat"]) == (2, "offload-optimizer", "full")
    assert best["ms_per_step"] > 0 and best["analysis_bytes"] > 0 and best["device"] == "cpu"
    assert (
        abs(best["tokens_per_s"] - 2 * best["seq"] / (best["ms_per_step"] / 1e3))
        < 0.01 * best["tokens_per_s"]
    )
    assert json.loads(done.stdout.strip().splitlines()[-1])["largest"] == best
    # The HBM peak is the larger of memory_stats()'s (none on a CPU) and the compiled step's
    # device footprint, which holds the training state (on a CPU the offloaded one too).
    assert best["peak_bytes"] is None and best["compiled_bytes"] > best["host_temp_bytes"]
    assert best["hbm_peak_bytes"] == max(best["peak_bytes"] or 0, best["compiled_bytes"])


def test_the_hbm_peak_is_the_larger_of_the_two():
    """On the TPU memory_stats()'s peak misses the program's temp; it can also be the larger
    (what the runtime holds besides the step)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("fits", SCRIPT)
    fits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fits)
    assert fits.hbm_peak(2 * 2**30, 9 * 2**30)["hbm_peak_bytes"] == 9 * 2**30
    assert fits.hbm_peak(9 * 2**30, 2 * 2**30)["hbm_peak_bytes"] == 9 * 2**30
    assert fits.hbm_peak(None, 5)["hbm_peak_bytes"] == 5
