"""Decoder-only transformer in Equinox: pre-LayerNorm, causal attention, GELU MLP,
learned positions. Works as a language model or, with a pooled head, a sequence classifier."""

from __future__ import annotations

import equinox as eqx
import jax
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.attention import CacheSlice, attention
from zoo.models.splash import SplashBlocks
from zoo.models.stack import run_stack
from zoo.models.transformer.config import TransformerConfig
from zoo.scan import Remat


class Attention(eqx.Module):
    """Causal multi-head self-attention: [B, T, D] -> [B, T, D]."""

    q: eqx.nn.Linear
    k: eqx.nn.Linear
    v: eqx.nn.Linear
    o: eqx.nn.Linear
    num_heads: int = eqx.field(static=True)
    kind: str = eqx.field(static=True)
    chunk: int = eqx.field(static=True)
    blocks: SplashBlocks = eqx.field(static=True)

    def __init__(self, cfg: TransformerConfig, *, key: jax.Array):
        d, bias = cfg.d_model, cfg.attn_bias
        kq, kk, kv, ko = jax.random.split(key, 4)
        self.q = eqx.nn.Linear(d, d, use_bias=bias, key=kq)
        self.k = eqx.nn.Linear(d, d, use_bias=bias, key=kk)
        self.v = eqx.nn.Linear(d, d, use_bias=bias, key=kv)
        self.o = eqx.nn.Linear(d, d, use_bias=bias, key=ko)
        self.num_heads = cfg.num_heads
        self.kind, self.chunk, self.blocks = cfg.attention, cfg.attention_chunk, cfg.splash_blocks

    def __call__(self, x: jax.Array, cache: CacheSlice | None = None) -> tuple[jax.Array, tuple]:
        """``(output, (k, v))``: k and v are what a cache keeps of these tokens."""
        q = checkpoint_name(ops.dense(self.q, x), names.ATTN_Q)
        k = checkpoint_name(ops.dense(self.k, x), names.ATTN_K)
        v = checkpoint_name(ops.dense(self.v, x), names.ATTN_V)
        setting = dict(kind=self.kind, chunk=self.chunk, cache=cache, blocks=self.blocks)
        context = attention(q, k, v, self.num_heads, **setting)
        context = checkpoint_name(context, names.ATTN_CONTEXT)
        return checkpoint_name(ops.dense(self.o, context), names.ATTN_OUT), (k, v)


class FeedForward(eqx.Module):
    """GELU MLP: [B, T, D] -> [B, T, D] through a d_ff hidden layer."""

    up: eqx.nn.Linear
    down: eqx.nn.Linear

    def __init__(self, cfg: TransformerConfig, *, key: jax.Array):
        k_up, k_down = jax.random.split(key)
        self.up = eqx.nn.Linear(cfg.d_model, cfg.d_ff, key=k_up)
        self.down = eqx.nn.Linear(cfg.d_ff, cfg.d_model, key=k_down)

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = checkpoint_name(ops.dense(self.up, x), names.MLP_HIDDEN)
        return checkpoint_name(ops.dense(self.down, jax.nn.gelu(hidden)), names.MLP_OUT)


class Block(eqx.Module):
    """x + attn(ln1(x)), then + mlp(ln2(x))."""

    ln1: eqx.nn.LayerNorm
    attn: Attention
    ln2: eqx.nn.LayerNorm
    mlp: FeedForward
    mlp_chunk: int = eqx.field(static=True)

    def __init__(self, cfg: TransformerConfig, *, key: jax.Array):
        k_attn, k_mlp = jax.random.split(key)
        self.ln1 = eqx.nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.attn = Attention(cfg, key=k_attn)
        self.ln2 = eqx.nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        self.mlp = FeedForward(cfg, key=k_mlp)
        self.mlp_chunk = cfg.mlp_chunk

    def __call__(self, x: jax.Array, positions=None, cache: CacheSlice | None = None):
        """x [B, T, D] -> x, or with a cache ``(x, (k, v))`` (:mod:`zoo.models.stack`). The
        positions are the embedding's business here: the block reads none."""
        attended, written = self.attn(ops.layer_norm(self.ln1, x), cache)
        x = x + attended
        x = x + ops.token_chunks(self.mlp_branch, x, self.mlp_chunk)
        return x if cache is None else (x, written)

    def mlp_branch(self, x: jax.Array) -> jax.Array:
        """mlp(ln2(x)): token by token, so it may run on chunks of tokens (cfg.mlp_chunk)."""
        return self.mlp(ops.layer_norm(self.ln2, x))


class Transformer(eqx.Module):
    """Tokens [B, T] (or features [B, T, d_in]) -> logits [B, T, vocab] (or [B, classes])."""

    embed: eqx.nn.Linear | eqx.nn.Embedding
    pos: eqx.nn.Embedding
    blocks: Block
    ln_f: eqx.nn.LayerNorm
    head: eqx.nn.Linear | None
    cfg: TransformerConfig = eqx.field(static=True)

    def __init__(self, cfg: TransformerConfig, *, key: jax.Array):
        k_embed, k_pos, k_blocks, k_head = jax.random.split(key, 4)
        self.cfg = cfg
        if cfg.takes_features:
            self.embed = eqx.nn.Linear(cfg.d_in, cfg.d_model, key=k_embed)
        else:
            self.embed = eqx.nn.Embedding(cfg.table_rows, cfg.d_model, key=k_embed)
        self.pos = eqx.nn.Embedding(cfg.max_len, cfg.d_model, key=k_pos)
        self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(jax.random.split(k_blocks, cfg.num_layers))
        self.ln_f = eqx.nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
        # a tied head reads the token embedding (ops.unembed) and has no module of its own
        self.head = None if cfg.tie_head else eqx.nn.Linear(cfg.d_model, cfg.head_width, key=k_head)

    def stack(self):
        """``(layer_fn, stacked params)``: what :func:`zoo.scan.scan_layers` runs."""
        return ops.layer_stack(self.blocks)

    def __call__(self, x: jax.Array, *, remat: Remat = "none", positions=None, cache=None):
        """Logits [B, T, V] (or [B, classes]); with a cache (decoding, :mod:`zoo.models.stack`)
        ``(logits [B, 1, V], (k, v))`` of new tokens at ``positions`` [B, T]."""
        self.cfg.check_input(x)
        embed = ops.dense if self.cfg.takes_features else ops.embed
        pos = ops.positions(self.pos, x) if positions is None else ops.embed(self.pos, positions)
        return run_stack(self, embed(self.embed, x) + pos, remat=remat, positions=positions, cache=cache)

    def logits(self, h: jax.Array) -> jax.Array:
        """The final norm (and pooling, for a classifier) and the head."""
        h = ops.layer_norm(self.ln_f, h)
        if self.cfg.is_classifier:
            h = h.mean(axis=1)
        logits = ops.unembed(self.embed, h) if self.head is None else ops.head(self.head, h)
        return checkpoint_name(self.cfg.visible(logits), names.LOGITS)
