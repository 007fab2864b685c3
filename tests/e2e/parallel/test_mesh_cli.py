"""``zoo train --mesh`` end to end: the summary, a resume onto another mesh, DP-SGD's epsilon,
two processes against one, and ``zoo bench scale``."""

import json
import os
import shutil
import sys

import numpy as np
import pytest

from tests.e2e.parallel.processes import run_processes
from tests.numerics import assert_close
from zoo import recipes
from zoo.bench.scale import bench_scale
from zoo.cli import main
from zoo.commands import settings
from zoo.train import checkpoint
from zoo.train.run import build_run, epsilon_at

# SGD (a step is linear in the gradient) and a few steps: runs on two meshes differ by rounding.
FLAGS = ["--no-progress", "--json", "--set", "optim.name=sgd", "--set", "optim.lr=0.1"]
N = 720 * 64  # the float rule's reduction size for the digits MLP: examples x input width


def zoo_train(capsys, recipe, out, *flags):
    assert main(["train", recipe, "--out", str(out), *FLAGS, *flags]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def losses(run_dir):
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.asarray([line["loss"] for line in lines if "loss" in line])


MESH = "data=4,fsdp=2"
STEPS = ["--steps", "4", "--set", "train.log_every=1", "--set", "train.checkpoint_every=2"]


@pytest.fixture(scope="module")
def eight(tmp_path_factory):
    """4 steps of digits-mlp in this process, over 8 devices on data=4 x fsdp=2."""
    out = tmp_path_factory.mktemp("eight") / "run"
    assert main(["train", "digits-mlp", "--out", str(out), *FLAGS, *STEPS, "--mesh", MESH]) == 0
    return out, json.loads((out / "summary.json").read_text())


@pytest.mark.xdist_group("eight")
def test_a_run_resumes_onto_another_mesh(eight, tmp_path, capsys):
    run, whole = eight
    assert (whole["mesh"], whole["devices"], whole["compile_count"]) == (
        {"data": 4, "fsdp": 2, "tensor": 1},
        8,
        1,
    )
    out = tmp_path / "run"
    shutil.copytree(run, out)
    shutil.rmtree(out / "checkpoints" / "4")  # killed after step 2: continue on data=2 x tensor=4
    rest = zoo_train(capsys, "digits-mlp", out, *STEPS, "--mesh", "data=2,tensor=4", "--resume")
    assert rest["resumed_from_step"] == 2 and rest["compile_count"] == 1 and rest["mesh"]["tensor"] == 4
    assert_close(losses(out), losses(run), n=N, what="losses")
    assert_close(rest["eval_loss"], whole["eval_loss"], n=N, what="eval loss")


def test_dp_on_a_mesh_spends_the_same_epsilon(tmp_path, capsys):
    # The params of DP runs on a mesh and on one device: test_mesh_train.py. Here, the CLI's
    # padded batch splits over the mesh, and epsilon is the one-device accounting's, exactly.
    dp = {"train.steps": 3, "dp.noise_seed": 3}  # the default sampler: "auto", philox4x32 on a CPU
    eight = zoo_train(capsys, "digits-mlp-dp", tmp_path / "eight", "--mesh", "data=8", *_sets(dp))
    one = build_run(settings.with_values(recipes.load_recipe("digits-mlp-dp"), dp))
    assert eight["epsilon"] == epsilon_at(one, 3) and eight["sampling_prob"] == one.dp.sampler.sampling_prob
    assert eight["padded_batch_size"] % 8 == 0 and eight["compile_count"] == 1


def _sets(values: dict) -> list[str]:
    return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]


@pytest.mark.parametrize(
    ("flags", "match"),
    [
        (["--mesh", "data=3"], "has 3 devices, but 8 are present"),
        (["--mesh", "data=2,pipeline=4"], "unknown mesh axis 'pipeline'.*Valid: data, fsdp, tensor"),
        (["--mesh", "data=8", "--batch-size", "12"], "train.batch_size = 12 rows does not split"),
    ],
)
def test_bad_meshes_are_refused_in_one_line(tmp_path, capsys, flags, match):
    import re

    code = main(["train", "digits-mlp", "--out", str(tmp_path / "r"), "--steps", "1", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and re.search(match, err[-1]), err[-1]


@pytest.mark.xdist_group("eight")
def test_two_processes_train_like_one(eight, tmp_path):
    """2 processes x 4 devices against 1 process x 8 devices, on the same mesh."""
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4"}
    out = tmp_path / "two"
    cmd = [
        sys.executable,
        "-m",
        "zoo.cli",
        "train",
        "digits-mlp",
        "--out",
        str(out),
        *FLAGS,
        *STEPS,
        "--mesh",
        MESH,
    ]
    results = run_processes(cmd, 2, env)
    assert [code for code, _, _ in results] == [0, 0], results[0][2][-2000:] + results[1][2][-2000:]
    summary = json.loads(results[0][1].strip().splitlines()[-1])
    assert (summary["devices"], summary["compile_count"]) == (8, 1)
    assert not any(line.startswith("{") for line in results[1][1].splitlines())  # only process 0 reports
    assert "[Gloo]" not in results[0][1] + results[1][1]  # gloo's rendezvous lines are left out
    assert_close(losses(out), losses(eight[0]), n=N, what="two processes vs one")
    assert checkpoint.step_problem(out, 4) is None  # one sharded checkpoint, written by both


def test_bench_scale_reports_bytes_and_collectives():
    result = bench_scale("mlp-s", ["data=1", "fsdp=8", "data=4,tensor=2"], repeats=1, steps=1, batch=16)
    one, fsdp, tensor = result["rows"]
    keys = {
        "mesh",
        "devices",
        "param_bytes_per_device",
        "opt_state_bytes_per_device",
        "temp_bytes_per_device",
        "block_temp_bytes_per_device",
    }
    assert keys | {"step_ms", "collectives"} <= set(one)
    assert not any(c["count"] for c in one["collectives"].values())
    assert fsdp["collectives"]["all-gather"]["count"] > 0 and tensor["collectives"]["all-reduce"]["count"] > 0
    state = ("param_bytes_per_device", "opt_state_bytes_per_device")
    assert sum(fsdp[k] for k in state) <= sum(one[k] for k in state) / 8 * 1.05
