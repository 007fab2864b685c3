"""``zoo bench dp`` on a tiny batch: the JSON shape, and microbatching bounds temp memory."""

import argparse
import json

import jax
import pytest

from tests.numerics import assert_close
from zoo import recipes
from zoo.bench import dp as dp_bench
from zoo.commands import settings
from zoo.errors import ZooError
from zoo.train import stages


def run_bench(argv, capsys):
    parser = argparse.ArgumentParser()
    dp_bench.add_bench(parser.add_subparsers(dest="bench"))
    args = parser.parse_args(["dp", *argv])
    assert args.func(args) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_bench_dp_json_and_microbatch_memory(capsys):
    result = run_bench(
        [
            "mlp-s",
            "--batch",
            "32",
            "--methods",
            "zoo vmap,zoo microbatch",
            "--no-sweep",
            "--rounds",
            "1",
            "--steps",
            "1",
            "--quiet",
            "--json",
        ],
        capsys,
    )
    assert {"rows", "model", "batch"} <= set(result)
    assert result["model"] == "mlp-s" and result["batch"] == 32
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"non-private", "zoo vmap", "zoo microbatch k=4"}
    for row in rows.values():
        assert {"method", "step_ms", "step_ratio", "temp_bytes", "temp_ratio"} <= set(row)
        assert row["step_ms"] > 0 and row["temp_bytes"] > 0
    assert rows["non-private"]["step_ratio"] == 1.0 and rows["non-private"]["temp_ratio"] == 1.0
    # per-example gradients of 32 examples at once need more scratch than 4 at a time
    assert rows["zoo microbatch k=4"]["temp_bytes"] < rows["zoo vmap"]["temp_bytes"]


def test_microbatch_flag_takes_every_row_in_microbatches(capsys):
    """``--microbatch K``: the non-private row and zoo's rows step through the batch K at a time
    (less temp than the whole batch), under ``--precision`` and ``--remat``."""
    common = ["mlp-s", "--batch", "32", "--no-sweep", "--rounds", "1", "--steps", "1", "--quiet", "--json"]
    whole = run_bench([*common, "--methods", "zoo vmap"], capsys)
    micro = run_bench([*common, "--microbatch", "4", "--precision", "bfloat16", "--remat", "full"], capsys)
    assert whole["step_microbatch"] is None and micro["step_microbatch"] == 4
    assert (micro["precision"], micro["remat"]) == ("bfloat16", "full")
    rows = {r["method"]: r for r in micro["rows"]}
    assert list(rows) == dp_bench.default_methods(microbatched=True) == ["non-private", "zoo vmap", "ghost"]
    assert rows["zoo vmap"]["temp_bytes"] < whole["rows"][1]["temp_bytes"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--microbatch", "5"],
            "--microbatch must be a positive int that divides the batch of 32 rows, got 5; "
            "valid microbatch sizes: 1, 2, 4, 8, 16, 32",
        ),
        (
            ["--microbatch", "-2"],
            "--microbatch must be a positive int that divides the batch of 32 rows, got -2",
        ),
        (["--remat", "nope"], "nope"),
    ],
)
def test_bad_bench_flags_are_one_line(flags, message):
    with pytest.raises(ZooError, match=message) as error:
        dp_bench.bench_dp(
            "mlp-s", batch=32, **_kwargs(flags), methods=[dp_bench.BASELINE], memory_sweep=False
        )
    assert "\n" not in str(error.value)


def _kwargs(flags):
    name, value = flags
    return {name.lstrip("-"): int(value) if value.lstrip("-").isdigit() else value}


@pytest.mark.numerics
def test_the_microbatched_non_private_step_is_the_whole_batch_step():
    """The non-private row under ``--microbatch``: its gradient accumulated over 4 microbatches
    makes the update of the engine's whole-batch step."""
    cfg, batch, seq = dp_bench._config("mlp-s", 16, None)
    data = dp_bench._batch(cfg, batch, seq, 0)
    data["mask"] = data["mask"].at[3].set(0.0)
    new = {}
    for step_microbatch in (None, 4):
        setup, params = dp_bench.setup_for(cfg, "nnx", batch, 4, (), 0, step_microbatch=step_microbatch)
        step, optimizer = dp_bench.methods()[dp_bench.BASELINE](setup)
        state, frozen = dp_bench.fresh_state(setup, params, optimizer, 0)
        new[step_microbatch] = jax.jit(step)(state, frozen, data)
    assert_close(new[4][0].params, new[None][0].params, n=batch, what="params after one step")
    assert_close(new[4][1]["loss"], new[None][1]["loss"], n=batch, what="loss")


def test_default_rows_include_ghost():
    assert dp_bench.default_methods() == [
        "non-private",
        "zoo vmap",
        "zoo microbatch",
        dp_bench.GHOST,
        "ghost backward",
        "ghost layer-wise",
        "jax_privacy clipped_grad",
        "optax dpsgd",
    ]


@pytest.mark.parametrize(
    "remat, ghost_ran",
    [("none", "book-keeping"), ("full", "second backward")],
)
def test_a_ghost_row_names_the_method_its_step_runs(remat, ghost_ran):
    """Under ``auto`` the ghost row says what ran; the forced rows say theirs whatever the policy."""
    from zoo.bench import dp_rows

    cfg, batch, seq = dp_bench._config("transformer-xs", 4, None)
    setup, _ = dp_bench.setup_for(cfg, "nnx", batch, batch, (), 0, remat=remat)
    data = dp_bench._batch(cfg, batch, seq, 0)
    assert dp_rows.ran(dp_bench.GHOST, setup, data) == ghost_ran
    assert dp_rows.ran("ghost backward", setup, data) == "second backward"
    assert dp_rows.ran("ghost bookkeeping", setup, data) == "book-keeping"
    assert dp_rows.ran("ghost layer-wise", setup, data) == "layer-wise taps"
    assert dp_rows.ran("zoo vmap", setup, data) is None


def test_ghost_dp_step_temp_memory_is_near_the_non_private_step():
    """Issue 7's memory figure as a compiled count: mlp-s at B=256, the full DP train step
    (ghost clipping, noise, SGD) needs at most 1.5x the non-private step's temp memory. The
    noise is drawn after the clipped sum, so its sampler scratch reuses activation memory."""
    cfg, batch, seq = dp_bench._config("mlp-s", None, None)
    setup, params = dp_bench.setup_for(cfg, "nnx", batch, batch, (), 0)
    data = dp_bench._batch(cfg, batch, seq, 0)
    temp = {}
    for name in ("non-private", dp_bench.GHOST):
        step, optimizer = dp_bench.methods()[name](setup)
        state, frozen = dp_bench.fresh_state(setup, params, optimizer, 0)
        compiled = dp_bench.compile_step(step, state, frozen, data)
        temp[name] = compiled.memory_analysis().temp_size_in_bytes
    assert temp[dp_bench.GHOST] <= 1.5 * temp["non-private"], temp


def test_a_recipes_model_start_is_benched_with_its_params_and_freeze_plan():
    """``bench_dp`` on a model start of the run stages (``benchmarks/dp/mnist_cost.py``): the
    recipe's fitted config and its freeze plan (the DP-PCA projection frozen), not a preset's."""
    recipe = settings.with_values(
        recipes.load_recipe("digits-mlp-dp"), {"data.dp_pca": 16, "dp.pca_epsilon": 0.5}
    )
    start = stages.model_start(recipe, stages.load_data(recipe))
    assert start.freeze.frozen_count > 0  # the projection
    result = dp_bench.bench_dp(
        start, batch=8, methods=[dp_bench.BASELINE], memory_sweep=False, rounds=1, steps_per_round=1
    )
    assert result["model"] == start.cfg.kind
    assert result["trainable_params"] == start.freeze.trainable_count
    assert result["frozen_params"] == start.freeze.frozen_count
    with pytest.raises(ValueError, match="freeze patterns"):
        dp_bench.bench_dp(start, batch=8, freeze=("head",), methods=[dp_bench.BASELINE], memory_sweep=False)
