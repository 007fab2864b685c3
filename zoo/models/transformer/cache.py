"""What the transformer's decode cache needs to know: multi-head attention (the cache holds
``num_heads`` key/value heads) over a learned position table of ``max_len`` rows. The model
decodes through its own modules (``nnx.py``, ``eqx.py``)."""

from __future__ import annotations

from zoo.models.decode import DecodeCache


class TransformerCache(DecodeCache):
    limit_name = "max_len"  # the learned position table's rows

    def check(self, cfg) -> None:
        super().check(cfg)
        if cfg.takes_features:
            raise ValueError("a transformer over feature vectors (d_in > 0) cannot generate tokens")


CACHE = TransformerCache()
