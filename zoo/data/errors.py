"""The dataset layer's error type."""

from __future__ import annotations

from zoo.errors import ZooError


class DatasetError(ZooError):
    """A dataset could not be loaded or used: bad spec, missing file or column, Hub unreachable, ..."""
