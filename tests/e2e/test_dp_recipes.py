"""The real-size DP fine-tuning recipes (issue 59): DP full fine-tuning of gpt2-124m and DP-LoRA
of llama-1b, each at a logical batch of 1,024 sequences of 1,024 tokens taken 8 at a time. They
validate as shipped, and each trains on this CPU with its own settings (bf16, its remat, its
microbatching, ghost clipping, adapters) on a small model of the same kind."""

import json

import pytest

from zoo import recipes
from zoo.cli import main

NAMES = {
    "gpt2-124m-tokens-dp": ("gpt2-124m", "transformer-xs"),
    "llama-1b-tokens-dp-lora": ("llama-1b", "llama-xs"),
}


@pytest.mark.parametrize("name", list(NAMES))
def test_a_real_size_dp_recipe_takes_a_million_token_logical_batch(name):
    recipe = recipes.load_recipe(name)  # every section validated
    assert recipe.model.preset == NAMES[name][0] and recipe.dp.enabled
    assert recipe.data.seq_len == 1024 and recipe.dp.expected_batch_size == 1024
    assert recipe.data.seq_len * recipe.dp.expected_batch_size == 2**20  # the logical batch
    assert recipe.train.microbatch_size == 8 and recipe.train.precision == "bfloat16"
    assert recipe.lora.enabled == name.endswith("-lora")


SMALL = ["--dataset", "python-docs", "--set", "data.seq_len=16", "--set", "data.vocabulary=bytes"]
SMALL += ["--steps", "2", "--set", "train.eval_every=2", "--set", "train.eval_batches=1", "--json"]


@pytest.mark.parametrize("name", list(NAMES))
def test_a_real_size_dp_recipe_trains_small_with_its_own_settings(tmp_path, capsys, name):
    small = NAMES[name][1]
    base = "none"
    if name.endswith("-lora"):  # adapters go on a trained base: a public one, here a plain run
        base = str(tmp_path / "base")
        argv = ["train", "python-docs-llama", "--set", f"model.preset={small}", *SMALL, "--out", base]
        assert main(argv) == 0
        capsys.readouterr()
    argv = ["train", name, "--set", f"model.preset={small}", "--set", f"model.init_from={base}", *SMALL]
    argv += [
        "--set",
        "dp.expected_batch_size=16",
        "--set",
        "train.microbatch_size=4",
        "--out",
        str(tmp_path / "run"),
    ]
    assert main(argv) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["steps"] == 2 and summary["epsilon"] > 0
    assert summary["precision"] == "bfloat16"
