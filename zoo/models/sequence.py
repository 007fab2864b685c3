"""What the token-sequence kinds (the transformer, Llama) share: the fields of a decoder stack,
token inputs, the attention and MLP chunking options, and their checks, written once.

A kind derives its config from :class:`SequenceConfig` and adds its own fields (MLP width,
position scheme, norms...) and checks (``super().__post_init__()`` first). Field names and
defaults here are those of the kinds' checkpoints: a saved config dict loads unchanged.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.checks import require_int, require_positive_int
from zoo.configs import ATTENTIONS, require_positive
from zoo.errors import ZooError, choice_error
from zoo.models.ops import check_concrete_ids, check_ids_under_jit, check_length, check_token_shape
from zoo.models.registry import ModelConfig
from zoo.models.splash import SplashBlocks

_SPLASH = SplashBlocks()  # the measured defaults of the splash_* fields


def check_attention(cfg) -> None:
    """A config's ``attention`` is one of :data:`ATTENTIONS` and its chunk a positive int."""
    if cfg.attention not in ATTENTIONS:
        raise choice_error(f"{type(cfg).__name__}.attention", cfg.attention, ATTENTIONS)
    if cfg.attention == "chunked":  # before any trace: see zoo.models.attention.enable
        from zoo.models.attention import enable

        enable()
    chunk = cfg.attention_chunk
    require_positive_int("model.attention_chunk", chunk, error=ZooError)


def check_splash(cfg) -> None:
    """A config's ``splash_*`` fields make valid :class:`SplashBlocks` (one line naming the bad
    field and what is valid)."""
    try:
        cfg.splash_blocks.check(prefix=f"{type(cfg).__name__}.splash_")
    except ValueError as error:
        raise ZooError(str(error)) from None


# The largest vocab_multiple: tiles are at most a few hundred rows (128 fills the MXU), and a
# multiple this size already pads a table to 65,536 rows. Without a bound a mistyped
# multiple sizes a table of 10^12 rows and fails only in the allocator.
MAX_VOCAB_MULTIPLE = 65536


def check_vocab_multiple(cfg) -> None:
    """A config's ``vocab_multiple`` is an int in [1, :data:`MAX_VOCAB_MULTIPLE`]."""
    what = f"an int in [1, {MAX_VOCAB_MULTIPLE:,}] (rows the token table is rounded up to a multiple of)"
    name = f"{type(cfg).__name__}.vocab_multiple"
    require_int(name, cfg.vocab_multiple, lo=1, hi=MAX_VOCAB_MULTIPLE, what=what, error=ZooError)


def check_mlp_chunk(cfg) -> None:
    """A config's ``mlp_chunk`` (tokens per MLP chunk, ``ops.token_chunks``) is an int >= 0."""
    chunk = cfg.mlp_chunk
    what = "a whole number of tokens (0: the whole sequence at once)"
    require_int(f"{type(cfg).__name__}.mlp_chunk", chunk, lo=0, what=what, error=ZooError)


@dataclass(frozen=True)
class SequenceConfig(ModelConfig):
    """Base of the decoder kinds: token ids [B, T] (``T <= max_len``) over ``vocab_size``, a
    ``d_model``-wide residual stream through ``num_layers`` scanned blocks of ``num_heads``-head
    causal attention and a token-wise MLP. A language model by default (labels [B, T])."""

    vocab_size: int = 128
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    max_len: int = 64
    # splash on a TPU, dense elsewhere; or "dense", "chunked", "splash", "cudnn" (zoo.models.attention)
    attention: str = "auto"
    attention_chunk: int = 64
    # The splash kernels' tuning (zoo.models.splash.SplashBlocks, MaxText's sa_block_*): tokens
    # per block of the forward kernel, the dk/dv kernel and the dq kernel, and one fused backward
    # kernel instead of the last two. Read only where splash attention runs.
    splash_block_q: int = _SPLASH.block_q
    splash_block_kv: int = _SPLASH.block_kv
    splash_block_kv_compute: int = _SPLASH.block_kv_compute
    splash_block_q_dkv: int = _SPLASH.block_q_dkv
    splash_block_kv_dkv: int = _SPLASH.block_kv_dkv
    splash_block_kv_dkv_compute: int = _SPLASH.block_kv_dkv_compute
    splash_block_q_dq: int = _SPLASH.block_q_dq
    splash_block_kv_dq: int = _SPLASH.block_kv_dq
    splash_fused_backward: bool = _SPLASH.fused_backward
    mlp_chunk: int = 0  # tokens per MLP chunk, recomputed in backward (ops.token_chunks); 0: all at once
    vocab_multiple: int = (
        1  # the token table and LM head rounded up to a multiple of this many rows (128: MXU tiles)
    )

    def __post_init__(self) -> None:
        check_attention(self)
        check_splash(self)
        check_mlp_chunk(self)
        require_positive(self, "vocab_size", "d_model", "num_heads", "num_layers", "max_len", section="model")
        check_vocab_multiple(self)
        if self.d_model % self.num_heads:
            raise ZooError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                f"valid num_heads: {[h for h in range(1, self.d_model + 1) if self.d_model % h == 0]}"
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @property
    def splash_blocks(self) -> SplashBlocks:
        """The ``splash_*`` fields as the kernels' settings (:class:`SplashBlocks`)."""
        fields = dataclasses.fields(SplashBlocks)
        return SplashBlocks(**{f.name: getattr(self, f"splash_{f.name}") for f in fields})

    @property
    def table_rows(self) -> int:
        """Rows of the token table (and columns of an LM head): ``vocab_size`` rounded up to a
        multiple of ``vocab_multiple``. The padding rows are never read (ids stay below
        ``vocab_size``) and their logits are cut off (:meth:`visible`)."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    def visible(self, logits: jax.Array) -> jax.Array:
        """LM logits over the padded table cut to the vocabulary: [..., table_rows] -> [..., vocab_size]."""
        if self.task == "lm" and logits.shape[-1] == self.table_rows != self.vocab_size:
            return logits[..., : self.vocab_size]
        return logits

    def vocab_unpadded(self, flat: dict) -> dict:
        """Flat ``{path: array}`` leaves without the table's padding rows (for an export)."""
        if self.table_rows == self.vocab_size:
            return flat
        out = dict(flat)
        if "embed.w" in flat and flat["embed.w"].shape[0] == self.table_rows:
            out["embed.w"] = flat["embed.w"][: self.vocab_size]
        if "head.w" in flat and flat["head.w"].shape[-1] == self.table_rows:
            out["head.w"] = flat["head.w"][..., : self.vocab_size]
        if "head.b" in flat and flat["head.b"].shape[-1] == self.table_rows:
            out["head.b"] = flat["head.b"][..., : self.vocab_size]
        return out

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

    def is_table(self, path: tuple[str, ...]) -> bool:
        return path[0] == "embed"
