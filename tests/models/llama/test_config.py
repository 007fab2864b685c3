"""The Llama 3.2 presets against Hugging Face's configs of the same models."""

from __future__ import annotations

import math

import jax
import pytest

import zoo
from zoo.models import canonical
from zoo.models.llama import hf

# The config.json of meta-llama/Llama-3.2-1B and -3B, as the Hub serves them (fields that change
# no shape or math, such as token ids and torch_dtype, left out).
_ROPE = {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3",
}
_COMMON = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "intermediate_size": 8192,
    "max_position_embeddings": 131072,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05,
    "rope_scaling": _ROPE,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "vocab_size": 128256,
}
HF_CONFIGS = {
    "llama-1b": {
        **_COMMON,
        "head_dim": 64,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_hidden_layers": 16,
    },
    "llama-3b": {
        **_COMMON,
        "head_dim": 128,
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "num_hidden_layers": 28,
    },
}


def hf_parameter_count(c: dict) -> int:
    """``LlamaForCausalLM``'s parameter count from its config, module by module as
    ``transformers`` builds it: embed_tokens, per layer q/k/v/o, gate/up/down and two RMSNorm
    weights, the final norm, and lm_head unless tied."""
    d, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    head_dim = c.get("head_dim") or d // heads
    attention = d * heads * head_dim + 2 * d * kv * head_dim + heads * head_dim * d
    layer = attention + 3 * d * c["intermediate_size"] + 2 * d
    head = 0 if c["tie_word_embeddings"] else c["vocab_size"] * d
    return c["vocab_size"] * d + c["num_hidden_layers"] * layer + d + head


@pytest.mark.parametrize("preset, count", [("llama-1b", 1_235_814_400), ("llama-3b", 3_212_749_824)])
def test_presets_hold_the_hugging_face_models_parameter_count(preset, count):
    assert hf_parameter_count(HF_CONFIGS[preset]) == count  # the model cards' figures
    cfg = zoo.get_config(preset)
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg))  # shapes only: nothing allocated
    assert sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(shapes)) == count


@pytest.mark.parametrize("preset", list(HF_CONFIGS))
def test_hugging_face_configs_map_onto_the_presets_and_back(preset):
    cfg = zoo.get_config(preset)
    assert hf.config_from_hf(HF_CONFIGS[preset]) == cfg
    assert cfg.rope_scaling == "llama3" and cfg.rope_freq() is not None  # Llama 3.2's scaled rotary
    assert hf.config_from_hf(hf.config_to_hf(cfg)) == cfg


@pytest.mark.parametrize("name", ["llama-1b-tokens", "llama-1b-tokens-lora"])
def test_the_llama_1b_recipes_are_listed_and_validate(capsys, name):
    import json

    from zoo import recipes
    from zoo.cli import main

    assert main(["recipes", "--json"]) == 0
    listed = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    assert listed[name]["model"] == "llama-1b" and listed[name]["dataset"].startswith("tokens:")
    recipe = recipes.load_recipe(name)  # every section validated
    cfg = recipe.model_config
    assert cfg == zoo.get_config("llama-1b") and recipe.data.seq_len <= cfg.max_len
    assert recipe.lora.enabled == name.endswith("-lora") and recipe.train.precision == "bfloat16"
