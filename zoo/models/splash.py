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
- **Block sizes** (:data:`BLOCK`): tokens per query and key block, in the forward and both
  backward kernels. The library's default is 128; on a TPU v5e at T = 1024 larger blocks are
  much faster (``benchmarks/device/RESULTS.md``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from zoo import names

LANES = 128  # the kernel's blocks are multiples of this many tokens
BLOCK = 512  # tokens per block, capped by the (padded) sequence: tuned on a TPU v5e
FUSED_BACKWARD = False  # one backward kernel for dq, dk and dv (the library's option)


def on_tpu() -> bool:
    return jax.default_backend() == "tpu"


def resolve(kind: str) -> str:
    """The attention that ``kind`` runs on this backend: ``"auto"`` is ``"splash"`` on a TPU
    and ``"dense"`` elsewhere; every other kind is itself."""
    if kind != "auto":
        return kind
    return "splash" if on_tpu() else "dense"


def block_for(seq: int, block: int | None = None) -> int:
    """The block size for a sequence of ``seq`` tokens: ``block`` (default :data:`BLOCK`), but
    no longer than the sequence rounded up to :data:`LANES`."""
    block = block or BLOCK
    if block % LANES:
        raise ValueError(f"splash attention's block must be a multiple of {LANES}, got {block}")
    return min(block, -(-seq // LANES) * LANES)


def _kernel(seq: int, group: int, causal: bool, block: int, interpret: bool):
    """The splash kernel for ``group`` query heads per key head over ``seq`` tokens (a multiple
    of ``block``): multi-head (group 1, called per head) or multi-query (keys shared). Made
    anew in every trace: its mask tables are arrays, and a kernel kept from another trace would
    hand them to this one as constants that a compiled step is then called without."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    one = sm.CausalMask((seq, seq)) if causal else sm.FullMask((seq, seq))
    dq = {} if FUSED_BACKWARD else {"block_q_dq": block, "block_kv_dq": block}
    sizes = sk.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        use_fused_bwd_kernel=FUSED_BACKWARD,
        **dq,
    )
    return sk.make_splash_mqa_single_device(
        sm.MultiHeadMask([one] * group),
        block_sizes=sizes,
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


def splash(q, k, v, heads: int, kv_heads: int, *, causal: bool = True, key_mask=None, block=None):
    """``softmax(q k^T / sqrt(d_head) + mask) v`` by the splash kernel.

    q: [B, T, H * d]; k, v: [B, T, KV * d]; ``key_mask`` [B, T] (True = a real key) or None.
    Returns [B, T, H * d] in q's dtype. ``block``: tokens per block (default :data:`BLOCK`)."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk

    batch, seq, width = q.shape
    d_head, group = width // heads, heads // kv_heads
    size = block_for(seq, block)
    padded = -(-seq // size) * size
    kernel = _kernel(padded, group, bool(causal), size, not on_tpu())

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
