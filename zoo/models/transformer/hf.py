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
            raise ValueError(
                f"{name} = {fields[name]!r} is not supported; supported: {', '.join(map(str, allowed))}"
            )
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
    if cfg.is_classifier or cfg.takes_features:
        what = f"a classifier (num_classes={cfg.num_classes})" if cfg.is_classifier else "a model of features"
        raise ValueError(
            f"this transformer is {what}; GPT-2 is a language model over token ids, so it has no "
            "GPT-2 form (export it with --format zoo)"
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
        "tie_word_embeddings": cfg.tie_head,  # untied: lm_head.weight (export_leaves)
        "scale_attn_weights": True,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def export_leaves(cfg: TransformerConfig, flat: dict) -> dict:
    """The leaves GPT-2 expects, from a transformer trained in zoo: zero attention biases when
    it has none (``attn_bias=False``: the same math). An untied head exports as ``lm_head``
    only without a bias: GPT-2's head has none, so a trained ``head.b`` is refused."""
    import numpy as np

    out = dict(flat)
    if not cfg.attn_bias:
        for name in ("q", "k", "v", "o"):
            w = np.asarray(flat[f"blocks.attn.{name}.w"])
            out[f"blocks.attn.{name}.b"] = np.zeros((w.shape[0], w.shape[-1]), w.dtype)
    if "head.b" in flat and np.any(np.asarray(flat["head.b"]) != 0):
        raise ValueError(
            "the model's LM head has a bias (head.b, nonzero after training) and GPT-2's LM head has none, "
            "so GPT-2 cannot give its logits; train with model.tie_head=true to export as GPT-2"
        )
    return out


def tensors(cfg: TransformerConfig) -> list[Tensor]:
    h = "transformer.h.{i}."
    head = [] if cfg.tie_head else [Tensor("lm_head.weight", ("head.w",), transpose=True)]
    return head + [
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
