"""Attention through the Pallas TPU splash kernel (``jax.experimental.pallas.ops.tpu``).

The kernel is flash attention written for the TPU: it reads queries and keys a block at a
time, skips the blocks the causal mask empties, and keeps no ``[T, T]`` array in the forward
or the backward pass. zoo calls it for ``attention = "splash"`` and, on a TPU, for
``attention = "auto"`` (:func:`resolve`). On any other backend it runs in Pallas' interpret
mode: the same kernel, evaluated with XLA's ordinary ops. That is how the CPU tests compare
it with dense attention, and it is far too slow for training on a CPU.

What zoo adds around the kernel:

- **Scale.** The kernel computes ``softmax(q k^T) v``; the queries enter scaled by
  ``1 / sqrt(d_head)``.
- **Grouped heads** (Llama's KV heads): each key/value head serves ``G = H / KV`` query
  heads through the kernel's multi-query form, mapped over the KV heads.
- **Key padding** (``key_mask``) becomes the kernel's segment ids: a real token is segment 1,
  padding segment 0, and a query reads only keys of its own segment. Real query rows equal
  dense attention's; a padding query row reads padding keys (dense gives it the mean of the
  real values). A loss masks those rows either way.
- **Lengths.** The kernel's blocks are multiples of 128 tokens and divide the sequence, so a
  sequence is padded at its end to a whole number of blocks (causal: padding keys come after
  every real query and are masked by the causal mask; otherwise by the segment ids) and the
  padding rows are dropped from the output.
- **Remat names.** The kernel's residuals (its output and the per-row log-sum-exp) carry the
  name ``attn_context`` (``residual_checkpoint_name``), so a policy that saves
  ``attn_context`` (``save-attn``, ``minimal``) keeps them, and its backward pass does not run
  the forward kernel again.
- **Block sizes** (:class:`SplashBlocks`, the model config's ``splash_*`` fields): tokens per
  query and key block of the forward kernel and of each backward kernel (dk/dv and dq), as
  the library's ``BlockSizes`` has them, and whether the backward pass is one fused kernel.
  They are configuration, read from the model's config on every call, never module state.
  The library's default is 128; zoo's is 512 everywhere, measured on a TPU v5e at T = 1024
  against 128 and 1024, and the split backward (the fused one did not finish compiling there):
  ``benchmarks/device/RESULTS.md``, "Block size".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

from zoo import names
from zoo.checks import is_int

LANES = 128  # the kernel's blocks are multiples of this many tokens

# The block fields of the library's BlockSizes, forward then the dk/dv and the dq kernels.
FORWARD = ("block_q", "block_kv", "block_kv_compute")
BACKWARD_DKV = ("block_q_dkv", "block_kv_dkv", "block_kv_dkv_compute")
BACKWARD_DQ = ("block_q_dq", "block_kv_dq")
FIELDS = FORWARD + BACKWARD_DKV + BACKWARD_DQ
COMPUTE = {"block_kv_compute": "block_kv", "block_kv_dkv_compute": "block_kv_dkv"}  # part: whole


@dataclass(frozen=True)
class SplashBlocks:
    """Tokens per block of the splash kernels, and the backward kernel's form.

    Each block is a positive multiple of :data:`LANES`; a ``*_compute`` block (the slice of a
    key block one inner step computes) divides its key block. A block longer than the
    sequence (rounded up to :data:`LANES`) is cut to it (:meth:`for_length`). With
    ``fused_backward`` one kernel computes dq, dk and dv and the ``*_dq`` blocks are unused.
    The defaults were measured on a TPU v5e (GPT-2 124M, T 1024: 512 against 128 and 1024;
    ``benchmarks/device/RESULTS.md``)."""

    block_q: int = 512
    block_kv: int = 512
    block_kv_compute: int = 512
    block_q_dkv: int = 512
    block_kv_dkv: int = 512
    block_kv_dkv_compute: int = 512
    block_q_dq: int = 512
    block_kv_dq: int = 512
    fused_backward: bool = False

    def check(self, prefix: str = "") -> None:
        """Raise ValueError naming the first bad setting (as ``prefix + field``) and what is
        valid."""
        for name in FIELDS:
            value = getattr(self, name)
            if not is_int(value) or value < LANES or value % LANES:
                raise ValueError(
                    f"{prefix}{name} must be a positive multiple of {LANES} (the kernel's lanes: "
                    f"128, 256, 512, 1024, ...); got {value!r}."
                )
        for part, whole in COMPUTE.items():
            size, of = getattr(self, part), getattr(self, whole)
            if of % size:
                valid = [b for b in range(LANES, of + 1, LANES) if of % b == 0]
                raise ValueError(
                    f"{prefix}{part} must divide {prefix}{whole} ({of}); got {size}. "
                    f"Valid: {', '.join(map(str, valid))}."
                )
        if not isinstance(self.fused_backward, bool):
            raise ValueError(f"{prefix}fused_backward must be true or false; got {self.fused_backward!r}.")

    def used(self) -> dict:
        """``{field: tokens}`` of the blocks the kernels read: every one, less the ``*_dq``
        blocks under ``fused_backward``."""
        names = FORWARD + BACKWARD_DKV + (() if self.fused_backward else BACKWARD_DQ)
        return {name: getattr(self, name) for name in names}

    def for_length(self, seq: int) -> tuple[int, dict]:
        """``(padded, sizes)`` for a sequence of ``seq`` tokens: each block cut to ``seq``
        rounded up to :data:`LANES` (a compute block then to a divisor of its key block), the
        ``*_dq`` blocks left out under ``fused_backward``, and the length padded to a whole
        number of every block (their least common multiple)."""
        cap = -(-seq // LANES) * LANES
        sizes = {name: min(size, cap) for name, size in self.used().items()}
        for part, whole in COMPUTE.items():
            sizes[part] = math.gcd(sizes[part], sizes[whole])
        unit = math.lcm(*(size for name, size in sizes.items() if name not in COMPUTE))
        return -(-seq // unit) * unit, sizes

    def ran(self, seq: int | None = None) -> dict:
        """What the kernels run with, for a run's summary: the block sizes (at ``seq`` tokens
        when given, as :meth:`for_length` cuts them) and the backward kernel."""
        sizes = self.for_length(seq)[1] if seq else self.used()
        return {"blocks": sizes, "backward": "fused" if self.fused_backward else "dkv and dq kernels"}


def on_tpu() -> bool:
    return jax.default_backend() == "tpu"


def resolve(kind: str) -> str:
    """The attention that ``kind`` runs on this backend: ``"auto"`` is ``"splash"`` on a TPU
    and ``"dense"`` elsewhere; every other kind is itself."""
    if kind != "auto":
        return kind
    return "splash" if on_tpu() else "dense"


def _kernel(seq: int, group: int, causal: bool, sizes: dict, fused: bool, interpret: bool):
    """The splash kernel for ``group`` query heads per key head over ``seq`` tokens (a multiple
    of every block in ``sizes``): multi-head (group 1, called per head) or multi-query (keys
    shared). Made anew in every trace: its mask tables are arrays, and a kernel kept from
    another trace would hand them to this one as constants that a compiled step is then called
    without."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    one = sm.CausalMask((seq, seq)) if causal else sm.FullMask((seq, seq))
    return sk.make_splash_mqa_single_device(
        sm.MultiHeadMask([one] * group),
        block_sizes=sk.BlockSizes(**sizes, use_fused_bwd_kernel=fused),
        residual_checkpoint_name=names.ATTN_CONTEXT,
        interpret=interpret,
    )


def _segments(key_mask, batch_shape, seq: int, padded: int, causal: bool):
    """Segment ids [*batch, padded] (1 real, 0 padding), or None where nothing is masked."""
    if key_mask is None and (causal or padded == seq):
        return None
    real = jnp.ones((*batch_shape, seq), jnp.int32)
    if key_mask is not None:
        real = jnp.broadcast_to(jnp.asarray(key_mask, bool), (*batch_shape, seq)).astype(jnp.int32)
    return jnp.pad(real, [(0, 0)] * len(batch_shape) + [(0, padded - seq)])


def splash(
    q,
    k,
    v,
    heads: int,
    kv_heads: int,
    *,
    causal: bool = True,
    key_mask=None,
    blocks: SplashBlocks | None = None,
):
    """``softmax(q k^T / sqrt(d_head) + mask) v`` by the splash kernel.

    q: [B, T, H * d]; k, v: [B, T, KV * d]; ``key_mask`` [B, T] (True = a real key) or None.
    Returns [B, T, H * d] in q's dtype. ``blocks``: the kernels' block sizes and backward form
    (default :class:`SplashBlocks`'s)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    batch, seq, width = q.shape
    d_head, group = width // heads, heads // kv_heads
    blocks = blocks or SplashBlocks()
    padded, sizes = blocks.for_length(seq)
    kernel = _kernel(padded, group, bool(causal), sizes, blocks.fused_backward, not on_tpu())

    def split(x, n):  # [B, T, n * d] -> [B, n, padded, d]
        x = jnp.pad(x, [(0, 0), (0, padded - seq), (0, 0)])
        return jnp.swapaxes(x.reshape(batch, padded, n, d_head), 1, 2)

    qh = split(q * jnp.asarray(1.0 / math.sqrt(d_head), q.dtype), heads)
    qh = qh.reshape(batch, kv_heads, group, padded, d_head)
    kh, vh = split(k, kv_heads), split(v, kv_heads)
    segments = _segments(key_mask, (batch,), seq, padded, causal)

    def one(qg, kg, vg, seg):  # [G, T, d] over [T, d]
        ids = None if seg is None else sk.SegmentIds(q=seg, kv=seg)
        return kernel(qg, kg, vg, ids)

    per_kv = jax.vmap(one, in_axes=(0, 0, 0, None))
    out = jax.vmap(per_kv, in_axes=(0, 0, 0, None if segments is None else 0))(qh, kh, vh, segments)
    out = out.reshape(batch, heads, padded, d_head)[:, :, :seq]
    return jnp.swapaxes(out, 1, 2).reshape(batch, seq, width).astype(q.dtype)
