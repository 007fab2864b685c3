"""Token data on disk: a store written once (``zoo tokenize``) and read by index.

See :mod:`zoo.data.tokens.store` for the format, :mod:`zoo.data.tokens.tokenize` for writing
one from a text source, and ``docs/data.md``.
"""

from zoo.data.tokens.store import TokenSource, TokenStore, dtype_for, open_bin, open_store

__all__ = ["TokenSource", "TokenStore", "dtype_for", "open_bin", "open_store"]
