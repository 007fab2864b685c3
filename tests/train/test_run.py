"""The built run (zoo.train.run): its initial params are let go once the train state holds them."""

import gc
import weakref

import jax

from zoo import recipes
from zoo.commands import settings
from zoo.train import loop
from zoo.train.loop import train_recipe


def quick(**values):
    return settings.with_values(
        recipes.load_recipe("digits-mlp"),
        {
            "train.steps": 2,
            "train.eval_every": 1,
            "train.checkpoint_every": 2,
            "train.eval_batches": 1,
            **values,
        },
    )


def test_the_initial_params_are_not_resident_while_training(tmp_path, monkeypatch):
    """The state owns a copy of the trainable weights; the run's initial ones must not stay
    resident beside it for the whole run (on a chip: twice the weights in HBM)."""
    seen = {}

    def on_built(run):
        seen["run"] = run
        seen["initial"] = [weakref.ref(x) for x in jax.tree.leaves(run.params)]

    alive = []
    evaluate = loop.run_evaluation

    def probe(run, state, frozen):  # mid-run: after the first step, before the second
        gc.collect()
        alive.append(sum(ref() is not None for ref in seen["initial"]))
        assert run.params is None
        return evaluate(run, state, frozen)

    monkeypatch.setattr(loop, "run_evaluation", probe)
    summary = train_recipe(quick(), tmp_path / "a", show_progress=False, on_built=on_built)
    assert seen["initial"] and alive and alive == [0] * len(alive)
    resumed = train_recipe(quick(**{"train.steps": 3}), tmp_path / "a", resume=True, show_progress=False)
    assert resumed["steps"] == 3 and summary["steps"] == 2
