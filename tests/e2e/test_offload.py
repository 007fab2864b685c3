"""[train] offload (and update_on) through whole runs: the summary says it, the step compiles
once (with the update on the host: its two programs, once each), and a resumed offloaded run
ends bit for bit where the uninterrupted one does."""

import jax
import numpy as np
import pytest

from tests.conftest import reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo import recipes
from zoo.commands import settings
from zoo.train import checkpoint
from zoo.train.loop import train_recipe

# A resumed run compiles the program its whole twin compiled: it is read back from the run's
# persistent compilation cache (tests/conftest.py).


def recipe(steps: int, offload: str, update_on: str = "device"):
    values = {
        "train.update_on": update_on,
        "train.steps": steps,
        "train.checkpoint_every": 2,
        "train.eval_every": 2,
        "train.eval_batches": 1,
        "train.offload": offload,
        "train.tensorboard": False,
    }
    return settings.with_values(recipes.load_recipe("digits-mlp"), values)


def resume(tmp_path, offload: str, first: str | None = None, update_on: str = "device") -> list[dict]:
    """The params of a 4-step run and of the same run stopped at 2 (under ``first``, default
    ``offload``) and resumed to 4 under ``offload``, the update on ``update_on``."""
    whole = train_recipe(recipe(4, offload, update_on), tmp_path / "whole", show_progress=False)
    train_recipe(recipe(2, first or offload, update_on), tmp_path / "parts", show_progress=False)
    parts = train_recipe(recipe(4, offload, update_on), tmp_path / "parts", resume=True, show_progress=False)
    assert whole["offload"] == parts["offload"] == offload
    assert whole["update_on"] == parts["update_on"] == update_on
    programs = 2 if update_on == "host" else 1  # the device's gradient, the host's update (float32)
    assert whole["compile_count"] == parts["compile_count"] == programs
    return [checkpoint.load_checkpoint(tmp_path / d).params for d in ("whole", "parts")]


def check_resume(tmp_path, offload: str, update_on: str = "device") -> None:
    whole, parts = resume(tmp_path, offload, update_on=update_on)
    assert_bitwise_equal(parts, whole)


@pytest.mark.parametrize("update_on", ["device", "host"])
def test_an_offloaded_run_resumes_bitwise(tmp_path, update_on):
    check_resume(tmp_path, "optimizer+params", update_on)


@pytest.mark.numerics
def test_a_run_may_resume_under_another_offload(tmp_path):
    """Where the state waits between steps is not the math: the setting may change on resume
    (as train.remat may), and the run ends where the uninterrupted one does, to rounding."""
    whole, parts = resume(tmp_path, "optimizer", first="none")
    shipped = recipe(4, "none")
    n = reduction_size(shipped.model_config, shipped.train.batch_size) * shipped.train.steps
    for a, e in zip(jax.tree.leaves(parts), jax.tree.leaves(whole), strict=True):
        assert_close(np.asarray(a), np.asarray(e), n=n, what="params")


@pytest.mark.parametrize("update_on", ["device", "host"])
def test_the_resume_check_catches_moments_not_restored(tmp_path, monkeypatch, update_on):
    """Planted: the resumed run starts its moments afresh (the saved ones never come back)."""
    restore = checkpoint.restore_state

    def fresh_moments(run_dir, step, abstract):
        import dataclasses

        return dataclasses.replace(restore(run_dir, step, abstract), opt_state=abstract.opt_state)

    monkeypatch.setattr(checkpoint, "restore_state", fresh_moments)
    with pytest.raises(AssertionError):
        check_resume(tmp_path, "optimizer+params" if update_on == "host" else "optimizer", update_on)
