"""Image-classifier CNN in Equinox: two conv + pool stages, in_proj, L scanned dense blocks, head."""

from __future__ import annotations

import equinox as eqx
import jax
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.cnn.config import CNNConfig
from zoo.models.mlp.eqx import Block  # the dense stack after the convs is the MLP's
from zoo.scan import Remat, scan_layers


def _conv(cfg: CNNConfig, stage: str, d_in: int, key: jax.Array) -> eqx.nn.Conv2d:
    kernel, stride, pad = (getattr(cfg, f"{stage}_{k}") for k in ("kernel", "stride", "padding"))
    features = getattr(cfg, f"{stage}_features")
    return eqx.nn.Conv2d(d_in, features, kernel, stride=stride, padding=((pad, pad), (pad, pad)), key=key)


class CNN(eqx.Module):
    """x [B, H*W*C] -> logits [B, num_classes]. Blocks (if any) are stacked on a leading L axis."""

    conv1: eqx.nn.Conv2d
    conv2: eqx.nn.Conv2d
    in_proj: eqx.nn.Linear
    blocks: Block | None
    head: eqx.nn.Linear
    cfg: CNNConfig = eqx.field(static=True)

    def __init__(self, cfg: CNNConfig, *, key: jax.Array):
        k_c1, k_c2, k_in, k_blocks, k_head = jax.random.split(key, 5)
        self.cfg = cfg
        self.conv1 = _conv(cfg, "conv1", cfg.channels, k_c1)
        self.conv2 = _conv(cfg, "conv2", cfg.conv1_features, k_c2)
        self.in_proj = eqx.nn.Linear(cfg.flat_features, cfg.d_hidden, key=k_in)
        self.blocks = None
        if cfg.num_layers:
            self.blocks = eqx.filter_vmap(lambda k: Block(cfg, key=k))(
                jax.random.split(k_blocks, cfg.num_layers)
            )
        self.head = eqx.nn.Linear(cfg.d_hidden, cfg.num_classes, key=k_head)

    def stack(self):
        """``(layer_fn, stacked params)``: what :func:`zoo.scan.scan_layers` runs (without
        blocks: the identity on no parameters, for tools that ask every model for its stack)."""
        if not self.cfg.num_layers:
            return (lambda layer, h: h), {}
        return ops.layer_stack(self.blocks)

    def __call__(self, x: jax.Array, *, remat: Remat = "none") -> jax.Array:
        self.cfg.check_input(x)
        cfg, act = self.cfg, ops.ACTIVATIONS[self.cfg.activation]
        h = x.reshape(x.shape[0], cfg.image_size, cfg.image_size, cfg.channels)
        h = ops.max_pool(act(ops.conv(self.conv1, h)), cfg.pool_window, cfg.pool_stride)
        h = ops.max_pool(act(ops.conv(self.conv2, h)), cfg.pool_window, cfg.pool_stride)
        h = act(ops.dense(self.in_proj, h.reshape(h.shape[0], -1)))
        if cfg.num_layers:  # no stack, no scan: a remat policy has nothing to act on
            h = scan_layers(*self.stack(), h, remat)
        return checkpoint_name(ops.head(self.head, h), names.LOGITS)
