"""The two compiled programs of generation: the prefill (one forward over the padded prompts
fills the cache) and the decode loop (one ``lax.while_loop``: choose a token, run it through
the model with the cache, until every row stops or the step bound is reached).

Both are keyed by shapes only: the batch, the padded prompt length P and the cache length T
(length buckets, :func:`bucket`), plus the static model config, backend and sampling. The
number of new tokens, the stop tokens and the seed are arguments, so two prompts in one bucket,
or two ``max_new_tokens`` in one bucket, run the same two programs.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from zoo.generate.sampling import Sampling, choose
from zoo.models import decode

MIN_BUCKET = 16


def bucket(n: int) -> int:
    """The length bucket of ``n`` tokens: the next power of two, at least :data:`MIN_BUCKET`."""
    return max(MIN_BUCKET, 1 << (max(n, 1) - 1).bit_length())


class State(NamedTuple):
    """The decode loop's carry (arrays only)."""

    cache: decode.Cache
    logits: jax.Array  # [B, V] float32: the next token's logits
    step: jax.Array  # tokens chosen so far (one per row per step)
    lengths: jax.Array  # [B] prompt lengths
    done: jax.Array  # [B] stopped (a stop token chosen)
    count: jax.Array  # [B] new tokens kept per row (a stop token included)
    tokens: jax.Array  # [B, N] the new tokens (0 after a row stops)
    seen: jax.Array  # [B, N, V] the logits each token was chosen from ([B, 0, V] unless kept)
    key: jax.Array


@functools.partial(
    jax.jit, static_argnames=("cfg", "backend", "length", "new", "keep_logits", "dtype", "lanes")
)
def prefill(
    cfg,
    backend,
    params,
    prompts,
    lengths,
    seed,
    *,
    length: int,
    new: int,
    keep_logits: bool,
    dtype="float32",
    lanes: int = 1,
):
    """The padded prompts [B, P] (row b's ``lengths[b]`` tokens at its end) through the model:
    the first :class:`State`, with a cache of ``length`` slots in ``dtype`` (the compute dtype
    of the model's precision policy, as ``params`` are) in rows of ``lanes``
    (``decode.row_lanes``) and room for ``new`` tokens."""
    batch, width = prompts.shape
    pad = width - lengths
    positions = jnp.maximum(jnp.arange(width)[None, :] - pad[:, None], 0)
    cache = decode.init_cache(cfg, batch, length, dtype, lanes)
    logits, cache = decode.forward(cfg, backend, params, cache, prompts, positions, pad, 0, prefill=True)
    return State(
        cache=cache,
        logits=logits,
        step=jnp.int32(0),
        lengths=lengths,
        done=jnp.zeros(batch, bool),
        count=jnp.zeros(batch, jnp.int32),
        tokens=jnp.zeros((batch, new), jnp.int32),
        seen=jnp.zeros((batch, new if keep_logits else 0, logits.shape[-1]), jnp.float32),
        key=jax.random.key(seed),
    )


@functools.partial(jax.jit, static_argnames=("cfg", "backend", "sampling", "width"), donate_argnames="state")
def decode_steps(cfg, backend, sampling: Sampling, params, state: State, until, stops, *, width: int):
    """Steps of the decode loop until ``state.step == until`` or every row has stopped; one
    ``lax.while_loop``. ``stops`` [n]: token ids that end a row (kept as its last token);
    ``width``: the padded prompt length P (the new token of step i goes to slot P + i)."""
    batch = state.lengths.shape[0]
    rows = jnp.arange(batch)

    def more(s: State):
        return (s.step < until) & ~jnp.all(s.done)

    def one(s: State) -> State:
        # one key per row and step: a row's draws do not depend on the rest of the batch
        keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(s.key, r), s.step))(rows)
        live = ~s.done
        token = jnp.where(live, choose(s.logits, keys, sampling), 0)
        tokens = jax.lax.dynamic_update_slice(s.tokens, token[:, None], (0, s.step))
        seen = s.seen
        if seen.shape[1]:
            seen = jax.lax.dynamic_update_slice(seen, s.logits[:, None], (0, s.step, 0))
        done = s.done | (live & jnp.isin(token, stops))
        positions = (s.lengths + s.step)[:, None]
        pad = width - s.lengths
        logits, cache = decode.forward(
            cfg, backend, params, s.cache, token[:, None], positions, pad, width + s.step, prefill=False
        )
        return s._replace(
            cache=cache,
            logits=logits,
            step=s.step + 1,
            done=done,
            count=s.count + live,
            tokens=tokens,
            seen=seen,
        )

    return jax.lax.while_loop(more, one, state)
