"""Llama-style decoder in Equinox: pre-RMSNorm blocks, rotary positions, grouped-query causal
attention, SwiGLU MLP, no biases."""

from __future__ import annotations

import equinox as eqx
import jax
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.attention import CacheSlice, attention
from zoo.models.llama.config import LlamaConfig
from zoo.models.stack import run_stack
from zoo.scan import Remat


class Attention(eqx.Module):
    """Grouped-query causal self-attention with rotary q and k: [B, T, D] -> [B, T, D]."""

    q: eqx.nn.Linear
    k: eqx.nn.Linear
    v: eqx.nn.Linear
    o: eqx.nn.Linear
    cfg: LlamaConfig = eqx.field(static=True)

    def __init__(self, cfg: LlamaConfig, *, key: jax.Array):
        d, qw, kv = cfg.d_model, cfg.num_heads * cfg.d_head, cfg.num_kv_heads * cfg.d_head
        kq, kk, kv_key, ko = jax.random.split(key, 4)
        self.q = eqx.nn.Linear(d, qw, use_bias=False, key=kq)
        self.k = eqx.nn.Linear(d, kv, use_bias=False, key=kk)
        self.v = eqx.nn.Linear(d, kv, use_bias=False, key=kv_key)
        self.o = eqx.nn.Linear(qw, d, use_bias=False, key=ko)
        self.cfg = cfg

    def __call__(self, x: jax.Array, positions=None, cache: CacheSlice | None = None):
        """``(output, (k, v))``: k (rotated) and v are what a cache keeps of these tokens, at
        ``positions`` [B, T] (default 0..T-1)."""
        cfg = self.cfg
        q = checkpoint_name(ops.dense(self.q, x), names.ATTN_Q)
        k = checkpoint_name(ops.dense(self.k, x), names.ATTN_K)
        v = checkpoint_name(ops.dense(self.v, x), names.ATTN_V)
        freq = cfg.rope_freq()
        q = ops.rotary(q, cfg.num_heads, cfg.rope_theta, freq, positions)
        k = ops.rotary(k, cfg.num_kv_heads, cfg.rope_theta, freq, positions)
        setting = dict(kind=cfg.attention, chunk=cfg.attention_chunk, cache=cache, blocks=cfg.splash_blocks)
        context = attention(q, k, v, cfg.num_heads, cfg.num_kv_heads, **setting)
        context = checkpoint_name(context, names.ATTN_CONTEXT)
        return checkpoint_name(ops.dense(self.o, context), names.ATTN_OUT), (k, v)


class FeedForward(eqx.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)), [B, T, D] -> [B, T, D]."""

    gate: eqx.nn.Linear
    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, cfg: LlamaConfig, *, key: jax.Array):
        k_gate, k_up, k_down = jax.random.split(key, 3)
        self.gate = eqx.nn.Linear(cfg.d_model, cfg.d_ff, use_bias=False, key=k_gate)
        self.up = eqx.nn.Linear(cfg.d_model, cfg.d_ff, use_bias=False, key=k_up)
        self.down = eqx.nn.Linear(cfg.d_ff, cfg.d_model, use_bias=False, key=k_down)

    def __call__(self, x: jax.Array) -> jax.Array:
        gate = checkpoint_name(ops.dense(self.gate, x), names.MLP_GATE)
        hidden = checkpoint_name(ops.dense(self.up, x), names.MLP_HIDDEN)
        return checkpoint_name(ops.dense(self.down, jax.nn.silu(gate) * hidden), names.MLP_OUT)


class Block(eqx.Module):
    """x + attn(norm(x)), then + mlp(norm(x))."""

    attn_norm: eqx.nn.RMSNorm
    attn: Attention
    mlp_norm: eqx.nn.RMSNorm
    mlp: FeedForward
    mlp_chunk: int = eqx.field(static=True)

    def __init__(self, cfg: LlamaConfig, *, key: jax.Array):
        k_attn, k_mlp = jax.random.split(key)
        self.attn_norm = eqx.nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps, use_bias=False)
        self.attn = Attention(cfg, key=k_attn)
        self.mlp_norm = eqx.nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps, use_bias=False)
        self.mlp = FeedForward(cfg, key=k_mlp)
        self.mlp_chunk = cfg.mlp_chunk

    def __call__(self, x: jax.Array, positions=None, cache: CacheSlice | None = None):
        """x [B, T, D] at ``positions`` -> x, or with a cache ``(x, (k, v))``
        (:mod:`zoo.models.stack`)."""
        attended, written = self.attn(ops.rms_norm(self.attn_norm, x), positions, cache)
        x = x + attended
        x = x + ops.token_chunks(self.mlp_branch, x, self.mlp_chunk)
        return x if cache is None else (x, written)

    def mlp_branch(self, x: jax.Array) -> jax.Array:
        """mlp(norm(x)): token by token, so it may run on chunks of tokens (cfg.mlp_chunk)."""
        return self.mlp(ops.rms_norm(self.mlp_norm, x))


class Llama(eqx.Module):
    """Tokens [B, T] -> logits [B, T, vocab]."""

    embed: eqx.nn.Embedding
    blocks: Block
    norm_f: eqx.nn.RMSNorm
    head: eqx.nn.Linear | None
    cfg: LlamaConfig = eqx.field(static=True)

    def __init__(self, cfg: LlamaConfig, *, key: jax.Array):
        k_embed, k_blocks, k_head = jax.random.split(key, 3)
        self.cfg = cfg
        self.embed = eqx.nn.Embedding(cfg.table_rows, cfg.d_model, key=k_embed)
        self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(jax.random.split(k_blocks, cfg.num_layers))
        self.norm_f = eqx.nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps, use_bias=False)
        # a tied head reads the token embedding (ops.unembed) and has no module of its own
        self.head = (
            None if cfg.tie_head else eqx.nn.Linear(cfg.d_model, cfg.table_rows, use_bias=False, key=k_head)
        )

    def stack(self):
        """``(layer_fn, stacked params)``: what :func:`zoo.scan.scan_layers` runs."""
        return ops.layer_stack(self.blocks)

    def __call__(self, x: jax.Array, *, remat: Remat = "none", positions=None, cache=None):
        """Logits [B, T, V]; with a cache (decoding, :mod:`zoo.models.stack`)
        ``(logits [B, 1, V], (k, v))`` of new tokens at ``positions`` [B, T]."""
        self.cfg.check_input(x)
        return run_stack(self, ops.embed(self.embed, x), remat=remat, positions=positions, cache=cache)

    def logits(self, h: jax.Array) -> jax.Array:
        """The final norm and the head."""
        h = ops.rms_norm(self.norm_f, h)
        logits = ops.unembed(self.embed, h) if self.head is None else ops.head(self.head, h)
        return checkpoint_name(self.cfg.visible(logits), names.LOGITS)
