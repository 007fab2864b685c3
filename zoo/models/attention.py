"""Attention: one function, :func:`attention`, for training (dense, chunked, the Pallas splash
kernel of :mod:`zoo.models.splash`, or cuDNN's of :mod:`zoo.models.cudnn`; ``"auto"`` is
splash on a TPU, dense elsewhere) and
for reads of a key/value cache (prefill and decode), with one masking rule and one float32
softmax scope.

- **dense** builds the ``[T, T]`` scores at once; its softmax is float32 whatever the compute
  dtype (``ops.in_float32``: a bf16 step keeps the bf16 scores, not float32 ones).
- **chunked** (``kind="chunked"``) reads ``chunk`` keys at a time with an online softmax (flash
  attention in ``lax``): it carries the running row maximum, normaliser and unnormalised
  output, so no ``[T, T]`` array is built. Its gradient is a ``jax.custom_vjp`` with a remat
  rule (``defremat``, JAX's ``jax_custom_vjp3``): the forward keeps the output and the per-row
  log-sum-exp, and the backward recomputes the probabilities chunk by chunk. The same rule
  through ``jax.custom_gradient(remat=True)`` is ``rule="custom_gradient"``; both need JAX
  0.12, and on an older JAX ``rule="auto"`` takes ``"custom_vjp"``, a plain ``custom_vjp``
  with the same residuals and gradients (:func:`available_rules`).
- **cached** (``cache=CacheSlice(...)``): the new tokens' queries read the keys already in the
  cache and their own, as two online-softmax parts merged (a decode step reads the cache and
  writes one slot). Dense or chunked is the same setting (``chunk`` slots at a time).

Masked scores take the float32 minimum (:func:`masked`), finite, so a row with nothing to read
gives zeros, not NaN. Every max, exp and sum of a softmax runs inside the ``f32_softmax`` scope
(:data:`zoo.precision.FLOAT32_SCOPES`). Heads are grouped: q [..., KV, G, T, d] against keys
[..., KV, T, d] (G = H / KV), so grouped-query attention reads each key once. The cache keeps
p heads side by side in each slot's row (:mod:`zoo.models.cache_rows`), and its reads contract
a row whole against queries spread over the row's lanes; both products of a read take the cache
as it is (bf16 under a bf16 policy) and accumulate in float32.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from zoo import jaxfeatures
from zoo.models.cache_rows import CacheSlice, gathered, spread
from zoo.models.cudnn import cudnn
from zoo.models.ops import in_float32
from zoo.models.splash import SplashBlocks, resolve, splash
from zoo.precision import float32_scope

KINDS = ("auto", "dense", "chunked", "splash", "cudnn")


def masked(scores: jax.Array, ok: jax.Array) -> jax.Array:
    """The one masking rule: scores where ``ok``, the float32 minimum elsewhere (finite)."""
    return jnp.where(ok, scores, jnp.finfo(scores.dtype).min)


def _grouped(x: jax.Array, heads: int, kv_heads: int) -> jax.Array:
    """Queries [..., T, H * d] -> [..., KV, G, T, d]."""
    *lead, seq, width = x.shape
    x = x.reshape(*lead, seq, kv_heads, heads // kv_heads, width // heads)
    return jnp.moveaxis(x, -4, -2)


def _heads(x: jax.Array, n: int) -> jax.Array:
    """Keys or values [..., T, n * d] -> [..., n, T, d]."""
    *lead, seq, width = x.shape
    return jnp.swapaxes(x.reshape(*lead, seq, n, width // n), -3, -2)


def _ungrouped(x: jax.Array) -> jax.Array:
    """[..., KV, G, T, d] -> [..., T, H * d]."""
    *lead, kv, g, seq, d = x.shape
    return jnp.moveaxis(x, -2, -4).reshape(*lead, seq, kv * g * d)


# --- dense --------------------------------------------------------------------------------


def _masked_softmax(scores: jax.Array, ok: jax.Array) -> jax.Array:
    """softmax over the last axis of the masked scores, in float32 (the scores may be bf16),
    returned in the scores' dtype."""
    return jax.nn.softmax(masked(scores.astype(jnp.float32), ok), axis=-1).astype(scores.dtype)


def _dense(q, k, v, heads: int, kv_heads: int, causal: bool, key_mask) -> jax.Array:
    *lead, seq, width = q.shape
    d_head = width // heads
    kh, vh = _heads(k, kv_heads), _heads(v, kv_heads)
    if kv_heads != heads:
        kh, vh = (jnp.repeat(a, heads // kv_heads, axis=-3) for a in (kh, vh))
    scores = _heads(q, heads) @ jnp.swapaxes(kh, -1, -2) / jnp.sqrt(d_head).astype(q.dtype)
    ok = jnp.tril(jnp.ones((seq, seq), dtype=bool)) if causal else jnp.ones((seq, seq), bool)
    if key_mask is not None:
        ok = ok & jnp.asarray(key_mask, bool)[..., None, None, :]
    probs = in_float32(lambda s: _masked_softmax(s, ok), scores, "f32_softmax")
    context = probs @ vh
    return jnp.swapaxes(context, -3, -2).reshape(*lead, seq, width)


# --- the online softmax: parts over key sets, merged ---------------------------------------


def _part(q, k, v, ok, scale=None):
    """``(m, l, acc)`` of q [..., G, S, d] over keys k, v [..., T, d] where ``ok`` (broadcast to
    [..., G, S, T]): the row max, the normaliser and the unnormalised output, float32. The two
    products take their operands as they are (a bf16 cache is read as bf16, never copied to
    float32) and accumulate in float32; ``scale`` defaults to 1/sqrt(d)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = masked(jnp.einsum("...gsd,...td->...gst", q, k, preferred_element_type=jnp.float32) * scale, ok)
    with float32_scope("f32_softmax"):
        m = s.max(-1)
        p = jnp.where(ok, jnp.exp(s - m[..., None]), 0.0)
        norm = p.sum(-1)
    acc = jnp.einsum("...gst,...td->...gsd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return m, norm, acc


def _merge(a, b):
    with float32_scope("f32_softmax"):
        (ma, la, xa), (mb, lb, xb) = a, b
        m = jnp.maximum(ma, mb)
        fa, fb = jnp.exp(ma - m), jnp.exp(mb - m)
        return m, la * fa + lb * fb, xa * fa[..., None] + xb * fb[..., None]


def _empty(q):
    lead = q.shape[:-1]
    low = jnp.finfo(jnp.float32).min
    return jnp.full(lead, low, jnp.float32), jnp.zeros(lead, jnp.float32), jnp.zeros(q.shape, jnp.float32)


def _online(q, k, v, ok_fn, chunk: int, scale=None):
    """:func:`_part` over all of k, v [..., T, d] (``chunk`` 0 or >= T) or ``chunk`` keys at a
    time (a scan; T a multiple of ``chunk``). ``ok_fn(start, size)``: the mask of those keys."""
    seq = k.shape[-2]
    if not chunk or chunk >= seq:
        return _part(q, k, v, ok_fn(0, seq), scale)

    def step(carry, i):
        start = i * chunk
        kc, vc = (jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=-2) for a in (k, v))
        return _merge(carry, _part(q, kc, vc, ok_fn(start, chunk), scale)), None

    out, _ = jax.lax.scan(step, _empty(q), jnp.arange(seq // chunk))
    return out


def _finish(m, norm, acc):
    """``(out, lse)``: the normalised output and the log-sum-exp (0 on a row with no key)."""
    some = norm > 0
    safe = jnp.where(some, norm, 1.0)
    return acc / safe[..., None], jnp.where(some, m + jnp.log(safe), 0.0)


# --- chunked training attention, with its remat rule ---------------------------------------


def _chunk_ok(valid, causal: bool, seq: int):
    """``ok_fn`` of the chunked forward and backward: ``valid`` [..., KV, T'] real keys, and the
    causal mask of ``seq`` queries."""

    def ok(start, size):
        keys = start + jnp.arange(size)
        allowed = jax.lax.dynamic_slice_in_dim(valid, start, size, axis=-1)[..., None, None, :]
        if causal:
            allowed = allowed & (keys[None, :] <= jnp.arange(seq)[:, None])
        return allowed

    return ok


def _forward(q, k, v, valid, causal: bool, chunk: int):
    """``(out, lse)`` of grouped q [..., KV, G, T, d] over k, v [..., KV, T', d] (T' a multiple
    of ``chunk``); ``valid`` [..., KV, T'] marks real keys."""
    out, lse = _finish(*_online(q, k, v, _chunk_ok(valid, causal, q.shape[-2]), chunk))
    return out.astype(q.dtype), lse


def _backward(q, k, v, valid, out, lse, g, causal: bool, chunk: int):
    """Cotangents of q, k and v, recomputing each chunk's probabilities."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    g32, q32 = g.astype(jnp.float32), q.astype(jnp.float32)
    delta = (g32 * out.astype(jnp.float32)).sum(-1)  # [..., G, T]: rowsum(dO * O)
    ok_fn = _chunk_ok(valid, causal, q.shape[-2])

    def step(dq, i):
        start = i * chunk
        kc, vc = (jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=-2).astype(jnp.float32) for a in (k, v))
        ok = ok_fn(start, chunk)
        s = jnp.einsum("...gsd,...td->...gst", q32, kc) * scale
        with float32_scope("f32_softmax"):
            p = jnp.where(ok, jnp.exp(s - lse[..., None]), 0.0)  # [..., G, T, chunk]
        dv = jnp.einsum("...gst,...gsd->...td", p, g32)
        ds = p * (jnp.einsum("...gsd,...td->...gst", g32, vc) - delta[..., None]) * scale
        dk = jnp.einsum("...gst,...gsd->...td", ds, q32)
        return dq + jnp.einsum("...gst,...td->...gsd", ds, kc), (dk, dv)

    dq, (dk, dv) = jax.lax.scan(step, jnp.zeros(q.shape, jnp.float32), jnp.arange(k.shape[-2] // chunk))
    dk, dv = (jnp.moveaxis(x, 0, -3).reshape(k.shape) for x in (dk, dv))  # [n, ..., c, d] -> [..., T', d]
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


# The chunked core's remat rule is written three ways, and ``"auto"`` takes the first that the
# installed JAX has: the two remat rules need JAX 0.12 and ``jax_custom_vjp3``, a plain
# ``custom_vjp`` runs on any JAX.
_NEEDS = {"defremat": "custom_vjp.defremat", "custom_gradient": "custom_gradient(remat=True)"}
VJP3_RULES = tuple(_NEEDS)


def available_rules() -> tuple[str, ...]:
    """The chunked remat rules that the installed JAX has, the one ``"auto"`` takes first."""
    return tuple(r for r in (*_NEEDS, "custom_vjp") if r not in _NEEDS or jaxfeatures.has(_NEEDS[r]))


def _checked(rule: str, build):
    """``build`` after one line naming the JAX that ``rule`` needs, where the installed one lacks it."""

    def checked(causal: bool, chunk: int):
        here = f"available here: {', '.join(available_rules())}"
        jaxfeatures.require(_NEEDS[rule], f"attention remat rule {rule!r}", here)
        return build(causal, chunk)

    return checked


def enable() -> None:
    """Turn on ``jax_custom_vjp3`` where the rule ``"auto"`` picks needs it (:data:`VJP3_RULES`).
    JAX keys its compile caches on its config, so this must happen before a program using the op
    is first traced: flipped during the first trace, the next call of the same ``jit`` would
    compile again. Model configs call it when they choose ``attention = "chunked"``
    (``sequence.check_attention``)."""
    if available_rules()[0] in VJP3_RULES and not jax.config.jax_custom_vjp3:
        jax.config.update("jax_custom_vjp3", True)


@functools.cache
def _attend(causal: bool, chunk: int):
    """The chunked core for one (causal, chunk): a ``custom_vjp`` whose remat rule keeps the
    output and the log-sum-exp, and whose backward recomputes the rest."""
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
        return (*_backward(q, k, v, valid, out, lse, g, causal, chunk), None)

    attend.defremat(fwd, rem, bwd)
    return attend


@functools.cache
def _attend_custom_gradient(causal: bool, chunk: int):
    """The same rule through ``jax.custom_gradient(remat=True)``: what ``rem`` closes over (the
    output and the log-sum-exp) is saved from the forward pass; its arguments are the replay's."""
    if not jax.config.jax_custom_vjp3:  # custom_gradient(remat=True) needs it (not jax_remat3 here)
        jax.config.update("jax_custom_vjp3", True)

    @functools.partial(jax.custom_gradient, remat=True)
    def attend(q, k, v, valid):
        out, lse = _forward(q, k, v, valid, causal, chunk)

        def rem(q, k, v, valid):
            def vjp(g):
                return (*_backward(q, k, v, valid, out, lse, g, causal, chunk), None)

            return out, vjp

        return out, rem

    return attend


@functools.cache
def _attend_custom_vjp(causal: bool, chunk: int):
    """The same rule as a plain ``custom_vjp``, for a JAX without the two above: the residuals
    are the inputs, the output and the log-sum-exp, as theirs. With no remat rule, a policy that
    recomputes the block (``full``) replays the chunked forward once more in the backward pass;
    the values and gradients are the same."""

    @jax.custom_vjp
    def attend(q, k, v, valid):
        return _forward(q, k, v, valid, causal, chunk)[0]

    def fwd(q, k, v, valid):
        out, lse = _forward(q, k, v, valid, causal, chunk)
        return out, (q, k, v, valid, out, lse)

    def bwd(res, g):
        return (*_backward(*res, g, causal, chunk), None)

    attend.defvjp(fwd, bwd)
    return attend


def _attend_auto(causal: bool, chunk: int):
    """The first of :func:`available_rules`."""
    return RULES[available_rules()[0]](causal, chunk)


RULES = {
    "auto": _attend_auto,
    "defremat": _checked("defremat", _attend),
    "custom_gradient": _checked("custom_gradient", _attend_custom_gradient),
    "custom_vjp": _attend_custom_vjp,
}


def _chunked(q, k, v, heads: int, kv_heads: int, chunk: int, causal: bool, key_mask, rule: str):
    seq = k.shape[-2]
    qh, kh, vh = _grouped(q, heads, kv_heads), _heads(k, kv_heads), _heads(v, kv_heads)
    chunk = max(1, min(chunk, seq))
    pad = -seq % chunk
    valid = jnp.ones(kh.shape[:-1], bool)
    if key_mask is not None:
        valid = jnp.broadcast_to(jnp.asarray(key_mask, bool)[..., None, :], kh.shape[:-1])
    if pad:
        widths = [(0, 0)] * (kh.ndim - 2) + [(0, pad), (0, 0)]
        kh, vh, valid = jnp.pad(kh, widths), jnp.pad(vh, widths), jnp.pad(valid, widths[:-1])
    return _ungrouped(RULES[rule](bool(causal), int(chunk))(qh, kh, vh, valid))


# --- cached reads ------------------------------------------------------------------------


def _cached(q, k, v, heads: int, kv_heads: int, cache: CacheSlice, chunk: int) -> jax.Array:
    """The new tokens' q [B, S, H * d] over the cached keys (slots [pad_b, slot)) and their own
    k, v [B, S, KV * d] (slot + i reads new slots [max(pad_b, slot), slot + i]). The cache
    holds p = KV / ``cache.k.shape[1]`` heads to a row (:class:`CacheSlice`)."""
    b, s, width = q.shape
    qh, kh, vh = _grouped(q, heads, kv_heads), _heads(k, kv_heads), _heads(v, kv_heads)
    rows, pad, slot = jnp.arange(s), cache.pad[:, None, None, None], cache.slot

    def new_ok(start, size):  # -> [B, 1, 1, S, size]
        keys = start + jnp.arange(size)
        return ((keys[None, :] <= rows[:, None]) & (slot + keys >= pad))[:, None]

    def past_ok(start, size):
        keys = start + jnp.arange(size)
        return ((keys >= pad) & (keys < slot))[:, None]

    def divisor(n):  # a chunk that divides n (slots come in powers of two)
        return math.gcd(n, chunk) if chunk else 0

    out = _online(qh, kh, vh, new_ok, divisor(s))
    if cache.k is not None:
        per_row, scale = kv_heads // cache.k.shape[1], 1.0 / math.sqrt(width // heads)
        past = _online(spread(qh, per_row), cache.k, cache.v, past_ok, divisor(cache.k.shape[-2]), scale)
        out = _merge(gathered(past, kv_heads, per_row), out)
    return _ungrouped(_finish(*out)[0]).astype(q.dtype)


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    num_heads: int,
    num_kv_heads: int | None = None,
    *,
    kind: str = "dense",
    chunk: int = 64,
    causal: bool = True,
    key_mask: jax.Array | None = None,
    cache: CacheSlice | None = None,
    rule: str = "auto",
    blocks: SplashBlocks | None = None,
) -> jax.Array:
    """``softmax(q k^T / sqrt(d_head) + mask) v`` per head: the models' attention.

    q: [..., T, H * d_head]; k, v: [..., T, KV * d_head] (KV = ``num_kv_heads``, dividing H).
    ``kind``: one of :data:`KINDS` (chunked: keys ``chunk`` at a time, T need not divide by it;
    splash interpreted off a TPU, tuned by ``blocks``, a config's ``splash_blocks``). ``causal``
    adds the causal mask, ``key_mask`` [..., T] (True: a real key) masks padding; a row with no
    key to read gives zeros (chunked, cached). ``cache``: the queries are new tokens [B, S, ...]
    at slots [slot, slot + S) that also read the cache (always causal). ``rule``: how chunked's
    remat rule is written (:data:`RULES`; ``"auto"``: :func:`available_rules`' first). -> [..., T, H * d_head]."""
    if kind not in KINDS:
        raise ValueError(f"unknown attention {kind!r}; valid: {', '.join(KINDS)}")
    if rule not in RULES:
        raise ValueError(f"unknown attention remat rule {rule!r}; valid: {', '.join(RULES)}")
    num_kv_heads = num_kv_heads or num_heads
    kind = resolve(kind)
    chunk = chunk if kind == "chunked" else 0
    if cache is not None:
        return _cached(q, k, v, num_heads, num_kv_heads, cache, chunk)
    if kind == "splash":
        return splash(q, k, v, num_heads, num_kv_heads, causal=causal, key_mask=key_mask, blocks=blocks)
    if kind == "cudnn":
        return cudnn(q, k, v, num_heads, num_kv_heads, causal=causal, key_mask=key_mask)
    if chunk:
        return _chunked(q, k, v, num_heads, num_kv_heads, chunk, causal, key_mask, rule)
    return _dense(q, k, v, num_heads, num_kv_heads, causal, key_mask)
