"""Image-classifier CNN in Flax NNX: two conv + pool stages, in_proj, L scanned dense blocks, head."""

from __future__ import annotations

import jax
from flax import nnx
from jax.ad_checkpoint import checkpoint_name

from zoo import names
from zoo.models import ops
from zoo.models.cnn.config import CNNConfig
from zoo.models.mlp.nnx import Block  # the dense stack after the convs is the MLP's
from zoo.scan import Remat, scan_layers


def _conv(cfg: CNNConfig, stage: str, d_in: int, rngs: nnx.Rngs) -> nnx.Conv:
    kernel, stride, pad = (getattr(cfg, f"{stage}_{k}") for k in ("kernel", "stride", "padding"))
    features = getattr(cfg, f"{stage}_features")
    return nnx.Conv(
        d_in,
        features,
        (kernel, kernel),
        strides=(stride, stride),
        padding=((pad, pad), (pad, pad)),
        rngs=rngs,
    )


class CNN(nnx.Module):
    """x [B, H*W*C] -> logits [B, num_classes]. Blocks (if any) are stacked on a leading L axis."""

    def __init__(self, cfg: CNNConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.conv1 = _conv(cfg, "conv1", cfg.channels, rngs)
        self.conv2 = _conv(cfg, "conv2", cfg.conv1_features, rngs)
        self.in_proj = nnx.Linear(cfg.flat_features, cfg.d_hidden, rngs=rngs)
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
        cfg, act = self.cfg, ops.ACTIVATIONS[self.cfg.activation]
        h = x.reshape(x.shape[0], cfg.image_size, cfg.image_size, cfg.channels)
        h = ops.max_pool(act(ops.conv(self.conv1, h)), cfg.pool_window, cfg.pool_stride)
        h = ops.max_pool(act(ops.conv(self.conv2, h)), cfg.pool_window, cfg.pool_stride)
        h = act(ops.dense(self.in_proj, h.reshape(h.shape[0], -1)))
        if cfg.num_layers:  # no stack, no scan: a remat policy has nothing to act on
            h = scan_layers(*self.stack(), h, remat)
        return checkpoint_name(ops.head(self.head, h), names.LOGITS)
