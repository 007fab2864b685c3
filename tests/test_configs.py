"""zoo.configs: a recipe section's refusal names the key a user writes (``train.steps``, as
``--set`` and the recipe's TOML spell it), not the class that holds it (``TrainConfig.steps``)."""

from __future__ import annotations

import re

import pytest

from zoo.configs import MeshConfig, TrainConfig
from zoo.errors import ZooError
from zoo.models.llama.config import LlamaConfig
from zoo.models.mlp.config import MLPConfig
from zoo.models.transformer.config import TransformerConfig


@pytest.mark.parametrize(
    "make, key",
    [
        (lambda: TrainConfig(steps=0), "train.steps"),
        (lambda: TrainConfig(checkpoint_every=-1), "train.checkpoint_every"),
        (lambda: MeshConfig(fsdp=0), "mesh.fsdp"),
        (lambda: TransformerConfig(num_layers=0), "model.num_layers"),
        (lambda: LlamaConfig(num_kv_heads=0), "model.num_kv_heads"),
        (lambda: MLPConfig(d_hidden=-2), "model.d_hidden"),
    ],
)
def test_a_refusal_names_the_recipe_key(make, key):
    with pytest.raises(ZooError, match=rf"^{re.escape(key)} must be a positive int; got -?\d+\.$"):
        make()
