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
