"""How the next token is chosen from the logits: greedy, or a draw at a temperature from the
``top_k`` most likely tokens and the smallest set whose probability reaches ``top_p``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.checks import is_int, is_number


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy (the argmax); ``top_k`` 0 and ``top_p`` 1 keep every token.
    Static under ``jit``: each setting compiles its own decode program."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        t, k, p = self.temperature, self.top_k, self.top_p
        if not is_number(t) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {t!r}")
        if not is_int(k) or k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0: every token), got {k!r}")
        if not is_number(p) or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1] (1: every token), got {p!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def filtered(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """``logits`` [B, V] / temperature, with the tokens outside top-k and top-p at -inf."""
    x = logits.astype(jnp.float32) / sampling.temperature
    if sampling.top_k and sampling.top_k < x.shape[-1]:
        kth = jax.lax.top_k(x, sampling.top_k)[0][:, -1:]
        x = jnp.where(x < kth, -jnp.inf, x)
    if sampling.top_p < 1:
        ordered = jnp.sort(x, axis=-1)[:, ::-1]
        probs = jax.nn.softmax(ordered, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the tokens ranked above each
        kept = jnp.where(before < sampling.top_p, ordered, jnp.inf).min(-1, keepdims=True)
        x = jnp.where(x < kept, -jnp.inf, x)
    return x


def choose(logits: jax.Array, keys: jax.Array, sampling: Sampling) -> jax.Array:
    """The next token of each row: logits [B, V], one key per row -> int32 [B]."""
    if sampling.greedy:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    x = filtered(logits, sampling)
    return jax.vmap(jax.random.categorical)(keys, x).astype(jnp.int32)
