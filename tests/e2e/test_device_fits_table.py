"""benchmarks/device/fits_table.py on the CPU, so the script a TPU runs cannot rot: its batch
search against a brute-force scan (with a planted off-by-one it catches), and one --small row
under a memory limit that the search must respect."""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import jax
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


def test_a_frozen_row_counts_the_flops_its_backward_computes(monkeypatch):
    """The MFU of a ``frozen`` row counts its freeze plan (frozen layers below every trained one
    run forward only), as ``zoo train``'s own figure does; a llama-1b row that counted every
    weight's gradient read 93.7% on a TPU v5e. The peak is the chip's where one is known, so
    the test reads the FLOPs through ``throughput.mfu`` itself."""
    fits_table = _module()
    import devicekit

    from zoo.bench.step import bench_start
    from zoo.train import throughput

    monkeypatch.setattr(devicekit.throughput, "mfu", lambda flops, seconds, precision: flops / seconds)
    cfg = devicekit.config("llama-1b", small=True)
    recipe = fits_table.recipe_for(cfg, fits_table.parse_row("llama-1b:full:none:frozen"), "bfloat16")
    shapes = jax.eval_shape(lambda: fits_table.canonical.init_params(cfg, 0))
    plan = bench_start(cfg, recipe, shapes).freeze
    counted = devicekit.step_mfu(cfg, 4, 16, 1.0, "bfloat16", plan)
    assert counted == throughput.step_flops(cfg, 4, 16, plan)
    assert counted < 0.8 * devicekit.step_mfu(cfg, 4, 16, 1.0, "bfloat16")  # most layers frozen


def test_a_row_runs_at_most_its_models_context():
    """A table of rows at ``--seq 2048`` holds gpt2-355m (``max_len`` 1,024) beside llama-1b: each
    row runs the shorter of the two (the chip's first call of the part stopped on gpt2-355m)."""
    fits_table = _module()
    args = argparse.Namespace(seq=2048, small=False)  # main's flags: --seq 2048, no --small
    for preset, expected in (("gpt2-355m", 1024), ("llama-1b", 2048)):
        assert fits_table.row_seq(fits_table.config(preset, False), args) == expected


@pytest.mark.parametrize("chunks", [1, 3])
def test_host_params_are_scaled_normals_ones_and_zeros_the_same_on_every_call(chunks):
    """``devicekit.host_params``: every weight a normal of scale 0.02 (float64 NumPy's moments),
    norm scales ones (a layer stack's too, which have two axes), biases zeros, and the same
    values on a second call."""
    _module()
    import devicekit
    import numpy as np

    cfg = devicekit.config("gpt2-124m", small=True)  # stacked scales and biases, a head bias
    first, again = devicekit.host_params(cfg, chunks), devicekit.host_params(cfg, chunks)
    flat = jax.tree_util.tree_leaves_with_path(first)
    for (path, leaf), same in zip(flat, jax.tree.leaves(again), strict=True):
        value = np.asarray(leaf, np.float64)
        assert np.array_equal(value, np.asarray(same, np.float64)), path
        name = jax.tree_util.keystr(path)
        if name.endswith("['w']"):
            assert abs(value.mean()) < 0.1 * 0.02 and abs(value.std() / 0.02 - 1) < 0.1, (name, value.std())
            assert len(np.unique(value[0])) == value[0].size, name  # no slice repeats another's draw
        else:
            assert np.all(value == (1.0 if name.endswith("['scale']") else 0.0)), name
