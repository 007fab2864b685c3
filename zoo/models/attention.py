"""Attention over key/value chunks with an online softmax, and its own remat rule.

:func:`chunked_attention` computes ``softmax(q k^T / sqrt(d) + mask) v`` one key/value chunk
at a time (flash-attention style, in ``lax``): it carries the running row maximum, the
running normaliser and the unnormalised output, so no ``[T, T]`` array is ever built. Its
gradient is a ``jax.custom_vjp`` with a remat rule (``defremat``, JAX's
``jax_custom_vjp3``): the forward keeps only the output and the per-row log-sum-exp, and the
backward pass recomputes the probabilities chunk by chunk from q, k, v, the output and the
log-sum-exp. Under any remat policy the attention itself never saves more than that.

The same rule can be written with ``jax.custom_gradient(remat=True)`` (``rule=
"custom_gradient"``): the function returns its output and a rematerialisation function that
closes over the saved output and log-sum-exp. Both are tested against dense attention; the
models use ``defremat``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from zoo.precision import float32_scope


def _heads(x: jax.Array, n: int) -> jax.Array:
    """[..., T, n * d] -> [..., n, T, d]."""
    *lead, seq, width = x.shape
    return jnp.swapaxes(x.reshape(*lead, seq, n, width // n), -3, -2)


def _merge_heads(x: jax.Array) -> jax.Array:
    """[..., n, T, d] -> [..., T, n * d]."""
    *lead, n, seq, d = x.shape
    return jnp.swapaxes(x, -3, -2).reshape(*lead, seq, n * d)


def _chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[..., S, d] (S a multiple of ``chunk``) -> [S / chunk, ..., chunk, d]."""
    *lead, seq, d = x.shape
    x = x.reshape(*lead, seq // chunk, chunk, d)
    return jnp.moveaxis(x, -3, 0)


def _unchunk(x: jax.Array) -> jax.Array:
    """Inverse of :func:`_chunks`."""
    x = jnp.moveaxis(x, 0, -3)
    *lead, n, chunk, d = x.shape
    return x.reshape(*lead, n * chunk, d)


def _allowed(q_len: int, start, chunk: int, causal: bool, key_valid) -> jax.Array:
    """[T, chunk] bool: may query t attend to key ``start + j``."""
    keys = start + jnp.arange(chunk)
    ok = key_valid[..., None, :] if key_valid is not None else jnp.ones((1, chunk), bool)
    if causal:
        ok = ok & (keys[None, :] <= jnp.arange(q_len)[:, None])
    return ok


def _scores(q, k_chunk, start, causal, valid_chunk):
    scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
    s = (q @ jnp.swapaxes(k_chunk, -1, -2)).astype(jnp.float32) * scale
    ok = _allowed(q.shape[-2], start, k_chunk.shape[-2], causal, valid_chunk)
    return jnp.where(ok, s, -jnp.inf), ok


def _forward(q, k, v, valid, causal: bool, chunk: int):
    """``(out, lse)`` for q [..., T, d] and chunked k, v [n, ..., chunk, d]; ``valid``
    [n, ..., chunk] marks real keys (padding and masked positions are False)."""
    shape = q.shape[:-1]
    init = (
        jnp.full(shape, -jnp.inf, jnp.float32),
        jnp.zeros(shape, jnp.float32),
        jnp.zeros(q.shape, jnp.float32),
    )

    def step(carry, xs):
        m, norm, acc = carry
        i, kc, vc, ok_keys = xs
        s, _ = _scores(q, kc, i * chunk, causal, ok_keys)
        with float32_scope("f32_softmax"):  # the running max and sum, float32 under any precision
            m_new = jnp.maximum(m, s.max(-1))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)  # rows with nothing allowed yet
            p = jnp.exp(s - safe[..., None])
            decay = jnp.exp(jnp.where(jnp.isfinite(m), m - safe, -jnp.inf))
            norm = norm * decay + p.sum(-1)
        acc = acc * decay[..., None] + (p.astype(vc.dtype) @ vc).astype(jnp.float32)
        return (m_new, norm, acc), None

    n = k.shape[0]
    (m, norm, acc), _ = jax.lax.scan(step, init, (jnp.arange(n), k, v, valid))
    some = norm > 0
    out = acc / jnp.where(some, norm, 1.0)[..., None]
    lse = jnp.where(some, m + jnp.log(jnp.where(some, norm, 1.0)), -jnp.inf)
    return out.astype(q.dtype), lse


def _backward(q, k, v, valid, out, lse, g, causal: bool, chunk: int):
    """Cotangents of q and of the chunked k, v, recomputing each chunk's probabilities."""
    scale = 1.0 / jnp.sqrt(jnp.float32(q.shape[-1]))
    g32, out32 = g.astype(jnp.float32), out.astype(jnp.float32)
    delta = (g32 * out32).sum(-1)  # [..., T]: rowsum(dO * O)
    row_lse = jnp.where(jnp.isfinite(lse), lse, 0.0)

    def step(dq, xs):
        i, kc, vc, ok_keys = xs
        s, ok = _scores(q, kc, i * chunk, causal, ok_keys)
        with float32_scope("f32_softmax"):
            p = jnp.where(ok, jnp.exp(s - row_lse[..., None]), 0.0)  # [..., T, chunk]
        dv = jnp.swapaxes(p, -1, -2) @ g32
        dp = g32 @ jnp.swapaxes(vc.astype(jnp.float32), -1, -2)
        ds = p * (dp - delta[..., None]) * scale
        dq = dq + ds @ kc.astype(jnp.float32)
        dk = jnp.swapaxes(ds, -1, -2) @ q.astype(jnp.float32)
        return dq, (dk.astype(kc.dtype), dv.astype(vc.dtype))

    n = k.shape[0]
    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32), (jnp.arange(n), k, v, valid))
    return dq.astype(q.dtype), dk, dv


def enable() -> None:
    """Turn on ``jax_custom_vjp3``, which both remat rules need. JAX keys its compile caches on
    its config, so this must happen before a program using the op is first traced: flipped
    during the first trace, the next call of the same ``jit`` would compile again. Model
    configs call it when they choose ``attention = "chunked"`` (``sequence.check_attention``)."""
    if not jax.config.jax_custom_vjp3:
        jax.config.update("jax_custom_vjp3", True)


@functools.cache
def _attend(causal: bool, chunk: int):
    """The chunked attention core for one (causal, chunk): a ``custom_vjp`` whose remat rule
    keeps the output and the log-sum-exp, and whose backward recomputes the rest."""
    enable()  # for direct calls; in a model the config has already done it

    @jax.custom_vjp
    def attend(q, k, v, valid):
        return _forward(q, k, v, valid, causal, chunk)[0]

    def fwd(q, k, v, valid):  # what the forward keeps
        out, lse = _forward(q, k, v, valid, causal, chunk)
        return out, (out, lse)

    def rem(saved, q, k, v, valid):  # what a replay rebuilds: nothing, the output is kept
        out, lse = saved
        return out, (q, k, v, valid, out, lse)

    def bwd(res, g):
        q, k, v, valid, out, lse = res
        dq, dk, dv = _backward(q, k, v, valid, out, lse, g, causal, chunk)
        return dq, dk, dv, None

    attend.defremat(fwd, rem, bwd)
    return attend


@functools.cache
def _attend_custom_gradient(causal: bool, chunk: int):
    """The same rule through ``jax.custom_gradient(remat=True)``: what ``rem`` closes over (the
    output and the log-sum-exp) is saved from the forward pass; its arguments are the replay's."""
    enable()  # custom_gradient(remat=True) needs jax_custom_vjp3 (not jax_remat3 here)

    @functools.partial(jax.custom_gradient, remat=True)
    def attend(q, k, v, valid):
        out, lse = _forward(q, k, v, valid, causal, chunk)

        def rem(q, k, v, valid):
            def vjp(g):
                return (*_backward(q, k, v, valid, out, lse, g, causal, chunk), None)

            return out, vjp

        return out, rem

    return attend


RULES = {"defremat": _attend, "custom_gradient": _attend_custom_gradient}


def chunked_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    num_heads: int,
    num_kv_heads: int | None = None,
    *,
    chunk: int = 64,
    causal: bool = True,
    key_mask: jax.Array | None = None,
    rule: str = "defremat",
) -> jax.Array:
    """``softmax(q k^T / sqrt(d_head) + mask) v`` per head, over key chunks of ``chunk``.

    q: [..., T, H * d_head]; k, v: [..., T, KV * d_head] (KV = ``num_kv_heads``, dividing H).
    ``key_mask`` [..., T] (True = a real key) masks padding; ``causal`` adds the causal mask.
    T need not divide by ``chunk``: the keys are padded and the padding masked. A query row
    with no key it may attend to gives zeros. ``rule``: how the remat rule is written, one of
    :data:`RULES` (the same residuals either way). Returns [..., T, H * d_head].
    """
    if rule not in RULES:
        raise ValueError(f"unknown attention remat rule {rule!r}; valid: {', '.join(RULES)}")
    num_kv_heads = num_kv_heads or num_heads
    seq = k.shape[-2]
    qh, kh, vh = _heads(q, num_heads), _heads(k, num_kv_heads), _heads(v, num_kv_heads)
    if num_kv_heads != num_heads:
        kh, vh = (jnp.repeat(a, num_heads // num_kv_heads, axis=-3) for a in (kh, vh))
    chunk = max(1, min(chunk, seq))
    pad = -seq % chunk
    valid = (
        jnp.ones(kh.shape[:-1], bool)
        if key_mask is None
        else jnp.broadcast_to(jnp.asarray(key_mask, bool)[..., None, :], kh.shape[:-1])
    )
    if pad:
        widths = [(0, 0)] * (kh.ndim - 2) + [(0, pad), (0, 0)]
        kh, vh = jnp.pad(kh, widths), jnp.pad(vh, widths)
        valid = jnp.pad(valid, widths[:-1])
    valid_chunks = jnp.moveaxis(valid.reshape(*valid.shape[:-1], -1, chunk), -2, 0)
    out = RULES[rule](bool(causal), int(chunk))(qh, _chunks(kh, chunk), _chunks(vh, chunk), valid_chunks)
    return _merge_heads(out)
