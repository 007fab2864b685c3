"""What Llama's decode cache needs to know: grouped-query heads (the cache holds
``num_kv_heads`` key/value heads, not ``num_heads``), and rotary positions made for ``max_len``.
The model decodes through its own modules (``nnx.py``, ``eqx.py``)."""

from __future__ import annotations

from zoo.models.decode import DecodeCache


class LlamaCache(DecodeCache):
    limit_name = "max_len (max_position_embeddings)"  # rotary: the positions it was made for

    def kv_heads(self, cfg) -> int:
        return cfg.num_kv_heads


CACHE = LlamaCache()
