"""Llama-family checkpoints (``model_type: llama``: Llama 2/3/3.1/3.2, TinyLlama, SmolLM) <->
the Llama kind.

PyTorch ``Linear`` weights are ``[out, in]`` (transposed on the way in and out). The rotary
layout is Hugging Face's rotate-half, zoo's own (``ops.rotary``). Read by
:mod:`zoo.models.hf_io`.
"""

from __future__ import annotations

from zoo.models.hf_io import Tensor
from zoo.models.llama.config import LlamaConfig

MODEL_TYPES = ("llama",)
ROPE_TYPES = ("default", "llama3")
_REQUIRED = {  # fields that change the math: the values zoo computes
    "hidden_act": ("silu",),
    "attention_bias": (False,),
    "mlp_bias": (False,),
    "sliding_window": (None,),
}


def _rope(fields: dict) -> dict:
    """Rotary parameters from transformers 5's ``rope_parameters`` or 4's ``rope_theta`` and
    ``rope_scaling``."""
    params = dict(fields.get("rope_parameters") or fields.get("rope_scaling") or {})
    params.setdefault("rope_theta", fields.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type")) or "default"
    if kind not in ROPE_TYPES:
        raise ValueError(f"rope_scaling type = {kind!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
    out = {"rope_theta": float(params["rope_theta"])}
    needed = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    missing = [name for name in needed if kind == "llama3" and name not in params]
    if missing:
        raise ValueError(
            f"rope_scaling of type 'llama3' lacks {', '.join(missing)} (it needs {', '.join(needed)})"
        )
    if kind == "llama3":
        out |= {
            "rope_scaling": "llama3",
            "rope_factor": float(params["factor"]),
            "rope_low_freq_factor": float(params["low_freq_factor"]),
            "rope_high_freq_factor": float(params["high_freq_factor"]),
            "rope_original_max_len": int(params["original_max_position_embeddings"]),
        }
    return out


def tied_copies(cfg: LlamaConfig) -> dict[str, str]:
    """A tied head that a file stores anyway (some Llama 3.2 exports): equal to the embedding."""
    return {"lm_head.weight": "embed.w"} if cfg.tie_head else {}


def config_from_hf(fields: dict) -> LlamaConfig:
    for name, allowed in _REQUIRED.items():
        if fields.get(name, allowed[0]) not in allowed:
            raise ValueError(
                f"{name} = {fields[name]!r} is not supported; supported: {', '.join(map(str, allowed))}"
            )
    heads = fields["num_attention_heads"]
    head_dim = fields.get("head_dim") or fields["hidden_size"] // heads
    return LlamaConfig(
        vocab_size=fields["vocab_size"],
        d_model=fields["hidden_size"],
        num_heads=heads,
        num_kv_heads=fields.get("num_key_value_heads") or heads,
        num_layers=fields["num_hidden_layers"],
        d_ff=fields["intermediate_size"],
        max_len=fields["max_position_embeddings"],
        norm_eps=float(fields.get("rms_norm_eps", 1e-6)),
        head_dim=0 if head_dim * heads == fields["hidden_size"] else head_dim,
        tie_head=bool(fields.get("tie_word_embeddings", False)),
        **_rope(fields),
    )


def config_to_hf(cfg: LlamaConfig) -> dict:
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling == "llama3":
        rope |= {
            "rope_type": "llama3",
            "factor": cfg.rope_factor,
            "low_freq_factor": cfg.rope_low_freq_factor,
            "high_freq_factor": cfg.rope_high_freq_factor,
            "original_max_position_embeddings": cfg.rope_original_max_len,
        }
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.d_head,
        "max_position_embeddings": cfg.max_len,
        "rms_norm_eps": cfg.norm_eps,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": cfg.tie_head,
        "rope_parameters": rope,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None if rope["rope_type"] == "default" else rope,
    }


def tensors(cfg: LlamaConfig) -> list[Tensor]:
    layer = "model.layers.{i}."
    out = [
        Tensor("model.embed_tokens.weight", ("embed.w",)),
        Tensor(layer + "input_layernorm.weight", ("blocks.attn_norm.scale",)),
        Tensor(layer + "self_attn.q_proj.weight", ("blocks.attn.q.w",), transpose=True),
        Tensor(layer + "self_attn.k_proj.weight", ("blocks.attn.k.w",), transpose=True),
        Tensor(layer + "self_attn.v_proj.weight", ("blocks.attn.v.w",), transpose=True),
        Tensor(layer + "self_attn.o_proj.weight", ("blocks.attn.o.w",), transpose=True),
        Tensor(layer + "post_attention_layernorm.weight", ("blocks.mlp_norm.scale",)),
        Tensor(layer + "mlp.gate_proj.weight", ("blocks.mlp.gate.w",), transpose=True),
        Tensor(layer + "mlp.up_proj.weight", ("blocks.mlp.up.w",), transpose=True),
        Tensor(layer + "mlp.down_proj.weight", ("blocks.mlp.down.w",), transpose=True),
        Tensor("model.norm.weight", ("norm_f.scale",)),
    ]
    if not cfg.tie_head:
        out.append(Tensor("lm_head.weight", ("head.w",), transpose=True))
    return out
