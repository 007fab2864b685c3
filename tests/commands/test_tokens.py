"""``zoo.commands.tokens``: what the progress bar shows of how much was read."""

from __future__ import annotations

from zoo.commands.tokens import _read


def test_a_small_file_reads_in_kilobytes_not_zero_megabytes():
    assert _read("bytes", 45_809, 45_809) == "45.8/45.8 kB"
    assert _read("bytes", 2_500_000, 5_000_000) == "2.5/5.0 MB"
    assert _read("rows", 3, None) == "3 rows"
