"""How the next token is chosen from the logits: greedy, or a draw at a temperature from the
``top_k`` most likely tokens and the smallest set whose probability reaches ``top_p``."""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo.checks import require_int, require_number

# Below this temperature a draw is the argmax (greedy): logits / T would leave float32's range
# (a denormal T such as 1e-45 gives inf - inf = NaN and tokens that have nothing to do with
# the argmax), and above it, down to here, a draw already differs from the argmax only between
# logits closer than about 1e-3 of each other.
GREEDY_BELOW = 1e-4
# Above this temperature the logits are divided by it instead: a larger one (1e300) does not fit
# in float32 (NumPy's bare "overflow encountered in cast", then logits / inf = 0 everywhere, and
# top-k and top-p would pick among ties). Logits / 1e30 keep their order, and their softmax is
# already uniform to float32's precision: the draw is the same as at any hotter temperature.
HOTTEST = 1e30


@dataclass(frozen=True)
class Sampling:
    """``temperature`` 0 is greedy (the argmax), and so is any temperature below
    :data:`GREEDY_BELOW`; ``top_k`` 0 and ``top_p`` 1 keep every token. Static under ``jit``:
    each setting compiles its own decode program."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        what = "a finite number >= 0 (0: greedy)"
        # kept as the checks return them, plain Python numbers (a NumPy scalar is accepted)
        plain = {
            "temperature": require_number("temperature", self.temperature, finite=True, lo=0.0, what=what),
            "top_k": require_int("top_k", self.top_k, lo=0, what="a whole number >= 0 (0: every token)"),
            "top_p": require_number(
                "top_p", self.top_p, positive=True, hi=1.0, what="a number in (0, 1] (1: every token)"
            ),
        }
        for name, value in plain.items():
            object.__setattr__(self, name, value)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def filtered(logits: jax.Array, sampling: Sampling) -> jax.Array:
    """``logits`` [B, V] / temperature, with the tokens outside top-k and top-p at -inf."""
    x = logits.astype(jnp.float32) / min(sampling.temperature, HOTTEST)
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
