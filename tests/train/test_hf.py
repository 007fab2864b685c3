"""What ``zoo import`` records for a checkpoint: the preset its shapes land on."""

from __future__ import annotations

import dataclasses

import pytest

from tests.models.llama.test_config import HF_CONFIGS
from zoo.models.llama import hf as llama_hf
from zoo.recipes import parse_recipe
from zoo.train.hf import _recipe_dict


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_an_import_of_llama_3_2_lands_on_its_preset(preset):
    cfg = llama_hf.config_from_hf(HF_CONFIGS[preset])  # what hf_io.load reads from config.json
    recipe = parse_recipe(_recipe_dict(cfg, "nnx", f"meta-llama/{preset}"))
    assert recipe.model.preset == preset
    assert recipe.model_config == cfg


def test_an_import_of_other_shapes_keeps_the_first_preset_with_its_fields():
    cfg = dataclasses.replace(llama_hf.config_from_hf(HF_CONFIGS["llama-1b"]), num_layers=2)
    recipe = parse_recipe(_recipe_dict(cfg, "nnx", "tiny"))
    assert recipe.model.preset == "llama-xs" and recipe.model_config == cfg
