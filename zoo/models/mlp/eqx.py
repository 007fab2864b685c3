"""Classifier MLP in Equinox: in_proj -> L scanned dense blocks -> head."""

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
    """x [B, d_in] -> logits [B, num_classes]. Blocks are stacked on a leading L axis."""

    in_proj: eqx.nn.Linear
    blocks: Block
    head: eqx.nn.Linear
    cfg: MLPConfig = eqx.field(static=True)

    def __init__(self, cfg: MLPConfig, *, key: jax.Array):
        k_in, k_blocks, k_head = jax.random.split(key, 3)
        self.cfg = cfg
        self.in_proj = eqx.nn.Linear(cfg.d_in, cfg.d_hidden, key=k_in)
        self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(jax.random.split(k_blocks, cfg.num_layers))
        self.head = eqx.nn.Linear(cfg.d_hidden, cfg.num_classes, key=k_head)

    def stack(self):
        """``(layer_fn, stacked params)``: what :func:`zoo.scan.scan_layers` runs."""
        return ops.layer_stack(self.blocks)

    def __call__(self, x: jax.Array, *, remat: Remat = "none") -> jax.Array:
        self.cfg.check_input(x)
        h = ops.ACTIVATIONS[self.cfg.activation](ops.dense(self.in_proj, x))
        h = scan_layers(*self.stack(), h, remat)
        return checkpoint_name(ops.head(self.head, h), names.LOGITS)
