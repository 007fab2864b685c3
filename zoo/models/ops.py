"""Math shared by both backends: input checks, attention and activations. Pure functions on arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from zoo.configs import MLPConfig, ModelConfig

ACTIVATIONS = {"gelu": jax.nn.gelu, "tanh": jnp.tanh, "relu": jax.nn.relu}


# --- Input checks ---------------------------------------------------------------------------
# Both backends call `check_inputs` first thing in `__call__`, so a bad input fails the same way
# in NNX and Equinox (left alone, NNX's embedding lookup gives NaN and Equinox's clamps).
# Shapes are static: they are checked at trace time too, at no cost to the traced program.
# Token ids are values: they are checked here only when concrete (an eager call). Under `jit`
# they are tracers and nothing is added to the program -- the training step feeds ids from
# zoo's own tokenizer and keeps its equation count; `zoo.apply_fn(..., checked=True)` adds
# `check_token_ids` (a checkify check) for callers that jit untrusted ids.


def check_inputs(cfg: ModelConfig, x: jax.Array) -> None:
    """Raise ValueError/TypeError if ``x`` is not an input the model ``cfg`` can read.

    Args:
      cfg: the model config.
      x: the model input: features ``[B, d_in]`` (MLP), token ids ``[B, T]`` or feature rows
        ``[B, T, d_in]`` (transformer).
    """
    if isinstance(cfg, MLPConfig):
        _check_features(x, cfg.d_in, "[B, d_in]")
        return
    if cfg.takes_features:
        _check_features(x, cfg.d_in, "[B, T, d_in]")
    else:
        _check_token_shape(x)
        if not isinstance(x, jax.core.Tracer):
            _check_concrete_ids(np.asarray(x), cfg.vocab_size)
    _check_length(x.shape[1], cfg.max_len)


def check_token_ids(cfg: ModelConfig, x: jax.Array) -> None:
    """A checkify check that every id of ``x`` lies in ``[0, vocab_size)``; works under jit.

    The caller functionalizes it with ``checkify.checkify`` (``zoo.apply_fn(checked=True)``
    does).
    """
    if isinstance(cfg, MLPConfig) or cfg.takes_features:
        return
    bad = ((x < 0) | (x >= cfg.vocab_size)).ravel()
    first_bad = x.ravel()[jnp.argmax(bad)]
    checkify.check(
        ~jnp.any(bad),
        f"token id {{}} is outside the vocabulary: ids must lie in [0, {cfg.vocab_size}) (vocab_size)",
        first_bad,
    )


def _check_features(x: jax.Array, d_in: int, layout: str) -> None:
    rank = layout.count(",") + 1
    if x.ndim != rank or x.shape[-1] != d_in:
        raise ValueError(f"model input must be {layout} with d_in={d_in}, got shape {tuple(x.shape)}")


def _check_token_shape(x: jax.Array) -> None:
    if x.ndim != 2:
        raise ValueError(f"token ids must be [B, T], got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"token ids must be integers, got dtype {x.dtype}")


def _check_length(length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(
            f"sequence length {length} is longer than the model's max_len={max_len}; "
            f"use at most {max_len} positions or a model with a larger max_len"
        )


def _check_concrete_ids(ids: np.ndarray, vocab_size: int) -> None:
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(
            f"token id {int(bad[0])} is outside the vocabulary: ids must lie in [0, {vocab_size}) "
            f"(vocab_size={vocab_size}); {bad.size} of {ids.size} ids are out of range"
        )


# --- Attention ------------------------------------------------------------------------------


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, num_heads: int) -> jax.Array:
    """softmax(q k^T / sqrt(d_head) + causal mask) v, per head.

    q, k, v: [..., T, D] with D = num_heads * d_head. Returns [..., T, D].
    """
    *lead, seq, width = q.shape
    d_head = width // num_heads

    def heads(x):  # [..., T, D] -> [..., H, T, d_head]
        return jnp.swapaxes(x.reshape(*lead, seq, num_heads, d_head), -3, -2)

    scores = heads(q) @ jnp.swapaxes(heads(k), -1, -2) / jnp.sqrt(d_head).astype(q.dtype)
    causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
    scores = jnp.where(causal, scores, jnp.finfo(scores.dtype).min)
    context = jax.nn.softmax(scores, axis=-1) @ heads(v)
    return jnp.swapaxes(context, -3, -2).reshape(*lead, seq, width)
