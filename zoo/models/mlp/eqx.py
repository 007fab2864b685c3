"""Classifier MLP in Equinox: [pca ->] in_proj -> L scanned dense blocks -> head."""

from __future__ import annotations

import equinox as eqx
import jax
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.mlp.config import MLPConfig
from zoo.scan import Remat, scan_layers


class Block(eqx.Module):
    """One dense layer plus activation: [B, H] -> [B, H]."""

    dense: eqx.nn.Linear
    activation: str = eqx.field(static=True)

    def __init__(self, cfg: MLPConfig, *, key: jax.Array):
        self.dense = eqx.nn.Linear(cfg.d_hidden, cfg.d_hidden, key=key)
        self.activation = cfg.activation

    def __call__(self, x: jax.Array) -> jax.Array:
        hidden = checkpoint_name(ops.dense(self.dense, x), names.MLP_HIDDEN)
        return checkpoint_name(ops.ACTIVATIONS[self.activation](hidden), names.MLP_OUT)


class MLP(eqx.Module):
    """x [B, d_in] -> logits [B, num_classes]. Blocks (if any) are stacked on a leading L axis."""

    pca: eqx.nn.Linear | None
    in_proj: eqx.nn.Linear
    blocks: Block | None
    head: eqx.nn.Linear
    cfg: MLPConfig = eqx.field(static=True)

    def __init__(self, cfg: MLPConfig, *, key: jax.Array):
        k_pca, k_in, k_blocks, k_head = jax.random.split(key, 4)
        self.cfg = cfg
        # a fixed projection: no bias, never trained (cfg.input_projection)
        self.pca = eqx.nn.Linear(cfg.d_in, cfg.d_pca, use_bias=False, key=k_pca) if cfg.d_pca else None
        self.in_proj = eqx.nn.Linear(cfg.d_first, cfg.d_hidden, key=k_in)
        self.blocks = None
        if cfg.num_layers:
            keys = jax.random.split(k_blocks, cfg.num_layers)
            self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(keys)
        self.head = eqx.nn.Linear(cfg.d_hidden, cfg.num_classes, key=k_head)

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
