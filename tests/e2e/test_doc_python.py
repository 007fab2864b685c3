"""doc_python's reading of a block: a literal comment is a shown value, prose is not."""

from __future__ import annotations

import pytest

from tests.e2e.doc_python import run_block


def test_a_shown_value_that_holds_passes_and_prose_is_left_alone():
    run_block("x = [1, 2]\nlen(x), x[0]  # 2, 1\nx  # the list\nsum(x)\n# 3\nprint(x)  # [1, 2]\n", "ok")


@pytest.mark.parametrize(
    "block",
    ["x = 40\nx + 2, 0  # 43, 0\n", "x = [1]\nx * 2\n# [1]\n"],
    ids=["same-line", "next-line"],
)
def test_a_shown_value_that_differs_fails_naming_the_line(block):
    with pytest.raises(AssertionError, match="block line 2: gives"):
        run_block(block, "planted")
