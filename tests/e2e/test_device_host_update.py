"""benchmarks/device/host_update.py on the CPU, --small, so the script a TPU runs cannot rot:
the host-update run against the device run under the float rule (a planted second update makes
it fail), the bench's rows and phase timings. (dp_lora.py's rows and their tokens/s are checked
on its step of chip_parts.sh's dp-acceptance part, tests/e2e/test_device_chip_parts.py.)"""

from __future__ import annotations

import gc
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from tests.numerics import assert_close
from tests.parallel.test_host_step import update_twice
from zoo.parallel.host_leaves import LeafUpdates

DEVICE = Path(__file__).resolve().parents[2] / "benchmarks" / "device"


def module(name: str):
    spec = importlib.util.spec_from_file_location(name, DEVICE / f"{name}.py")
    loaded = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(DEVICE))
    spec.loader.exec_module(loaded)
    return loaded


def run(script: str, *flags: str) -> list[dict]:
    done = subprocess.run(
        [sys.executable, str(DEVICE / script), "--small", *flags], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def check_both() -> None:
    bench = module("host_update")
    ends = bench.run_both(bench.parse(["--small", "--steps", "1", "--compare-micro", "2"]))
    (p_dev, l_dev), (p_host, l_host) = ends["device"], ends["host"]
    n = 4 * 2 * 64  # the largest reduction: rows x steps x the widest contraction (a small llama's)
    assert_close(l_host, l_dev, n=n, what="losses")
    for a, e in zip(jax.tree.leaves(p_host), jax.tree.leaves(p_dev), strict=True):
        assert_close(a, e, n=n, what="params")


@pytest.mark.numerics
def test_the_host_update_bench_runs_what_the_device_step_runs():
    check_both()


def test_the_bench_comparison_catches_an_update_applied_twice(monkeypatch):
    compile_leaf = LeafUpdates.compile  # the host step's update of a leaf

    monkeypatch.setattr(LeafUpdates, "compile", lambda self, *a: update_twice(compile_leaf(self, *a)))
    with pytest.raises(AssertionError):
        check_both()


PIPELINE = {"up", "grads", "down", "update", "up_next", "tail", "hidden"}
SERIAL = {"up", "up_cast", "up_send", "up_join", "grads", "down", "update"}  # the trip up's three stages too
PHASES = {"serial": SERIAL, "exact": PIPELINE, "delayed": PIPELINE}


def test_the_host_update_bench_times_each_modes_phases():
    rows = run("host_update.py", "--rows", "full:2:2:serial,full:2:2,full:2:2:delayed", "--steps", "1")
    assert [r["mode"] for r in rows] == ["serial", "exact", "delayed"]
    for row in rows:
        assert row["fits"] and row["rows"] == 4 and set(row["phases_ms"]) == PHASES[row["mode"]], row
        assert row["tokens_per_s"] == pytest.approx(4 * row["seq"] / (row["ms_per_step"] / 1e3), rel=0.01)
        assert row["host_peak_gib"] >= row["host_rss_gib"] > row["state_gib"] >= 0, row  # Linux's figures
    stages = rows[0]["phases_ms"]  # the trip up's stages lie inside it
    assert 0 <= stages["up_cast"] + stages["up_send"] + stages["up_join"] <= stages["up"] + 0.2, (
        stages
    )  # rounding
    for row in rows[1:]:  # the pipeline's budget, and what it held
        assert 0 < row["inflight_peak_mib"] <= row["inflight_limit_mib"], row


def test_a_row_lets_go_of_what_it_made_before_the_next(monkeypatch):
    """Rows run one after another in one process: a row's state, its step's last params (host
    and device) and its batch are gone once its result is in, leaving the bench's params alone
    (on a chip, a row's leftovers ran the host's RAM out under the next row)."""
    bench = module("host_update")
    args = bench.parse(["--small", "--rows", "full:2:2,full:2:2:delayed", "--steps", "1"])
    cfg = bench.zoo.get_config(bench.config(args.preset, args.small))
    args.seq = cfg.max_len
    params = bench.host_params(cfg)
    live = lambda: sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted())  # noqa: E731
    gc.collect()  # what earlier tests in this process left for a collection goes first
    before = live()
    for row in args.rows:
        assert bench.row_result(cfg, params, row, args, 2**62)["fits"]
        assert live() == before, row


def test_a_malformed_row_is_refused_in_one_line_before_anything_runs():
    """A typo in ``--rows`` must not read as a measurement ("fits": false) on the chip."""
    done = subprocess.run(
        [sys.executable, str(DEVICE / "host_update.py"), "--small", "--rows", "full:2:2,full:2:2:later"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode != 0 and done.stdout == "", done.stdout[-2000:]
    (line,) = done.stderr.strip().splitlines()  # one line, and no "drawing params" before it
    assert "bad row 'full:2:2:later'" in line and "REMAT:MICRO:ACCUM[:MODE]" in line, line
    bench = module("host_update")
    for row in ("bogus", "full:0:2", "full:2", "nope:2:2", "full:2:x", "full:2:2:2", "full:2:2:exact:1"):
        with pytest.raises(SystemExit, match=rf"bad row '{row}': the form is"):
            bench.parse(["--rows", f"full:2:2,{row}"])
    for mib in ("0", "-5"):
        with pytest.raises(SystemExit):
            bench.parse(["--inflight-mib", mib])


def check_leaf_bytes() -> None:
    """host_budget.py: every leaf's update holds at least its gradient (1x float32) and its bf16
    value going up (0.5x), and a leaf cut in pieces its joined gradient too."""
    rows = module("host_budget").leaf_bytes("llama-xs", "bfloat16", 1000)
    assert len(rows) == 12, rows  # llama-xs: its head untied
    assert all(held >= 1.5 * f32 for _, f32, held in rows), rows
    assert all(held >= 3 * f32 for shape, f32, held in rows if f32 > 1000), rows


def test_the_budget_script_reads_each_leafs_update_bytes():
    check_leaf_bytes()


def test_the_budget_script_check_catches_an_update_counted_as_its_gradient(monkeypatch):
    from zoo.parallel import host_leaves

    monkeypatch.setattr(host_leaves, "update_bytes", lambda compiled, grads: sum(g.size * 4 for g in grads))
    with pytest.raises(AssertionError):
        check_leaf_bytes()
