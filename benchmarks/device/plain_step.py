"""A plain-JAX GPT-2 training step, written here without zoo: the yardstick of ``mfu.py``.

About a hundred lines in the nanoGPT manner: float32 master weights cast to the compute dtype
once per step, a fused q/k/v projection, pre-LayerNorm blocks scanned over the layers, a
tied head, a float32 cross-entropy, and the optimizer it is handed (``mfu.py`` hands it zoo's
own optax AdamW after the global-norm clip, so the two steps differ only in the model and
loss code). Attention is XLA's (einsum, causal mask, float32 softmax), the Pallas splash
kernel with chosen block sizes, or ``sdpa``: ``jax.nn.dot_product_attention``, cuDNN's fused
attention on an NVIDIA GPU and XLA's elsewhere. Remat: ``none``, ``full`` (the layer saves nothing) or
``dots`` (the layer saves its matmul outputs), each over the scanned layer.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import optax


def init(key, vocab: int, d: int, layers: int, heads: int, d_ff: int, max_len: int) -> dict:
    """GPT-2's parameters, normal(0.02) matrices, zero biases, unit norm scales."""
    ks = iter(jax.random.split(key, 8))

    def normal(*shape):
        return 0.02 * jax.random.normal(next(ks), shape, jnp.float32)

    zeros, ones = (lambda *s: jnp.zeros(s)), (lambda *s: jnp.ones(s))
    blocks = {
        "ln1_g": ones(layers, d), "ln1_b": zeros(layers, d),
        "qkv_w": normal(layers, d, 3 * d), "qkv_b": zeros(layers, 3 * d),
        "o_w": normal(layers, d, d), "o_b": zeros(layers, d),
        "ln2_g": ones(layers, d), "ln2_b": zeros(layers, d),
        "up_w": normal(layers, d, d_ff), "up_b": zeros(layers, d_ff),
        "down_w": normal(layers, d_ff, d), "down_b": zeros(layers, d),
    }  # fmt: skip
    del heads
    return {
        "wte": normal(vocab, d),
        "wpe": normal(max_len, d),
        "blocks": blocks,
        "lnf_g": ones(d),
        "lnf_b": zeros(d),
    }


def _ln(x, g, b, eps=1e-5):
    x32 = x.astype(jnp.float32)
    mean = x32.mean(-1, keepdims=True)
    var = jnp.square(x32 - mean).mean(-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * g + b


def _xla_attention(q, k, v):
    """q, k, v [B, H, T, d] -> [B, H, T, d], causal, float32 softmax."""
    seq = q.shape[2]
    s = jnp.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s.astype(jnp.float32), -1e30)
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, -1).astype(v.dtype), v)


def _sdpa_attention(q, k, v):
    """q, k, v [B, T, H, d] -> [B, T, H, d], causal: JAX's fused attention, cuDNN's on a GPU."""
    implementation = "cudnn" if jax.default_backend() == "gpu" else None
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=implementation)


ATTENTIONS = ("xla", "splash", "sdpa")


def _splash_kernel(seq: int, heads: int, block: int, fused: bool, interpret: bool):
    """``fused``: splash's one backward kernel for dq, dk and dv."""
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

    sizes = sk.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        **({"use_fused_bwd_kernel": True} if fused else {"block_q_dq": block, "block_kv_dq": block}),
    )  # fmt: skip
    mask = sm.MultiHeadMask([sm.CausalMask((seq, seq))] * heads)
    return sk.make_splash_mha_single_device(mask, block_sizes=sizes, interpret=interpret)


def _splash_attention(q, k, v, block: int, fused: bool):
    interpret = jax.default_backend() != "tpu"
    kernel = _splash_kernel(q.shape[2], q.shape[1], min(block, q.shape[2]), fused, interpret)
    return jax.vmap(kernel)(q / math.sqrt(q.shape[-1]), k, v)


POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


def logits_fn(params, x, heads: int, attention: str, remat: str, block: int, dtype, fused: bool = False):
    """Logits [B, T, V] (``dtype``) of token ids x [B, T]."""
    p = jax.tree.map(lambda a: a.astype(dtype), params)
    batch, seq = x.shape
    d = p["wte"].shape[1]
    h = p["wte"][x] + p["wpe"][:seq]

    def split(a):  # [B, T, d] -> [B, H, T, d / H]
        return a.reshape(batch, seq, heads, d // heads).transpose(0, 2, 1, 3)

    def layer(h, w):
        a = _ln(h, w["ln1_g"], w["ln1_b"])
        q, k, v = jnp.split(a @ w["qkv_w"] + w["qkv_b"], 3, axis=-1)
        if attention == "sdpa":  # [B, T, H, d] as it is: no transposes
            shape = (batch, seq, heads, d // heads)
            ctx = _sdpa_attention(q.reshape(shape), k.reshape(shape), v.reshape(shape))
        else:
            q, k, v = split(q), split(k), split(v)
            ctx = _xla_attention(q, k, v) if attention == "xla" else _splash_attention(q, k, v, block, fused)
            ctx = ctx.transpose(0, 2, 1, 3)
        h = h + ctx.reshape(batch, seq, d) @ w["o_w"] + w["o_b"]
        m = _ln(h, w["ln2_g"], w["ln2_b"])
        return h + jax.nn.gelu(m @ w["up_w"] + w["up_b"]) @ w["down_w"] + w["down_b"], None

    if POLICIES[remat] is not None:
        layer = jax.checkpoint(layer, policy=POLICIES[remat])
    h, _ = jax.lax.scan(layer, h, p["blocks"])
    return _ln(h, p["lnf_g"], p["lnf_b"]) @ p["wte"].T


def make_step(
    optimizer,
    heads: int,
    attention: str,
    remat: str,
    block: int = 512,
    dtype=jnp.bfloat16,
    fused: bool = False,
):
    """A jitted ``(params, opt_state, x, y) -> (params, opt_state, loss)``, donating the state."""
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown plain attention {attention!r}; valid: {', '.join(ATTENTIONS)}")

    def loss_fn(params, x, y):
        logits = logits_fn(params, x, heads, attention, remat, block, dtype, fused)
        return optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), y).mean()

    def step(params, opt_state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1))
