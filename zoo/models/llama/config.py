"""The Llama-style decoder kind: config, presets and what zoo needs to know about it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from zoo import names
from zoo.configs import require_positive
from zoo.errors import ZooError
from zoo.models.registry import DataFit, axes_from_table, register
from zoo.models.sequence import SequenceConfig

ROPE_SCALINGS = ("", "llama3")

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
class LlamaConfig(SequenceConfig):
    """Llama-style decoder LM: pre-RMSNorm blocks, rotary position embeddings, grouped-query
    causal attention (``num_kv_heads`` key/value heads shared by ``num_heads`` query heads),
    SwiGLU MLP, no biases. The decoder fields, token inputs and chunking options are
    :class:`zoo.models.sequence.SequenceConfig`'s.

    What Hugging Face's Llama family adds (``zoo.models.llama.hf``): ``head_dim`` (0: d_model /
    num_heads), ``rope_scaling = "llama3"`` with its four ``rope_*`` fields (Llama 3.1's
    frequency scaling), ``tie_head`` (the LM head is the token table transposed). The defaults
    are zoo's own Llama."""

    kind: ClassVar[str] = "llama"
    activation_names: ClassVar[tuple[str, ...]] = names.ALL
    num_kv_heads: int = 2
    d_ff: int = 192
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    head_dim: int = 0
    rope_scaling: str = ""  # or "llama3"
    rope_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_len: int = 8192
    tie_head: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "num_kv_heads", "d_ff", section="model")
        if self.d_head % 2:
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
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ZooError(f"rope_scaling must be one of {list(ROPE_SCALINGS)}, got {self.rope_scaling!r}")
        if self.head_dim < 0:
            raise ZooError(f"head_dim must be >= 0 (0: d_model / num_heads), got {self.head_dim}")

    @property
    def d_head(self) -> int:
        return self.head_dim or self.d_model // self.num_heads

    def rope_freq(self) -> np.ndarray | None:
        """The rotary frequencies [d_head / 2] under ``rope_scaling`` (None: unscaled, the
        default ``theta^(-2i/d_head)``), computed as ``transformers`` does, in float32."""
        if not self.rope_scaling:
            return None
        dim = self.d_head
        inv = 1.0 / (
            np.float32(self.rope_theta) ** (np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim))
        )
        old, factor = self.rope_original_max_len, self.rope_factor
        low, high = self.rope_low_freq_factor, self.rope_high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        return np.where(medium, smoothed, scaled).astype(np.float32)

    # --- the registry protocol (zoo.models.registry.ModelConfig; token inputs: SequenceConfig)
    def fit_to_data(self, data: DataFit) -> dict:
        # an LM only: the data is loaded for cfg.task, and zoo.train.task refuses any other
        return {"vocab_size": data.vocab_size, "max_len": max(self.max_len, data.seq_len)}

    def logical_axes(self, path: tuple[str, ...], ndim: int) -> tuple[str | None, ...]:
        return axes_from_table(_AXES, path, ndim)

    def frozen_prefix(self) -> tuple[str, ...]:
        return ("embed", *super().frozen_prefix())


# Llama 3.2's shapes (Hugging Face's meta-llama/Llama-3.2-1B and -3B configs): tied head, 8 KV
# heads, rope theta 500000 with llama3 frequency scaling, context 131072 as in the checkpoints'
# configs (max_len allocates nothing: rotary positions are computed), so that `zoo import` of
# either checkpoint lands on its preset.
LLAMA_3_2 = dict(
    vocab_size=128256,
    num_kv_heads=8,
    d_ff=8192,
    max_len=131072,
    rope_theta=500000.0,
    norm_eps=1e-5,
    rope_scaling="llama3",
    rope_factor=32.0,
    rope_low_freq_factor=1.0,
    rope_high_freq_factor=4.0,
    rope_original_max_len=8192,
    tie_head=True,
)

KIND = register(
    LlamaConfig,
    nnx="zoo.models.llama.nnx:Llama",
    eqx="zoo.models.llama.eqx:Llama",
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
        "llama-1b": (
            LlamaConfig(d_model=2048, num_heads=32, num_layers=16, **LLAMA_3_2),
            "Llama 3.2 1B's shapes: 16 layers, d=2048, 32 heads / 8 KV heads, vocab 128256, tied head",
        ),
        "llama-3b": (
            LlamaConfig(d_model=3072, num_heads=24, num_layers=28, **LLAMA_3_2),
            "Llama 3.2 3B's shapes: 28 layers, d=3072, 24 heads / 8 KV heads, vocab 128256, tied head",
        ),
    },
    small=LlamaConfig(
        vocab_size=40, d_model=32, num_heads=4, num_kv_heads=2, d_ff=64, num_layers=2, max_len=16
    ),
    order=30,
    hf="zoo.models.llama.hf",
    cache="zoo.models.llama.cache:CACHE",
)
