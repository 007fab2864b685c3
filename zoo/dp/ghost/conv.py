"""The norm rule of the ``conv`` op: per-example gradient norms of a conv kernel from the op's
input and its output gradient (mixed ghost clipping, Bu et al. 2022).

A 2-D conv is a dense op over its output positions: with ``a_p`` the input window read at
output position ``p`` (``K = kh * kw * in`` values) and ``delta_p`` the output gradient there,
example ``i``'s kernel gradient is ``g = sum_p a_p^T delta_p`` [K, out]. Its squared norm
comes two ways:

* ``"gram"`` (the ghost norm): ``sum_{p,q} (a_p . a_q)(delta_p . delta_q)``, about
  ``P^2 (K + out)`` multiply-adds and ``2 P^2`` floats per example for ``P`` positions;
* ``"materialise"`` (the per-example gradient): ``g`` itself, about ``P K out`` multiply-adds
  and ``K out`` floats, and ``g`` then serves the clipped sum directly.

:func:`conv_method` takes the per-example gradient when it is no bigger than the op's own
activations for one example (the rule of a dense op on a sequence,
:func:`zoo.dp.ghost.rules.dense_method`, which is then also the form with fewer
multiply-adds). :func:`layer_methods` lists the choice for any model.

The op hands the rule its input image and geometry (:class:`zoo.models.ops.ConvInput`); the
windows are cut here, after the backward pass, by one gather (:func:`windows`), a few examples
at a time (:func:`chunk_size`): the windows of a chunk are made and used while they are in the
CPU's cache, and never exist for the whole batch. The clipped sum of a Gram-form layer is the
conv's own weight gradient (XLA's kernel for it, as in a non-private backward) on the kept
examples' inputs and their output gradients scaled by the clip factors.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from zoo.dp.ghost import forms
from zoo.dp.ghost.rules import RULES, Rule, dense_method, keep
from zoo.dp.ghost.sites import discover
from zoo.models.canonical import canonical_shapes
from zoo.models.ops import ConvInput

DIMENSIONS = ("NHWC", "HWIO", "NHWC")
CHUNK_BYTES = 4 << 20  # the windows of one chunk of examples: about a CPU's L2/L3 share


def conv_method(positions: int, window: int, out: int, sums: bool = False) -> str:
    """``"gram"`` or ``"materialise"`` for a conv with ``positions`` output positions, ``window``
    inputs per position (kh * kw * in) and ``out`` channels: the rule of
    :func:`~zoo.dp.ghost.rules.dense_method` (``sums``: the clipped sum from the rule too)."""
    return dense_method(positions, window, out, sums)


def chunk_size(batch: int, positions: int, window: int, itemsize: int = 4) -> int:
    """Examples per chunk: as many as keep one chunk's windows (``positions x window`` values
    each) within :data:`CHUNK_BYTES`, at least one; the largest divisor of ``batch`` up to that
    when one is not much smaller (the chunks are then a reshape of the batch, not copies)."""
    most = max(1, CHUNK_BYTES // (positions * window * itemsize))
    divisor = max(n for n in range(1, min(most, batch) + 1) if batch % n == 0)
    return divisor if 2 * divisor >= most or divisor == batch else most


def windows(x: jax.Array, window, strides, padding) -> jax.Array:
    """``a [P, K]``: the input windows of one example's image ``x`` [H, W, C], one row per
    output position (row-major over H' x W'), each ``kh x kw x C`` in the kernel's order (one
    gather of the windows, no arithmetic). For a unit's images ``[records, H, W, C]``
    (:meth:`zoo.dp.ghost.rules.Rule.group`), each record's windows in turn: ``[records * P, K]``."""
    if x.ndim == 4:
        a = jax.vmap(lambda image: windows(image, window, strides, padding))(x)
        return a.reshape(-1, a.shape[-1])
    (kh, kw), (sh, sw) = window, strides
    x = jnp.pad(x, (*padding, (0, 0)))
    oh, ow = (x.shape[0] - kh) // sh + 1, (x.shape[1] - kw) // sw + 1
    starts = np.stack(np.meshgrid(np.arange(oh) * sh, np.arange(ow) * sw, indexing="ij"), -1)
    dims = jax.lax.GatherDimensionNumbers(
        offset_dims=(2, 3, 4), collapsed_slice_dims=(), start_index_map=(0, 1)
    )
    a = jax.lax.gather(
        x, jnp.asarray(starts, jnp.int32), dims, (kh, kw, x.shape[2]), mode="promise_in_bounds"
    )
    return a.reshape(oh * ow, kh * kw * x.shape[2])


def kernel_grad(inp: ConvInput, d: jax.Array, kernel_shape) -> jax.Array:
    """``sum_b sum_p a_bp^T d_bp`` as ``[kh, kw, C, out]``: the conv transposed in its kernel
    (a non-private backward's weight gradient) on the images of ``inp`` and the output
    gradients ``d``."""

    images = inp.x.reshape(-1, *inp.x.shape[-3:])  # a unit's records are images like any other

    def conv(w):
        return jax.lax.conv_general_dilated(images, w, inp.strides, inp.padding, dimension_numbers=DIMENSIONS)

    spec = jax.ShapeDtypeStruct(kernel_shape, images.dtype)
    return jax.linear_transpose(conv, spec)(d.reshape(-1, *d.shape[-3:]).astype(images.dtype))[0]


def _per_example(geometry, method):
    """The per-example work of one form, on an image [H, W, C] and its output gradient [P, out]:
    ``g^T`` [out, K] (materialise) or ``||g||^2`` (gram)."""

    def materialise(x, d):
        return d.T @ windows(x, *geometry)

    def gram(x, d):
        a = windows(x, *geometry)
        return jnp.sum((a @ a.T) * (d @ d.T))

    return materialise if method == "materialise" else gram


class Conv(Rule):
    """``z = conv(x, w) (+ b)``: ``inputs`` a :class:`~zoo.models.ops.ConvInput` (images
    [B, H, W, C]), delta [B, H', W', out]; for units of several records, images
    [U, records, H, W, C] and delta [U, records, H', W', out], the records' output positions
    read as the unit's."""

    def __init__(self, inputs: ConvInput, d, leaves, rows=None, force=None):
        del rows
        b, out = d.shape[0], d.shape[-1]
        positions = math.prod(d.shape[1:-1])
        channels = inputs.x.shape[-1]
        depth = math.prod(inputs.window) * channels
        method = forms.as_choice(force).pick("conv", b, positions, depth, out, inputs.x.dtype)
        geometry = (inputs.window, inputs.strides, inputs.padding)
        self.static = (method, tuple(leaves), geometry, (*inputs.window, channels, out))
        d = d.astype(jnp.float32)
        flat = d.reshape(b, positions, out)
        self.arrays = {}
        if "w" in leaves:
            each = _per_example(geometry, method)
            found = jax.lax.map(
                lambda xd: each(*xd),
                (inputs.x.astype(jnp.float32), flat),
                batch_size=chunk_size(b, positions, depth),
            )
            self.arrays["gT" if method == "materialise" else "sq"] = found
            if method == "gram":  # for the clipped sum: the conv's own weight gradient
                self.arrays["x"], self.arrays["d"] = inputs.x, d
        if "b" in leaves:
            self.arrays["gb"] = flat.sum(axis=1)

    def sq(self):
        method, leaves, _, _ = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            out["w"] = jnp.sum(jnp.square(arr["gT"]), axis=(1, 2)) if method == "materialise" else arr["sq"]
        if "b" in leaves:
            out["b"] = jnp.sum(jnp.square(arr["gb"]), axis=1)
        return out

    def grad(self, weights, use):
        method, leaves, geometry, kernel = self.static
        arr, out = self.arrays, {}
        if "w" in leaves:
            if method == "materialise":
                scaled = jnp.where(use[:, None, None], arr["gT"] * weights[:, None, None], 0.0)
                out["w"] = jnp.sum(scaled, axis=0).T.reshape(kernel)
            else:
                d = arr["d"]
                scaled = keep(d, use) * weights.reshape((-1,) + (1,) * (d.ndim - 1))
                images = keep(arr["x"], use).astype(jnp.float32)  # the sum stays float32
                out["w"] = kernel_grad(ConvInput(images, *geometry), scaled, kernel)
        if "b" in leaves:
            out["b"] = weights @ keep(arr["gb"], use)
        return out


RULES["conv"] = Conv


def layer_methods(cfg, x: jax.Array | jax.ShapeDtypeStruct, sums: bool = True) -> dict[str, str]:
    """``{site path: "gram" or "materialise"}`` for every conv op of the model ``cfg`` on inputs
    shaped like ``x``: the norm form ghost clipping's formula takes for each (``sums``: under
    book-keeping; ``zoo bench dp`` and ``docs/ghost.md`` show it)."""
    sites, _ = discover(cfg, x)
    shapes = canonical_shapes(cfg)
    out = {}
    for site in sites:
        if site.kind == "conv":
            kernel = shapes[f"{site.path}.w"]
            positions = math.prod(site.shape[1:-1])
            out[site.path] = conv_method(positions, math.prod(kernel[-4:-1]), kernel[-1], sums)
    return out
