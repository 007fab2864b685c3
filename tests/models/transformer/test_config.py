"""The GPT-2 presets against Hugging Face's configs of openai-community/gpt2 and gpt2-medium:
the parameter count from GPT-2's own layout, and the config `zoo import` makes of them."""

from __future__ import annotations

import math

import jax
import pytest

import zoo
from zoo.models import canonical
from zoo.models.transformer import hf

# The shape fields of the Hub's config.json of each model.
HF_CONFIGS = {
    "gpt2-124m": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12},
    "gpt2-355m": {"vocab_size": 50257, "n_positions": 1024, "n_embd": 1024, "n_layer": 24, "n_head": 16},
}
COUNTS = {"gpt2-124m": 124_439_808, "gpt2-355m": 354_823_168}  # GPT2LMHeadModel, tied head


def hf_count(fields: dict) -> int:
    """GPT-2's parameters from its own layout: wte, wpe, per block ln_1, c_attn (d x 3d + 3d),
    c_proj (d x d + d), ln_2, c_fc (d x 4d + 4d), mlp c_proj (4d x d + d), then ln_f."""
    d, ff = fields["n_embd"], 4 * fields["n_embd"]
    block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (d * ff + ff) + (ff * d + d)
    return fields["vocab_size"] * d + fields["n_positions"] * d + fields["n_layer"] * block + 2 * d


@pytest.mark.parametrize("preset", HF_CONFIGS)
def test_a_gpt2_presets_parameter_count_is_hugging_faces(preset):
    shapes = jax.eval_shape(lambda: canonical.init_params(zoo.get_config(preset), 0))
    count = sum(math.prod(a.shape) for a in jax.tree.leaves(shapes))
    assert count == hf_count(HF_CONFIGS[preset]) == COUNTS[preset]


@pytest.mark.parametrize("preset", HF_CONFIGS)
def test_zoo_import_of_the_hub_config_is_the_preset(preset):
    assert hf.config_from_hf(HF_CONFIGS[preset]) == zoo.get_config(preset)
