"""Issue 33, recipes and flags: values checked by their meaning, recipe files that are not
recipes, lengths the data or the model cannot hold; each refused in one line before a model
is built, or run with one warning line saying what happens."""

from __future__ import annotations

import json

import pytest

from tests.e2e.clikit import refused
from zoo.cli import main


def _train(tmp_path, *flags: str, recipe: str = "digits-mlp") -> list[str]:
    return ["train", recipe, "--out", str(tmp_path / "run"), "--no-progress", *flags]


@pytest.mark.parametrize(
    "assignment, words",
    [
        ("optim.end_lr_ratio=-3", ["optim.end_lr_ratio must be in [0, 1]", "-3"]),
        ("optim.end_lr_ratio=1.5", ["optim.end_lr_ratio must be in [0, 1]"]),
        ("optim.momentum=1", ["optim.momentum must be in [0, 1)"]),
        ("optim.momentum=-0.1", ["optim.momentum must be in [0, 1)"]),
        ("optim.weight_decay=-1e-4", ["optim.weight_decay must be >= 0"]),
        ("optim.lr=inf", ["optim.lr must be a finite number > 0"]),
        ("optim.warmup_steps=-1", ["optim.warmup_steps must be >= 0"]),
        ("train.steps=99999999999999999999", ["train.steps must be at most 2,147,483,647"]),
        ("train.seed=-1", ["train.seed must be an int in [0, 4294967295]", "-1"]),
    ],
)
def test_optimizer_and_train_fields_are_checked_by_meaning(capsys, tmp_path, assignment, words):
    line = refused(capsys, _train(tmp_path, "--set", assignment), *words)
    assert "split" not in line


def test_a_memory_budget_without_remat_auto_is_refused_not_ignored(capsys, tmp_path):
    refused(capsys, _train(tmp_path, "--memory-budget", "1GiB"), "only applies with --remat auto")


def test_a_bad_custom_remat_placement_lists_placements_only(capsys, tmp_path):
    line = refused(capsys, _train(tmp_path, "--remat", "custom:layer_input=bogus"), "device, offload, remat")
    assert "auto" not in line
    line = refused(capsys, _train(tmp_path, "--remat", "bogus"), "unknown remat policy")
    assert "or auto (with --memory-budget)" in line


def test_an_empty_mesh_is_refused_not_ignored(capsys, tmp_path):
    refused(capsys, _train(tmp_path, "--mesh", ""), "--mesh is empty")


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", ["is empty", "[model] preset"]),
        (b'name = "x"\n[train]\nsteps = 3\n', ["has no [model] section"]),
        (bytes(range(128, 256)), ["is not text"]),
    ],
    ids=["empty", "no-model", "binary"],
)
def test_a_recipe_file_that_is_not_a_recipe_is_refused(capsys, tmp_path, content, words):
    path = tmp_path / "recipe.toml"
    path.write_bytes(content)
    refused(capsys, ["train", str(path), "--out", str(tmp_path / "run")], str(path), *words)


def test_a_directory_named_like_a_recipe_is_refused(capsys, tmp_path):
    (tmp_path / "dir.toml").mkdir()
    refused(capsys, ["train", str(tmp_path / "dir.toml")], "is a directory, not a .toml file")


def test_a_seq_len_longer_than_the_data_is_refused_before_a_model_exists(capsys, tmp_path):
    refused(
        capsys,
        _train(tmp_path, "--set", "data.seq_len=100000", recipe="python-docs-lm"),
        "data.seq_len=100000 is longer than the data",
        "eval tokens",
    )


def test_a_seq_len_longer_than_the_model_context_needs_max_len_too(capsys, tmp_path):
    refused(
        capsys,
        _train(tmp_path, "--set", "data.seq_len=1000", recipe="python-docs-lm"),
        "longer than the context of 'transformer-s' (max_len=128)",
        "model.max_len=1000",
    )


def test_epsilon_can_be_unset_for_a_noise_multiplier(capsys, tmp_path):
    argv = _train(
        tmp_path, "--steps", "1", "--json", "--set", "dp.noise_multiplier=1.0", recipe="digits-mlp-dp"
    )
    line = refused(capsys, argv, "set exactly one of epsilon", "--set dp.epsilon=none")
    assert "noise_multiplier=1.0" in line
    assert main([*argv, "--set", "dp.epsilon=none"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["noise_multiplier"] == 1.0 and summary["epsilon"] > 0


def test_a_batch_over_the_rows_and_a_long_warmup_warn_saying_what_happens(capsys, tmp_path):
    argv = _train(tmp_path, "--steps", "2", "--json", "--set", "train.batch_size=100000")
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == 2, err
    assert "train.batch_size=100000 is larger than the 1,437 training rows" in lines[0]
    assert "with replacement" in lines[0]
    assert "optim.warmup_steps=20 is longer than the 2 steps" in lines[1] and "10% of optim.lr" in lines[1]


def test_a_huge_vocab_multiple_is_refused_before_anything_is_allocated(capsys, tmp_path):
    """Issue 67, item 5: --set model.vocab_multiple=10^12 printed a 257-trillion-parameter table,
    then a RESOURCE_EXHAUSTED traceback, and left an empty --out."""
    argv = _train(tmp_path, "--set", "model.vocab_multiple=1000000000000", recipe="python-docs-llama")
    refused(capsys, argv, "vocab_multiple must be an int in [1, 65,536]", "1000000000000")
    assert not (tmp_path / "run").exists()


def test_an_empty_lora_is_refused_not_ignored(capsys, tmp_path):
    """Issue 67, item 4: the section flags share one path (SECTION_FLAGS); --lora '' was skipped."""
    refused(capsys, _train(tmp_path, "--lora", ""), "--lora '' names no rank")
