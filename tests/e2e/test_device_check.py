"""benchmarks/device/device_check.py at --small on CPU, so the script a lent GPU runs cannot rot.

The run is all compile time (about 45 programs with the float32 and bf16 memory, time and DP
rows; ~145 s of CPU, 788 s wall at load average 10 on the 2-core machine); the script sets XLA's CPU optimisation level to 0 for --small, and times 3
rounds instead of 10. Figures are not asserted beyond sanity: speed and memory claims live in
the script's output, not in tests. Not marked ``numerics``: the float rule's comparisons here
are remat against none, which tests/test_remat.py already re-runs under each ISA cap,
and re-running this whole script per cap would cost minutes of CI.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "device_check.py"
SECTIONS = ("gradients", "memory", "time", "dp", "attention")


def _run(tmp_path, *flags) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "check.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--small", "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.exists(), done.stderr[-2000:]
    return done, json.loads(out.read_text())


def _rows(result, section):
    body = result["sections"][section]
    assert body["status"] == "ok", body
    assert body["rows"], section
    for row in body["rows"]:
        assert row["status"] == "ok", (section, row)
    return body["rows"]


@pytest.mark.slow
def test_small_run_has_every_section_and_every_gradient_passes(tmp_path):
    done, result = _run(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert set(result["sections"]) == set(SECTIONS)
    assert result["mismatches"] == []

    grads = _rows(result, "gradients")
    import zoo.remat

    checked = {r["variant"] for r in grads}
    assert set(zoo.remat.policy_names()) - {"none"} <= checked
    assert {"chunked attention + full", "mlp_chunk + full"} <= checked
    assert {(r["model"], r["dtype"]) for r in grads} == {
        (m, d) for m in ("transformer-s", "llama-s") for d in ("float32", "bfloat16")
    }
    for r in grads:
        assert r["passed"] and 0 <= r["excess"] <= 1 and r["tolerance"] > 0, r

    memory = _rows(result, "memory")
    assert {(r["policy"], r["precision"]) for r in memory} == {
        (p, d) for p in ("none", "full", "offload-layer-input") for d in ("float32", "bfloat16")
    }
    for r in memory:
        assert ("temp_of_float32" in r) == (r["precision"] == "bfloat16"), r
        assert r["analysis_bytes"] > 0 and r["temp_bytes"] > 0 and r["argument_bytes"] > 0, r
        assert r["peak_bytes"] is None  # CPU offers no memory_stats() peak
        assert r["loss_finite"], r
    offload = [r for r in memory if r["policy"].startswith("offload")]
    assert offload and all("saves_device_memory" in r and r["offload_vs"] for r in offload)
    depths = sorted({r["num_layers"] for r in memory})
    none = {
        r["num_layers"]: r["temp_bytes"]
        for r in memory
        if r["policy"] == "none" and r["precision"] == "float32"
    }
    assert none[depths[-1]] > none[depths[0]]  # `none` keeps every layer's residuals

    times = _rows(result, "time")
    assert {r["precision"] for r in times} == {"float32", "bfloat16"}
    for r in times:
        assert r["step_ms"] > 0 and r["model_flops"] > 0 and r["steps"] >= 3, r
        assert r["ratio_to_none"] > 0 and r["mfu"] is None  # no peak FLOP/s known for a CPU
        assert (r.get("ratio_to_float32", 0) > 0) == (r["precision"] == "bfloat16"), r
    dp = _rows(result, "dp")
    for r in dp:
        assert r["ghost_over_non_private"] > 0, r
        if r.get("precision") == "bfloat16":  # DP cost in bf16, and against the float32 ghost step
            assert r["ghost_bf16_over_float32"] > 0, r
        else:
            assert r["jax_privacy_over_ghost"] > 0 and min(r["temp_bytes"].values()) >= 0, r
    models = {"mlp-s", "transformer-s", "llama-s"}
    assert {(r["model"], r.get("precision", "float32")) for r in dp} == {
        *((m, "float32") for m in models),
        ("llama-s", "bfloat16"),  # --small times one model in bf16
    }
    attention = {r["attention"]: r for r in _rows(result, "attention")}
    assert set(attention) == {"dense", "chunked"}
    assert all(r["temp_bytes"] > 0 and r["step_ms"] > 0 for r in attention.values())
    assert attention["chunked"]["temp_bytes"] < attention["dense"]["temp_bytes"]
    assert math.isfinite(result["wall_s"])
    _check_progress(done.stderr.splitlines())


def _check_progress(lines):
    """Progress goes to stderr as it runs, by default: a --small run is minutes of compiling, so
    a line per section and per row, with the seconds since the start, so that a loaded machine
    does not look hung. (Checked on the whole run's stderr, which a run of its own used to repeat.)"""
    for i, name in enumerate(SECTIONS, 1):
        text = f"{name}: section {i} of {len(SECTIONS)}"
        assert any(line.startswith("[") and line.endswith(text) for line in lines), (text, lines)
        ended = rf"\[ *[\d.]+ s\] {name}: \d+ s, ok"
        assert any(re.fullmatch(ended, line) for line in lines), (name, lines)
    for text in ("attention: dense at T=256", "attention: chunked at T=256"):
        assert any(line.startswith("[") and line.endswith(text) for line in lines), (text, lines)


def test_a_wrong_gradient_is_the_first_line_and_fails_the_run(tmp_path):
    done, result = _run(
        tmp_path, "--sections", "gradients", "--variants", "full,nested", "--plant-bug", "full"
    )
    assert done.returncode == 1
    first = done.stdout.splitlines()[0]
    assert first.startswith("GRADIENT MISMATCH") and " full: " in first, done.stdout[:2000]
    rows = {r["variant"]: r for r in result["sections"]["gradients"]["rows"]}
    assert not rows["full"]["passed"] and rows["full"]["excess"] > 1
    assert rows["nested"]["passed"]  # the check is not failing everything
    assert len(result["mismatches"]) == 1


def test_memory_row_in_its_own_process(tmp_path):
    """The path a GPU takes: one memory row per process (memory_stats()'s peak never resets)."""
    spec = json.dumps({"policy": "offload-layer-input", "depth": 2})
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--small", "--memory-child", spec],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads(done.stdout.strip().splitlines()[-1])
    assert row["status"] == "ok", row
    assert row["analysis_bytes"] > 0 and row["residual_host_bytes"] > 0 and row["loss_finite"]


def test_policies_and_depths_narrow_the_memory_section_and_keep_none():
    """One device call's worth (``--policies``, ``--depths``): ``none`` stays, since every ratio
    is to it; time runs at the first depth; an unknown policy is one line naming it."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import device_check
    finally:
        sys.path.remove(str(SCRIPT.parent))
    size = device_check.narrowed(device_check.sizes(False), "dots,full", "24,12")
    assert size["memory"]["policies"] == [
        p for p in device_check.sizes(False)["memory"]["policies"] if p in ("none", "full", "dots")
    ]
    assert size["memory"]["depths"] == [24, 12] and size["memory"]["time_depth"] == 24
    with pytest.raises(SystemExit, match="unknown nope. Valid: none"):
        device_check.narrowed(device_check.sizes(False), "full,nope", None)
