"""The op set both backends write their math over, plus input checks and attention.

Parametrised ops (:func:`dense`, :func:`layer_norm`, :func:`rms_norm`, :func:`embed`,
:func:`positions`, :func:`conv`) take the backend's layer (an NNX or Equinox ``Linear``,
``LayerNorm``, ``RMSNorm``, ``Embed``/``Embedding``, ``Conv``) and batched inputs, and report
their output to the active :mod:`zoo.hooks` (ghost clipping's probes and norm taps). They read
the layer's arrays through its backend's adapter (:mod:`zoo.models.backends`), as canonical
leaves, so nothing here tells the backends apart. Everything else is a pure function on arrays.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from zoo import hooks
from zoo.hooks import report
from zoo.models import backends, extensions
from zoo.precision import float32_scope

ACTIVATIONS = {"gelu": jax.nn.gelu, "tanh": jnp.tanh, "relu": jax.nn.relu}


# --- Input checks ---------------------------------------------------------------------------
# Both backends call `cfg.check_input(x)` first thing in `__call__`, so a bad input fails the
# same way in NNX and Equinox (left alone, NNX's embedding lookup gives NaN and Equinox's
# clamps). Shapes are static: they are checked at trace time too, at no cost to the traced
# program. Token ids are values: they are checked here only when concrete (an eager call).
# Under `jit` they are tracers and nothing is added to the program -- the training step feeds
# ids from zoo's own tokenizer and keeps its equation count; `zoo.apply_fn(..., checked=True)`
# adds `cfg.check_input_values` (a checkify check) for callers that jit untrusted ids.


def check_ids_under_jit(x: jax.Array, vocab_size: int) -> None:
    """A checkify check that every id of ``x`` lies in ``[0, vocab_size)``; works under jit.

    The caller functionalizes it with ``checkify.checkify`` (``zoo.apply_fn(checked=True)``
    does).
    """
    bad = ((x < 0) | (x >= vocab_size)).ravel()
    first_bad = x.ravel()[jnp.argmax(bad)]
    checkify.check(
        ~jnp.any(bad),
        f"token id {{}} is outside the vocabulary: ids must lie in [0, {vocab_size}) (vocab_size)",
        first_bad,
    )


def check_features(x: jax.Array, d_in: int, layout: str) -> None:
    rank = layout.count(",") + 1
    if x.ndim != rank or x.shape[-1] != d_in:
        raise ValueError(f"model input must be {layout} with d_in={d_in}, got shape {tuple(x.shape)}")


def check_token_shape(x: jax.Array) -> None:
    if x.ndim != 2:
        raise ValueError(f"token ids must be [B, T], got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.integer):
        raise TypeError(f"token ids must be integers, got dtype {x.dtype}")


def check_length(length: int, max_len: int) -> None:
    if length > max_len:
        raise ValueError(
            f"sequence length {length} is longer than the model's max_len={max_len}; "
            f"use at most {max_len} positions or a model with a larger max_len"
        )


def check_concrete_ids(x: jax.Array, vocab_size: int) -> None:
    """Ids in ``[0, vocab_size)``, checked only when ``x`` is concrete (not a tracer)."""
    if isinstance(x, jax.core.Tracer):
        return
    ids = np.asarray(x)
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    if bad.size:
        raise ValueError(
            f"token id {int(bad[0])} is outside the vocabulary: ids must lie in [0, {vocab_size}) "
            f"(vocab_size={vocab_size}); {bad.size} of {ids.size} ids are out of range"
        )


# --- Parametrised ops ---------------------------------------------------------------------
# NNX keeps arrays as they are in the canonical tree (a kernel is [in, out]); Equinox keeps a
# Linear weight as [out, in], and its adapter hands the op the canonical (transposed) view.
# Hooks find an op's site by the identity of its arrays, so only untouched canonical arrays
# (NNX's) are recognised; ghost clipping runs the NNX model.


def dense(layer, x: jax.Array, *, out_dtype=None) -> jax.Array:
    """``x @ w + b`` over the last axis of ``x`` ([..., d_in] -> [..., d_out]).

    A layer with an extension registered in :mod:`zoo.models.extensions` (a low-rank adapter,
    :mod:`zoo.lora.adapter`) adds what the extension computes (the adapter's two halves, each
    reported as a dense op of its own). ``out_dtype`` (default: the operands') is the dtype the
    products accumulate in and the output has (:func:`head`: float32 logits)."""
    params, _ = backends.op_params(layer, "dense")
    z = jnp.matmul(x, params["w"], preferred_element_type=out_dtype)
    if "b" in params:
        z = z + params["b"]
    z = report("dense", z, params, x)
    for extension in extensions.dense_hooks():
        delta = extension(layer, x)
        if delta is not None:
            # float32 adapters on a bf16 base: the sum keeps the base's dtype (a scan's carry)
            z = z + delta.astype(z.dtype)
    return z


LOGITS_DTYPE = jnp.float32  # the dtype of a model's logits (head, unembed), under any precision


def head(layer, h: jax.Array) -> jax.Array:
    """A model's output layer, :func:`dense` with float32 logits whatever the compute dtype:
    the products of bf16 operands accumulate in float32 and are never rounded to bf16 (the
    log-softmax and the loss read them; :mod:`zoo.precision`)."""
    return dense(layer, h, out_dtype=LOGITS_DTYPE)


def _norm_params(layer) -> tuple[dict[str, jax.Array], float]:
    params, attrs = backends.op_params(layer, "norm")
    return params, attrs["eps"]


def _scale_shift(kind: str, xhat: jax.Array, params: dict) -> jax.Array:
    y = xhat * params["scale"]
    if "b" in params:
        y = y + params["b"]
    return report(kind, y, params, xhat)


def in_float32(fn, x: jax.Array, scope: str) -> jax.Array:
    """``fn(x)`` for a ``fn`` that computes in float32 and returns ``x``'s dtype (a norm's
    statistics, the softmax), inside its float32 scope (:data:`zoo.precision.FLOAT32_SCOPES`).

    When ``x`` is narrower than float32 (a bf16 compute dtype, :mod:`zoo.precision`), ``fn``
    runs under ``jax.checkpoint``: the backward pass recomputes its float32 intermediates from
    ``x`` instead of keeping them, so what it saves is ``x`` at ``x``'s own width, and a bf16
    step keeps half of what a float32 step keeps. Under float32, ``fn(x)`` as it is."""
    with float32_scope(scope):
        if x.dtype == jnp.float32:
            return fn(x)
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.nothing_saveable)(x)


def _layer_normalised(x: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)  # x itself under float32
    mean = x32.mean(-1, keepdims=True)
    var = jnp.maximum(0.0, (x32 * x32).mean(-1, keepdims=True) - mean * mean)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)


def _rms_normalised(x: jax.Array, eps: float) -> jax.Array:
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt((x32 * x32).mean(-1, keepdims=True) + eps)).astype(x.dtype)


def layer_norm(layer, x: jax.Array) -> jax.Array:
    """``(x - mean) / sqrt(var + eps) * scale + b`` over the last axis. The variance is
    ``E[x^2] - E[x]^2``, as Flax computes it. The statistics and the normalisation are float32
    whatever ``x``'s dtype (:func:`in_float32`); the normalised ``x`` returns to it before the
    scale and shift."""
    params, eps = _norm_params(layer)
    xhat = in_float32(lambda v: _layer_normalised(v, eps), x, "f32_norm_statistics")
    return _scale_shift("norm", xhat, params)


def rms_norm(layer, x: jax.Array) -> jax.Array:
    """``x / sqrt(mean(x^2) + eps) * scale`` over the last axis (statistics in float32, as in
    :func:`layer_norm`)."""
    params, eps = _norm_params(layer)
    xhat = in_float32(lambda v: _rms_normalised(v, eps), x, "f32_norm_statistics")
    return _scale_shift("norm", xhat, params)


def layer_stack(blocks):
    """``(layer_fn, stacked params)`` of a model's stacked blocks (an NNX module built under
    ``nnx.vmap`` or an Equinox module built under ``eqx.filter_vmap``): the pure per-layer
    function and the arrays that :func:`zoo.scan.scan_layers` scans over."""
    return backends.of(blocks).layer_stack(blocks)


def _table(layer) -> jax.Array:
    return backends.op_params(layer, "table")[0]["w"]


def embed(layer, ids: jax.Array) -> jax.Array:
    """Rows of the table for integer ``ids`` [...] -> [..., D]."""
    table = _table(layer)
    return report("gather", jnp.take(table, ids, axis=0), {"w": table}, ids)


def unembed(layer, h: jax.Array) -> jax.Array:
    """A language-model head tied to the token table: ``h @ table^T`` [..., D] -> [..., V],
    no bias, float32 logits as :func:`head`'s. It reads the same leaf as :func:`embed` (ghost
    clipping's ``tied`` rule)."""
    table = _table(layer)
    z = jnp.matmul(h, table.T, preferred_element_type=LOGITS_DTYPE)
    return report("unembed", z, {"w": table}, h)


def positions(layer, like: jax.Array) -> jax.Array:
    """The first T rows of a positional table, broadcast over the batch: ``like`` is the model
    input [B, T, ...]; returns [B, T, D]. (Each example reads each row once, which is what the
    norm rule of this op relies on.)"""
    table = _table(layer)
    batch, seq = like.shape[:2]
    z = jnp.broadcast_to(table[:seq], (batch, seq, table.shape[-1]))
    return report("rows", z, {"w": table})


# --- Convolution and pooling --------------------------------------------------------------
# Images are NHWC. The canonical conv kernel is ``w`` [kh, kw, in, out] (HWIO, a dense
# weight's [in, out] after the window axes) and its bias ``b`` [out]. NNX keeps that layout;
# Equinox keeps [out, in, kh, kw] and a bias [out, 1, 1] (its backend adapter maps both).


def _pairs(value, n: int = 2) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,) * n


def _conv_geometry(layer) -> tuple[dict[str, jax.Array], tuple[int, int], tuple[tuple[int, int], ...]]:
    """``(params, strides, padding)`` of an NNX or Equinox 2-D conv, params canonical."""
    params, attrs = backends.op_params(layer, "conv")
    padding = attrs["padding"]
    if isinstance(padding, str):
        raise TypeError(f"conv() needs explicit ((top, bottom), (left, right)) padding, got {padding!r}")
    padding = tuple(_pairs(p) for p in _pairs(padding))
    return params, tuple(_pairs(attrs["strides"])), padding


@functools.partial(
    jax.tree_util.register_dataclass, data_fields=["x"], meta_fields=["window", "strides", "padding"]
)
@dataclass(frozen=True)
class ConvInput:
    """What a conv op hands its hooks as its input: the image ``x`` [B, H, W, C] it read and
    its geometry (kernel window, strides, explicit padding), so that a norm rule can cut the
    input windows itself (ghost clipping's conv rule, :mod:`zoo.dp.ghost.conv`). A pytree:
    ``x`` is its one array."""

    x: jax.Array
    window: tuple[int, int]
    strides: tuple[int, int]
    padding: tuple[tuple[int, int], tuple[int, int]]


def conv(layer, x: jax.Array) -> jax.Array:
    """2-D convolution of NHWC ``x`` with the layer's kernel, strides and explicit padding, plus
    its bias: [B, H, W, in] -> [B, H', W', out].

    The hooks get the input and the geometry (:class:`ConvInput`): a conv is a dense op over
    the H' x W' output positions of its input windows, which is how its norm rule works."""
    params, strides, padding = _conv_geometry(layer)
    w = params["w"]
    z = jax.lax.conv_general_dilated(x, w, strides, padding, dimension_numbers=("NHWC", "HWIO", "NHWC"))
    if "b" in params:
        z = z + params["b"]
    return report("conv", z, params, ConvInput(x, tuple(w.shape[:2]), strides, padding))


def max_pool(x: jax.Array, window: int, stride: int) -> jax.Array:
    """Max over ``window`` x ``window`` windows of NHWC ``x`` every ``stride`` pixels, no padding
    (PyTorch's ``MaxPool2d(window, stride)``)."""
    return jax.lax.reduce_window(
        x, -jnp.inf, jax.lax.max, (1, window, window, 1), (1, stride, stride, 1), "VALID"
    )


def conv_output_size(size: int, kernel: int, stride: int, padding: int = 0) -> int:
    """Output side of a conv or pool on a ``size`` side (``floor((size + 2p - k) / s) + 1``)."""
    return (size + 2 * padding - kernel) // stride + 1


# --- Token chunks -------------------------------------------------------------------------


def token_chunks(fn, x: jax.Array, chunk: int) -> jax.Array:
    """``fn(x)`` for a function that acts on each token alone (a norm and an MLP), computed
    ``chunk`` tokens at a time, with a remat rule of its own: each chunk is checkpointed, so
    what the chunks keep for the backward pass is their input, and the backward pass
    recomputes one chunk's hidden activations at a time. No ``[B, T, d_ff]`` array exists.

    x: [B, T, D] (T need not divide by ``chunk``: the last chunk is padded and the padding
    dropped). ``chunk`` 0, or at least T, computes ``fn(x)`` at once. So does any call made
    under active :mod:`zoo.hooks` (ghost clipping's passes): the hooks see each op once, on
    the whole sequence. The values are the same either way (to float32 rounding).
    """
    batch, seq = x.shape[:2]
    if not chunk or chunk >= seq or hooks.current() is not None:
        return fn(x)
    count = -(-seq // chunk)
    padded = jnp.pad(x, [(0, 0), (0, count * chunk - seq)] + [(0, 0)] * (x.ndim - 2))
    xs = jnp.moveaxis(padded.reshape(batch, count, chunk, *x.shape[2:]), 1, 0)
    # prevent_cse=False: the chunks are a scan, whose replay XLA cannot merge with the forward.
    # (A lambda, not ``fn``: an Equinox bound method hashes its module, tracers and all.)
    each = jax.checkpoint(
        lambda chunk_x: fn(chunk_x), policy=jax.checkpoint_policies.nothing_saveable, prevent_cse=False
    )
    ys = jax.lax.map(each, xs)
    return jnp.moveaxis(ys, 0, 1).reshape(batch, count * chunk, *ys.shape[3:])[:, :seq]


# --- Positions ---------------------------------------------------------------------------
# (The models' attention, dense, chunked and over a cache, is one function of its own module,
# zoo.models.attention, built on in_float32.)


def rotary(x: jax.Array, num_heads: int, theta: float, freq=None, positions=None) -> jax.Array:
    """Rotary position embedding of ``x`` [..., T, num_heads * d_head]: in each head, the pair
    (i, i + d_head/2) at position t turns by the angle ``t * freq[i]``, by default
    ``freq[i] = theta^(-2i/d_head)`` (Hugging Face's rotate-half layout; ``freq`` [d_head/2]
    gives scaled frequencies such as Llama 3's). ``positions`` [..., T] (default 0..T-1): each
    token's position, as decoding gives them (per row, after left padding)."""
    *lead, seq, width = x.shape
    d_head = width // num_heads
    half = d_head // 2
    if freq is None:
        freq = theta ** (-jnp.arange(half, dtype=jnp.float32) * 2 / d_head)
    freq = jnp.asarray(freq, jnp.float32)
    if positions is None:
        positions = jnp.arange(seq)
    angle = jnp.asarray(positions, jnp.float32)[..., None] * freq  # [..., T, half]
    cos, sin = jnp.cos(angle)[..., None, :], jnp.sin(angle)[..., None, :]  # [..., T, 1, half]
    xh = x.reshape(*lead, seq, num_heads, d_head)
    a, b = xh[..., :half], xh[..., half:]
    turned = jnp.concatenate([a * cos - b * sin, a * sin + b * cos], axis=-1)
    return turned.reshape(*lead, seq, width).astype(x.dtype)
