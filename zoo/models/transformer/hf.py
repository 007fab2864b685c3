"""GPT-2 checkpoints (``model_type: gpt2``) <-> the transformer kind.

GPT-2's ``Conv1D`` weights are already ``[in, out]``; ``c_attn`` holds q, k and v side by
side; the LM head is the token embedding (no ``lm_head`` tensor, no bias). Read by
:mod:`zoo.models.hf_io`.
"""

from __future__ import annotations

from zoo.models.hf_io import Tensor
from zoo.models.transformer.config import TransformerConfig

MODEL_TYPES = ("gpt2",)
ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")  # both the tanh approximation, jax.nn.gelu's
# Fields that change the math: the values zoo computes (None: absent is fine too)
_REQUIRED = {
    "scale_attn_weights": (True,),
    "scale_attn_by_inverse_layer_idx": (False,),
    "add_cross_attention": (False,),
    "tie_word_embeddings": (True,),
}


def config_from_hf(fields: dict) -> TransformerConfig:
    act = fields.get("activation_function", "gelu_new")
    if act not in ACTIVATIONS:
        raise ValueError(
            f"activation_function = {act!r} is not supported; supported: {', '.join(ACTIVATIONS)}"
        )
    for name, allowed in _REQUIRED.items():
        if name in fields and fields[name] not in allowed:
            raise ValueError(f"{name} = {fields[name]!r} is not supported; supported: {list(allowed)}")
    d = fields["n_embd"]
    return TransformerConfig(
        vocab_size=fields["vocab_size"],
        d_model=d,
        num_heads=fields["n_head"],
        num_layers=fields["n_layer"],
        max_len=fields["n_positions"],
        d_ff=fields.get("n_inner") or 4 * d,
        attn_bias=True,
        tie_head=True,
        ln_eps=fields.get("layer_norm_epsilon", 1e-5),
    )


def config_to_hf(cfg: TransformerConfig) -> dict:
    if not cfg.tie_head or not cfg.attn_bias:
        raise ValueError(
            "a transformer exports as GPT-2 only with tie_head=True and attn_bias=True "
            f"(got tie_head={cfg.tie_head}, attn_bias={cfg.attn_bias})"
        )
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": cfg.vocab_size,
        "n_positions": cfg.max_len,
        "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": cfg.d_ff,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": cfg.ln_eps,
        "tie_word_embeddings": True,
        "scale_attn_weights": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def tensors(cfg: TransformerConfig) -> list[Tensor]:
    del cfg
    h = "transformer.h.{i}."
    return [
        Tensor("transformer.wte.weight", ("embed.w",)),
        Tensor("transformer.wpe.weight", ("pos.w",)),
        Tensor(h + "ln_1.weight", ("blocks.ln1.scale",)),
        Tensor(h + "ln_1.bias", ("blocks.ln1.b",)),
        Tensor(h + "attn.c_attn.weight", ("blocks.attn.q.w", "blocks.attn.k.w", "blocks.attn.v.w")),
        Tensor(h + "attn.c_attn.bias", ("blocks.attn.q.b", "blocks.attn.k.b", "blocks.attn.v.b")),
        Tensor(h + "attn.c_proj.weight", ("blocks.attn.o.w",)),
        Tensor(h + "attn.c_proj.bias", ("blocks.attn.o.b",)),
        Tensor(h + "ln_2.weight", ("blocks.ln2.scale",)),
        Tensor(h + "ln_2.bias", ("blocks.ln2.b",)),
        Tensor(h + "mlp.c_fc.weight", ("blocks.mlp.up.w",)),
        Tensor(h + "mlp.c_fc.bias", ("blocks.mlp.up.b",)),
        Tensor(h + "mlp.c_proj.weight", ("blocks.mlp.down.w",)),
        Tensor(h + "mlp.c_proj.bias", ("blocks.mlp.down.b",)),
        Tensor("transformer.ln_f.weight", ("ln_f.scale",)),
        Tensor("transformer.ln_f.bias", ("ln_f.b",)),
    ]
