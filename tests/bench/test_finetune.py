"""``zoo bench finetune``'s LoRA model start: the one a LoRA ``zoo train`` run makes."""

from types import SimpleNamespace

import jax
import numpy as np

from zoo import recipes
from zoo.bench.finetune import lora_start
from zoo.models import canonical
from zoo.train import stages
from zoo.train.task import fit_model_to_task


def test_lora_start_is_the_lora_model_start_of_zoo_train(monkeypatch):
    """The bench's LoRA start on a base equals the model start stage's on a checkpoint of that
    base: the adapted config, the params (base kept, adapters drawn from the seed), the freeze
    plan and the adapter setup."""
    recipe = recipes.load_recipe("digits-transformer-dp-lora")
    task = stages.load_data(recipe)
    base_cfg = fit_model_to_task(recipe.model_config, task, recipe.model.preset, dict(recipe.model.overrides))
    base = canonical.init_params(base_cfg, 3)
    source = SimpleNamespace(model_config=base_cfg, params=base, tokenizer=None)
    # A base with no file behind it: the reference a LoRA run records of it is not compared.
    monkeypatch.setattr(stages.checkpoint, "base_reference", lambda source: {})
    trained = stages.model_start(recipe, task, source)
    benched = lora_start(base_cfg, base, recipe.lora, seed=recipe.train.seed)
    assert benched.cfg == trained.cfg and benched.adapters == trained.adapters
    assert benched.freeze == trained.freeze and benched.freeze.trainable_count > 0
    assert jax.tree.structure(benched.params) == jax.tree.structure(trained.params)
    jax.tree.map(np.testing.assert_array_equal, benched.params, trained.params)


def test_the_bench_says_each_compile_and_round_as_it_starts():
    """A bench of minutes prints as it goes (issue 67): every compile, the warm-up and every
    timing round, in order, before the table."""
    from zoo.bench.finetune import bench_finetune

    heard = []
    bench_finetune("transformer-xs", batch=2, layers=2, steps=1, repeats=2, progress=heard.append)
    assert heard == [
        "finetune bench: compiling full",
        "finetune bench: compiling frozen",
        "finetune bench: a warm-up step of each of 2 runs",
        "finetune bench: timing round 1/2",
        "finetune bench: timing round 2/2",
    ]


def test_the_cli_prints_the_progress_on_stderr_unless_quiet(capsys, monkeypatch):
    import zoo.bench.finetune as finetune
    from zoo.cli import main

    def bench(model, *, progress, **kwargs):  # the bench itself: the test above
        if progress is not None:
            progress("finetune bench: compiling full")
        return {"freeze": [], "rows": []}

    monkeypatch.setattr(finetune, "bench_finetune", bench)
    for quiet, lines in (([], ["finetune bench: compiling full"]), (["--quiet"], [])):
        assert main(["bench", "finetune", "mlp-s", "--json", *quiet]) == 0
        assert capsys.readouterr().err.splitlines() == lines
