"""Classifier MLP in Flax NNX: [pca ->] in_proj -> L scanned dense blocks -> head."""

from __future__ import annotations

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.mlp.config import MLPConfig
from zoo.scan import Remat, scan_layers


class Block(nnx.Module):
    """One dense layer plus activation: [B, H] -> [B, H]."""

    def __init__(self, cfg: MLPConfig, *, rngs: nnx.Rngs):
        self.dense = nnx.Linear(cfg.d_hidden, cfg.d_hidden, rngs=rngs)
        self.activation = cfg.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = checkpoint_name(ops.dense(self.dense, x), names.MLP_HIDDEN)
        return checkpoint_name(ops.ACTIVATIONS[self.activation](hidden), names.MLP_OUT)


class MLP(nnx.Module):
    """x [B, d_in] -> logits [B, num_classes]. Blocks (if any) are stacked on a leading L axis."""

    def __init__(self, cfg: MLPConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        if cfg.d_pca:  # a fixed projection: no bias, never trained (cfg.input_projection)
            self.pca = nnx.Linear(cfg.d_in, cfg.d_pca, use_bias=False, rngs=rngs)
        self.in_proj = nnx.Linear(cfg.d_first, cfg.d_hidden, rngs=rngs)
        if cfg.num_layers:

            @nnx.split_rngs(splits=cfg.num_layers)
            @nnx.vmap(in_axes=(0,), out_axes=0)
            def stacked_blocks(rngs: nnx.Rngs) -> Block:
                return Block(cfg, rngs=rngs)

            self.blocks = stacked_blocks(rngs)
        self.head = nnx.Linear(cfg.d_hidden, cfg.num_classes, rngs=rngs)

    def stack(self):
        """``(layer_fn, stacked params)``: what :func:`zoo.scan.scan_layers` runs (without
        blocks: the identity on no parameters, for tools that ask every model for its stack)."""
        if not self.cfg.num_layers:
            return (lambda layer, h: h), {}
        return ops.layer_stack(self.blocks)

    def __call__(self, x: jax.Array, *, remat: Remat = "none") -> jax.Array:
        self.cfg.check_input(x)
        if self.cfg.d_pca:
            x = ops.dense(self.pca, x)
        h = ops.ACTIVATIONS[self.cfg.activation](ops.dense(self.in_proj, x))
        if self.cfg.num_layers:  # no stack, no scan: a remat policy has nothing to act on
            h = scan_layers(*self.stack(), h, remat)
        return checkpoint_name(ops.head(self.head, h), names.LOGITS)
