"""The activation-name vocabulary: the contract between models and remat recipes.

Models tag tensors with :func:`jax.ad_checkpoint.checkpoint_name` using only these names.
Recipes (``zoo.remat``) decide which named tensors may be saved on device, offloaded to host
memory, or recomputed. Both backends tag the same tensors with the same names.
"""

from __future__ import annotations

LAYER_INPUT = "layer_input"  # input of each scanned block: the scan carry
ATTN_Q = "attn_q"  # query projection  [B, T, D]
ATTN_K = "attn_k"  # key projection    [B, T, D]
ATTN_V = "attn_v"  # value projection  [B, T, D]
ATTN_CONTEXT = "attn_context"  # softmax(QK^T / sqrt(d)) V, before the output projection
ATTN_OUT = "attn_out"  # attention output projection
MLP_GATE = "mlp_gate"  # gate projection of a gated MLP (SwiGLU), before its nonlinearity
MLP_HIDDEN = "mlp_hidden"  # up-projection, before the nonlinearity (gated MLP: the linear branch)
MLP_OUT = "mlp_out"  # down-projection (MLP model: the activated block output)
LOGITS = "logits"  # model output

ALL = (
    LAYER_INPUT,
    ATTN_Q,
    ATTN_K,
    ATTN_V,
    ATTN_CONTEXT,
    ATTN_OUT,
    MLP_GATE,
    MLP_HIDDEN,
    MLP_OUT,
    LOGITS,
)

# Names that only the transformer emits; the MLP's blocks tag the rest.
TRANSFORMER_ONLY = (ATTN_Q, ATTN_K, ATTN_V, ATTN_CONTEXT, ATTN_OUT)
PROJECTIONS = (ATTN_Q, ATTN_K, ATTN_V, ATTN_OUT, MLP_GATE, MLP_HIDDEN, MLP_OUT)
