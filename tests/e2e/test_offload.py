"""[train] offload through whole runs: the summary says it, the step compiles once, and a
resumed offloaded run ends bit for bit where the uninterrupted one does."""

import pytest

from tests.numerics import assert_bitwise_equal
from zoo import recipes
from zoo.commands import settings
from zoo.train import checkpoint
from zoo.train.loop import train_recipe


def recipe(steps: int, offload: str):
    values = {
        "train.steps": steps,
        "train.checkpoint_every": 2,
        "train.eval_every": 2,
        "train.eval_batches": 1,
        "train.offload": offload,
        "train.tensorboard": False,
    }
    return settings.with_values(recipes.load_recipe("digits-mlp"), values)


def check_resume(tmp_path, offload: str) -> None:
    whole = train_recipe(recipe(4, offload), tmp_path / "whole", show_progress=False)
    train_recipe(recipe(2, offload), tmp_path / "parts", show_progress=False)
    parts = train_recipe(recipe(4, offload), tmp_path / "parts", resume=True, show_progress=False)
    assert whole["offload"] == parts["offload"] == offload
    assert whole["compile_count"] == parts["compile_count"] == 1
    ends = [checkpoint.load_checkpoint(tmp_path / d).params for d in ("whole", "parts")]
    assert_bitwise_equal(ends[1], ends[0])


def test_an_offloaded_run_resumes_bitwise(tmp_path):
    check_resume(tmp_path, "optimizer+params")


def test_the_resume_check_catches_moments_not_restored(tmp_path, monkeypatch):
    """Planted: the resumed run starts its moments afresh (the saved ones never come back)."""
    restore = checkpoint.restore_state

    def fresh_moments(run_dir, step, abstract):
        import dataclasses

        return dataclasses.replace(restore(run_dir, step, abstract), opt_state=abstract.opt_state)

    monkeypatch.setattr(checkpoint, "restore_state", fresh_moments)
    with pytest.raises(AssertionError):
        check_resume(tmp_path, "optimizer")
