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


def test_eval_reads_the_same_windows_a_microbatch_at_a_time():
    """With train.microbatch_size the eval step takes a microbatch at a time (at the whole batch
    it would hold every row's activations at once: a DP step's 1,024 GPT-2 windows' logits are
    200 GB), over the same rows that eval_batches batches of the whole batch read."""
    from tests.numerics import assert_close
    from zoo.train.engine import evaluate
    from zoo.train.run import build_run
    from zoo.train.summary import run_evaluation

    run = build_run(quick(**{"train.batch_size": 8, "train.microbatch_size": 2, "train.eval_batches": 3}))
    assert (run.batch_rows, run.eval_rows, run.eval_batch_count) == (8, 2, 12)
    state, frozen = run.engine.init_state(run.params, 0)
    seen = []
    batches = run.task.eval_batches(run.eval_rows, run.eval_batch_count)
    got = evaluate(run.engine, state, frozen, (seen.append(len(b["mask"])) or b for b in batches))
    whole = evaluate(run.engine, state, frozen, run.task.eval_batches(8, 3))
    # a classifier's eval reads its whole eval split (eval_batches caps an LM's windows)
    assert set(seen) == {2} and got["eval_count"] == whole["eval_count"] == 2 * len(seen)
    assert_close(got["eval_loss"], whole["eval_loss"], n=len(seen) * 2)
    assert run_evaluation(run, state, frozen)["eval_loss"] == got["eval_loss"]
