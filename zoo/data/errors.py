"""The dataset layer's error type."""

from __future__ import annotations

from zoo.errors import ZooError


class DatasetError(ZooError):
    """A dataset could not be loaded or used: bad spec, missing file or column, Hub unreachable, ..."""


class DataDependentWarning(UserWarning):
    """A notice whose text, or whether it is given at all, depends on the records (counts,
    labels present). A DP run does not release it (``zoo.train.run.build_run``): under DP
    nothing printed may depend on one record except through the mechanism."""
