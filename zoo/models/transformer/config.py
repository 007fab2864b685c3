"""The decoder-only transformer kind: config, presets and what zoo needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import jax
import jax.numpy as jnp

from zoo import names
from zoo.configs import require_positive
from zoo.errors import ZooError
from zoo.models.ops import check_features, check_length
from zoo.models.registry import DataFit, axes_from_table, register
from zoo.models.sequence import SequenceConfig

# Logical axes of each leaf (without the stack's leading ``layers`` axis); ``heads`` is the
# fused heads x head-width axis of a projection.
_AXES = {
    "embed.w": ("vocab", "embed"),
    "embed.b": ("embed",),
    "pos.w": ("positions", "embed"),
    "ln1.scale": ("embed",),
    "ln1.b": ("embed",),
    "attn.q.w": ("embed", "heads"),
    "attn.q.b": ("heads",),
    "attn.k.w": ("embed", "heads"),
    "attn.k.b": ("heads",),
    "attn.v.w": ("embed", "heads"),
    "attn.v.b": ("heads",),
    "attn.o.w": ("heads", "embed"),
    "attn.o.b": ("embed",),
    "ln2.scale": ("embed",),
    "ln2.b": ("embed",),
    "mlp.up.w": ("embed", "mlp"),
    "mlp.up.b": ("mlp",),
    "mlp.down.w": ("mlp", "embed"),
    "mlp.down.b": ("embed",),
    "ln_f.scale": ("embed",),
    "ln_f.b": ("embed",),
    "head.w": ("embed", "vocab"),
    "head.b": ("vocab",),
}


@dataclass(frozen=True)
class TransformerConfig(SequenceConfig):
    """Decoder-only transformer: pre-LayerNorm, causal multi-head attention, GELU MLP,
    learned positional embeddings. The decoder fields, token inputs and chunking options are
    :class:`zoo.models.sequence.SequenceConfig`'s.

    Inputs are token ids [B, T] (``d_in == 0``) or feature vectors [B, T, d_in] (``d_in > 0``,
    e.g. the 8 rows of an 8x8 digit). The head is a language-model head over the vocabulary
    (``num_classes == 0``) or a mean-pooled classifier (``num_classes > 0``).

    GPT-2's checkpoints (``zoo.models.transformer.hf``) set ``attn_bias`` (biases on the four
    attention projections), ``tie_head`` (the LM head is the token embedding transposed, no
    bias, no ``head`` leaf) and ``ln_eps``; the defaults are zoo's own transformer.
    """

    kind: ClassVar[str] = "transformer"
    activation_names: ClassVar[tuple[str, ...]] = tuple(n for n in names.ALL if n != names.MLP_GATE)
    d_ff: int = 256
    d_in: int = 0
    num_classes: int = 0
    attn_bias: bool = False  # biases on the q, k, v and output projections (GPT-2)
    tie_head: bool = False  # LM head = embed.w transposed, no bias (GPT-2)
    ln_eps: float = 1e-5

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "d_ff", section="model")
        if self.d_in < 0 or self.num_classes < 0:
            raise ZooError(f"d_in and num_classes must be >= 0, got {self.d_in}, {self.num_classes}")
        if self.tie_head and (self.takes_features or self.is_classifier):
            raise ZooError("tie_head needs a language model over token ids (d_in=0, num_classes=0)")
        if not self.ln_eps > 0:
            raise ZooError(f"ln_eps must be > 0, got {self.ln_eps}")

    @property
    def is_classifier(self) -> bool:
        return self.num_classes > 0

    @property
    def takes_features(self) -> bool:
        return self.d_in > 0

    @property
    def out_dim(self) -> int:
        return self.num_classes if self.is_classifier else self.vocab_size

    @property
    def head_width(self) -> int:
        """Columns of an untied head: the classes, or the (padded) token table's rows."""
        return self.num_classes if self.is_classifier else self.table_rows

    # --- the registry protocol (zoo.models.registry.ModelConfig) -----------------------------
    @property
    def task(self) -> str:
        return "classify" if self.is_classifier else "lm"

    @property
    def num_outputs(self) -> int:
        return self.out_dim

    # Feature inputs [B, T, d_in] here; token ids are SequenceConfig's.
    def input_spec(self, batch: int, seq: int | None = None) -> jax.ShapeDtypeStruct:
        if not self.takes_features:
            return super().input_spec(batch, seq)
        return jax.ShapeDtypeStruct((batch, self.seq_or_default(seq), self.d_in), jnp.float32)

    def example_input(self, key: jax.Array, batch: int, seq: int | None = None) -> jax.Array:
        if not self.takes_features:
            return super().example_input(key, batch, seq)
        spec = self.input_spec(batch, seq)
        return jax.random.uniform(key, spec.shape, spec.dtype)

    def check_input(self, x: jax.Array) -> None:
        if not self.takes_features:
            return super().check_input(x)
        check_features(x, self.d_in, "[B, T, d_in]")
        check_length(x.shape[1], self.max_len)

    def check_input_values(self, x: jax.Array) -> None:
        if not self.takes_features:
            super().check_input_values(x)

    def fit_to_data(self, data: DataFit) -> dict:
        if not self.is_classifier:  # an LM (the data is loaded for cfg.task)
            # the model's own context, when longer than the data's, is kept
            max_len = max(self.max_len, data.seq_len)
            return {"vocab_size": data.vocab_size, "num_classes": 0, "d_in": 0, "max_len": max_len}
        if not data.row_shape:
            raise ZooError(
                f"a transformer classifier needs data.layout='rows' (got 'flat') for {data.dataset!r}"
            )
        rows, width = data.row_shape
        return {"d_in": width, "num_classes": data.num_classes, "max_len": rows}

    def is_table(self, path: tuple[str, ...]) -> bool:
        return path[0] == "pos" or (path[0] == "embed" and not self.takes_features)

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        axes = axes_from_table(_AXES, path, ndim)
        if path[0] == "embed" and self.takes_features:
            axes = ("input", *axes[1:]) if path[-1] == "w" else axes
        if path[0] == "head" and self.is_classifier:
            axes = tuple("classes" if a == "vocab" else a for a in axes)
        return axes

    def frozen_prefix(self) -> tuple[str, ...]:
        return ("embed", "pos", *super().frozen_prefix())


GPT2 = TransformerConfig(
    vocab_size=50257,
    d_model=768,
    num_heads=12,
    num_layers=12,
    max_len=1024,
    d_ff=3072,
    attn_bias=True,
    tie_head=True,
)

KIND = register(
    TransformerConfig,
    nnx="zoo.models.transformer.nnx:Transformer",
    eqx="zoo.models.transformer.eqx:Transformer",
    presets={
        "transformer-xs": (
            TransformerConfig(vocab_size=128, d_model=64, num_heads=4, d_ff=256, num_layers=2, max_len=64),
            "2-layer d=64 char LM, context 64",
        ),
        "transformer-s": (
            TransformerConfig(vocab_size=128, d_model=128, num_heads=4, d_ff=512, num_layers=4, max_len=128),
            "4-layer d=128 char LM, context 128",
        ),
        # GPT-2's shapes (Hugging Face openai-community/gpt2 and gpt2-medium): what `zoo import`
        # makes of those checkpoints, tied head, biases everywhere, 50,257 tokens, context 1024.
        "gpt2-124m": (GPT2, "GPT-2 small: 12 layers, d=768, 12 heads, context 1024 (124,439,808 params)"),
        "gpt2-355m": (
            replace(GPT2, d_model=1024, num_heads=16, num_layers=24, d_ff=4096),
            "GPT-2 medium: 24 layers, d=1024, 16 heads, context 1024 (354,823,168 params)",
        ),
        "transformer-digits": (
            TransformerConfig(
                d_in=8, num_classes=10, d_model=64, num_heads=4, d_ff=128, num_layers=2, max_len=8
            ),
            "2-layer d=64 sequence classifier over the 8 rows of a digit",
        ),
    },
    small=TransformerConfig(vocab_size=40, d_model=32, num_heads=4, d_ff=64, num_layers=2, max_len=16),
    order=20,
    hf="zoo.models.transformer.hf",
    cache="zoo.models.transformer.cache:CACHE",
)
