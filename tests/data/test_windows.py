"""zoo.data.windows: an LM's records cut per segment (one per user) are the windows a plain loop
over each segment finds, in order; none crosses a segment's bound, and each has its segment's
owner."""

from __future__ import annotations

import numpy as np
import pytest

from zoo.data.windows import check_bounds, window_counts, window_owners, window_starts


def reference_windows(bounds: list[int], owners: list[int], seq_len: int) -> list[tuple[int, int]]:
    """``(start, owner)`` of every window: a loop over each segment, at stride ``seq_len``,
    keeping the windows of ``seq_len + 1`` tokens that end inside it."""
    found = []
    for segment, owner in enumerate(owners):
        start = bounds[segment]
        while start + seq_len + 1 <= bounds[segment + 1]:
            found.append((start, owner))
            start += seq_len
    return found


@pytest.mark.parametrize("seq_len", [1, 3, 8])
def test_the_windows_are_those_a_loop_over_each_segment_finds(seq_len):
    rng = np.random.default_rng(seq_len)
    lengths = rng.integers(0, 40, 30)  # some shorter than a window, some empty
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    owners = rng.permutation(30).astype(np.int32)
    expected = reference_windows(bounds.tolist(), owners.tolist(), seq_len)
    total = int(window_counts(bounds, seq_len).sum())
    assert total == len(expected) > 0
    starts = window_starts(bounds, seq_len, np.arange(total))
    assert (
        list(zip(starts.tolist(), window_owners(bounds, owners, seq_len).tolist(), strict=True)) == expected
    )
    picked = rng.choice(total, 7, replace=False)  # by index, in any order
    assert starts[picked].tolist() == window_starts(bounds, seq_len, picked).tolist()


def test_no_window_crosses_a_bound():
    """A stream of segments of 10 tokens, seq_len 3: a window of 4 tokens fits 3 times in each
    (starts 0, 3, 6 of the segment), never at 9."""
    bounds = np.arange(0, 51, 10)
    starts = window_starts(bounds, 3, np.arange(int(window_counts(bounds, 3).sum())))
    assert starts.tolist() == [s + o for s in range(0, 50, 10) for o in (0, 3, 6)]
    segment = np.searchsorted(bounds, starts, side="right") - 1
    assert (starts + 4 <= bounds[segment + 1]).all()


def test_malformed_bounds_are_named():
    assert check_bounds(np.array([0, 4, 9]), 9) is None
    assert "from 0 to the 9" in check_bounds(np.array([1, 9]), 9)
    assert "from 0 to the 9" in check_bounds(np.array([0, 8]), 9)
    assert "not decrease" in check_bounds(np.array([0, 5, 3, 9]), 9)
