"""The precision policy through whole runs: the summary says it, a DP run in bf16 reports the
privacy of the same run in float32 (the accounting does not move), and --resume refuses a
changed precision."""

import json
import math

import pytest

from tests.e2e.test_dp_train import quick_dp
from zoo.cli import main
from zoo.errors import ZooError
from zoo.train.loop import train_recipe

PRIVACY = ("epsilon", "delta", "delta_accountant", "noise_multiplier", "sampling_prob", "padded_batch_size")


@pytest.fixture(scope="session")  # built at most once per xdist worker
def dp_runs(tmp_path_factory):
    runs = {}
    for precision in ("float32", "bfloat16"):
        out = tmp_path_factory.mktemp(f"dp-{precision}")
        recipe = quick_dp(**{"train.precision": precision})
        runs[precision] = (recipe, train_recipe(recipe, out, show_progress=False), out)
    return runs


@pytest.mark.xdist_group("precision-dp-runs")
def test_a_bf16_dp_run_reports_the_privacy_of_the_float32_run(dp_runs):
    (_, f32, _), (_, bf16, _) = dp_runs["float32"], dp_runs["bfloat16"]
    assert (f32["precision"], bf16["precision"]) == ("float32", "bfloat16")
    assert {k: bf16[k] for k in PRIVACY} == {k: f32[k] for k in PRIVACY}
    assert bf16["compile_count"] == 1 and math.isfinite(bf16["eval_loss"])
    assert "train_loss" not in bf16  # under DP the batches' loss is not released


@pytest.mark.xdist_group("precision-dp-runs")
def test_resume_refuses_a_changed_precision(dp_runs):
    recipe, _, out = dp_runs["bfloat16"]
    with pytest.raises(ZooError, match=r'train\.precision: "bfloat16" -> "float32"'):
        train_recipe(quick_dp(**{"train.precision": "float32", "train.steps": 6}), out, resume=True)
    assert json.loads((out / "summary.json").read_text())["precision"] == "bfloat16"


def test_the_flag_sets_the_precision_and_a_bad_one_is_one_line(tmp_path, capsys):
    argv = ["train", "digits-mlp", "--steps", "2", "--no-progress", "--out", str(tmp_path / "r")]
    assert main([*argv, "--precision", "bfloat16", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["precision"] == "bfloat16"
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--precision", "bf16"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "invalid choice: 'bf16'" in err and "bfloat16" in err


@pytest.mark.xdist_group("hf")
# DP-LoRA covers LoRA; the hf-lm-lora-bf16 recipe itself is checked with every recipe (round trip)
@pytest.mark.parametrize("recipe, flags", [("hf-lm-dp-lora", ["--precision", "bfloat16"])])
def test_lora_trains_on_a_bf16_import_in_bf16(tmp_path, capsys, recipe, flags):
    """An imported bf16 checkpoint trains LoRA (and DP-LoRA) under the bf16 policy: the base is
    held as it is (tests/train/test_engine.py reads the step: never widened)."""
    from tests.tiny import HF_FIXTURES as FIXTURES
    from tests.tiny import TINY

    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    imp = tmp_path / "imp"
    assert main(["import", str(FIXTURES / "llama-bf16"), "--out", str(imp), "--dtype", "bfloat16"]) == 0
    argv = ["train", recipe, "--init-from", str(imp), "--dataset", f"text:{tmp_path / 't.txt'}", *flags]
    vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
    capsys.readouterr()
    assert main([*argv, vocab, "--out", str(tmp_path / "r"), *TINY]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["precision"] == "bfloat16" and math.isfinite(summary["eval_loss"])


def test_a_bf16_run_with_frozen_layers_resumes_bitwise(tmp_path):
    """Frozen leaves are held (and saved) in bf16; a resumed bf16 run ends on the params of the
    uninterrupted one, bit for bit."""
    from tests.numerics import assert_bitwise_equal
    from zoo import recipes
    from zoo.commands import settings
    from zoo.train import checkpoint

    def recipe(steps):
        values = {
            "train.steps": steps,
            "train.checkpoint_every": 2,
            "train.eval_every": 2,
            "train.eval_batches": 1,
        }
        values |= {"train.precision": "bfloat16", "freeze.patterns": ["in_proj"]}
        return settings.with_values(recipes.load_recipe("digits-mlp"), values)

    train_recipe(recipe(4), tmp_path / "whole", show_progress=False)
    train_recipe(recipe(2), tmp_path / "parts", show_progress=False)
    train_recipe(recipe(4), tmp_path / "parts", resume=True, show_progress=False)
    whole, parts = (checkpoint.load_checkpoint(tmp_path / d).params for d in ("whole", "parts"))
    assert str(parts["in_proj"]["w"].dtype) == "bfloat16" and str(parts["head"]["w"].dtype) == "float32"
    assert_bitwise_equal(parts, whole)
