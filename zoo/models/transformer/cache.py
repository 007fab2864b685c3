"""The transformer's decode cache: learned positions read at each token's absolute position,
multi-head attention (the cache holds ``num_heads`` key/value heads). Same ops, same order as
the block's forward (``nnx.py``, ``eqx.py``); ``zoo.models.decode`` runs it over the cache."""

from __future__ import annotations

from zoo.models import ops
from zoo.models.decode import DecodeCache


class TransformerCache(DecodeCache):
    limit_name = "max_len"  # the learned position table's rows

    def check(self, cfg) -> None:
        super().check(cfg)
        if cfg.takes_features:
            raise ValueError("a transformer over feature vectors (d_in > 0) cannot generate tokens")

    def kv_heads(self, cfg) -> int:
        return cfg.num_heads

    def head_dim(self, cfg) -> int:
        return cfg.d_head

    def embed(self, cfg, model, tokens, positions):
        return ops.embed(model.embed, tokens) + ops.embed(model.pos, positions)

    def block(self, cfg, block, h, positions, attend):
        attn = block.attn
        x = ops.layer_norm(block.ln1, h)
        q, k, v = ops.dense(attn.q, x), ops.dense(attn.k, x), ops.dense(attn.v, x)
        h = h + ops.dense(attn.o, attend(q, k, v))
        return h + ops.token_chunks(block.mlp_branch, h, cfg.mlp_chunk), k, v

    def head(self, cfg, model, h):
        h = ops.layer_norm(model.ln_f, h)
        return ops.unembed(model.embed, h) if model.head is None else ops.head(model.head, h)


CACHE = TransformerCache()
