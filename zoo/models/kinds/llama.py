"""The Llama-style decoder kind: config, presets and what zoo needs to know about it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import jax
import jax.numpy as jnp

from zoo import names
from zoo.configs import require_positive
from zoo.errors import ZooError
from zoo.models.ops import (
    check_attention,
    check_concrete_ids,
    check_ids_under_jit,
    check_length,
    check_mlp_chunk,
    check_token_shape,
)
from zoo.models.registry import DataFit, ModelConfig, axes_from_table, register

# Logical axes of each leaf (without the stack's leading ``layers`` axis). ``heads`` and
# ``kv_heads`` are fused heads x head-width axes.
_AXES = {
    "embed.w": ("vocab", "embed"),
    "attn_norm.scale": ("embed",),
    "attn.q.w": ("embed", "heads"),
    "attn.k.w": ("embed", "kv_heads"),
    "attn.v.w": ("embed", "kv_heads"),
    "attn.o.w": ("heads", "embed"),
    "mlp_norm.scale": ("embed",),
    "mlp.gate.w": ("embed", "mlp"),
    "mlp.up.w": ("embed", "mlp"),
    "mlp.down.w": ("mlp", "embed"),
    "norm_f.scale": ("embed",),
    "head.w": ("embed", "vocab"),
}


@dataclass(frozen=True)
class LlamaConfig(ModelConfig):
    """Llama-style decoder LM: pre-RMSNorm blocks, rotary position embeddings, grouped-query
    causal attention (``num_kv_heads`` key/value heads shared by ``num_heads`` query heads),
    SwiGLU MLP, no biases."""

    kind: ClassVar[str] = "llama"
    activation_names: ClassVar[tuple[str, ...]] = names.ALL
    vocab_size: int = 128
    d_model: int = 64
    num_heads: int = 4
    num_kv_heads: int = 2
    d_ff: int = 192
    num_layers: int = 2
    max_len: int = 64
    attention: str = "dense"  # or "chunked": key chunks, online softmax (zoo.models.attention)
    attention_chunk: int = 64
    mlp_chunk: int = 0  # tokens per MLP chunk, recomputed in backward (ops.token_chunks); 0: all at once
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        check_attention(self)
        check_mlp_chunk(self)
        require_positive(
            self, "vocab_size", "d_model", "num_heads", "num_kv_heads", "d_ff", "num_layers", "max_len"
        )
        if self.d_model % self.num_heads or (self.d_model // self.num_heads) % 2:
            raise ZooError(
                f"d_model={self.d_model} must split into num_heads={self.num_heads} heads of even width "
                "(rotary embeddings rotate pairs)"
            )
        if self.num_heads % self.num_kv_heads:
            valid = [k for k in range(1, self.num_heads + 1) if self.num_heads % k == 0]
            raise ZooError(
                f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}; "
                f"valid num_kv_heads: {valid}"
            )
        if not self.rope_theta > 0 or not self.norm_eps > 0:
            raise ZooError(f"rope_theta and norm_eps must be > 0, got {self.rope_theta}, {self.norm_eps}")

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    # --- the registry protocol (zoo.models.registry.ModelConfig) -----------------------------
    @property
    def task(self) -> str:
        return "lm"

    @property
    def num_outputs(self) -> int:
        return self.vocab_size

    def input_spec(self, batch: int, seq: int | None = None) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct((batch, self.seq_or_default(seq)), jnp.int32)

    def example_input(self, key: jax.Array, batch: int, seq: int | None = None) -> jax.Array:
        return jax.random.randint(key, self.input_spec(batch, seq).shape, 0, self.vocab_size, jnp.int32)

    def block_input_shape(self, batch: int, seq: int | None = None) -> tuple[int, ...]:
        return (batch, self.seq_or_default(seq), self.d_model)

    def check_input(self, x: jax.Array) -> None:
        check_token_shape(x)
        check_concrete_ids(x, self.vocab_size)
        check_length(x.shape[1], self.max_len)

    def check_input_values(self, x: jax.Array) -> None:
        check_ids_under_jit(x, self.vocab_size)

    def fit_to_data(self, data: DataFit) -> dict:
        if data.task != "lm":
            raise ZooError(
                f"a Llama-style decoder is a language model; {data.dataset!r} is a {data.task} dataset"
            )
        return {"vocab_size": data.vocab_size, "max_len": max(self.max_len, data.seq_len)}

    def is_table(self, path: tuple[str, ...]) -> bool:
        return path[0] == "embed"

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        return axes_from_table(_AXES, path, ndim)


KIND = register(
    LlamaConfig,
    nnx="zoo.models.nnx.llama:Llama",
    eqx="zoo.models.eqx.llama:Llama",
    presets={
        "llama-xs": (
            LlamaConfig(
                vocab_size=128, d_model=64, num_heads=4, num_kv_heads=2, d_ff=192, num_layers=2, max_len=64
            ),
            "2-layer d=64 Llama-style char LM (RMSNorm, RoPE, SwiGLU, 2 KV heads), context 64",
        ),
        "llama-s": (
            LlamaConfig(
                vocab_size=128, d_model=128, num_heads=4, num_kv_heads=2, d_ff=384, num_layers=4, max_len=128
            ),
            "4-layer d=128 Llama-style char LM (RMSNorm, RoPE, SwiGLU, 2 KV heads), context 128",
        ),
    },
    small=LlamaConfig(
        vocab_size=40, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=16
    ),
)
