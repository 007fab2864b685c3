"""A language model's training records when its stream is cut into segments (one per user,
``data.user_column``): the windows of each segment, never one across two.

A segment is a span ``tokens[bounds[s]:bounds[s + 1]]`` of the train stream. Its records are
the non-overlapping windows of ``seq_len + 1`` tokens at stride ``seq_len`` that fit in it, as
for a whole stream; the tail of a segment shorter than a window is left out, and a segment
shorter than one window gives no record. Records are numbered segment by segment, in order.
Everything here reads the bounds (``S + 1`` numbers), never a token, and a window's start is
found by bisection, so nothing grows with the length of the stream.
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_bounds", "window_counts", "window_owners", "window_starts"]


def check_bounds(bounds: np.ndarray, tokens: int) -> str | None:
    """Why ``bounds`` (int64 ``[S + 1]``) is not a cut of a stream of ``tokens`` ids into
    segments, or None: it starts at 0, ends at ``tokens`` and never goes back."""
    bounds = np.asarray(bounds)
    if bounds.ndim != 1 or bounds.size < 2 or bounds[0] != 0 or bounds[-1] != tokens:
        return f"segment bounds must run from 0 to the {tokens} training tokens"
    if (np.diff(bounds) < 0).any():
        return "segment bounds must not decrease"
    return None


def window_counts(bounds: np.ndarray, seq_len: int) -> np.ndarray:
    """int64 ``[S]``: the windows of each segment (0 for one shorter than ``seq_len + 1``)."""
    lengths = np.diff(np.asarray(bounds, np.int64))
    return np.maximum(lengths - 1, 0) // int(seq_len)


def window_starts(bounds: np.ndarray, seq_len: int, indices: np.ndarray) -> np.ndarray:
    """int64: the first token of each record in ``indices`` (records numbered segment by
    segment, :func:`window_counts` of each)."""
    counts = window_counts(bounds, seq_len)
    ends = np.cumsum(counts)
    indices = np.asarray(indices, np.int64)
    segment = np.searchsorted(ends, indices, side="right")
    first = ends[segment] - counts[segment]
    return np.asarray(bounds, np.int64)[segment] + (indices - first) * int(seq_len)


def window_owners(bounds: np.ndarray, owners: np.ndarray, seq_len: int) -> np.ndarray:
    """``[R]``: the owner (``owners[s]``, one per segment) of each record, in record order."""
    return np.repeat(np.asarray(owners), window_counts(bounds, seq_len))
