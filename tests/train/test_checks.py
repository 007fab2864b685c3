"""Checks of a run against what it can hold (zoo.train.checks): a batch that cannot fit is
refused in one line, before anything is allocated."""

from __future__ import annotations

import pytest

from tests.e2e.clikit import refused
from zoo.errors import ZooError
from zoo.train.checks import INDEX_LIMIT, require_batch_fits


def test_a_batch_past_memory_or_int32_indices_is_refused_naming_the_setting():
    require_batch_fits(1000, 256, "train.batch_size", memory=256_000)  # exactly fits
    with pytest.raises(ZooError, match=r"train.batch_size makes a batch of 1,001 rows"):
        require_batch_fits(1001, 256, "train.batch_size", memory=256_000)
    with pytest.raises(ZooError, match="2,147,483,647 rows"):
        require_batch_fits(INDEX_LIMIT + 1, 1, "train.batch_size", memory=2**62)


def test_a_batch_size_of_a_trillion_is_refused_in_one_line(capsys, tmp_path):
    """Issue 60, item 9: it ended in NumPy's _ArrayMemoryError (7.28 TiB) at the first batch."""
    argv = ["train", "digits-mlp", "--steps", "1", "--batch-size", str(10**12), "--out", str(tmp_path / "r")]
    refused(capsys, argv, "train.batch_size", "1,000,000,000,000 rows")


def test_an_oversized_microbatch_under_dp_is_blamed_on_train_microbatch_size(capsys, tmp_path):
    """Issue 67, item 6: the padded batch a trillion-row microbatch makes was blamed on
    dp.expected_batch_size (720 in the recipe)."""
    argv = ["train", "digits-mlp-dp", "--steps", "1", "--set", f"train.microbatch_size={10**12}"]
    line = refused(
        capsys, [*argv, "--out", str(tmp_path / "r")], "train.microbatch_size", "1,000,000,000,000 rows"
    )
    assert "dp.expected_batch_size" not in line


def test_a_trillion_records_per_user_is_refused_in_one_line(capsys, tmp_path):
    """Issue 60, item 9: ULS's [users, k] slots of k = 10**12 ended in _ArrayMemoryError."""
    path = tmp_path / "users.csv"
    path.write_text("user,a,b,label\n" + "".join(f"p{i % 20},{i % 7},{i % 3},{i % 3}\n" for i in range(60)))
    sets = ["data.user_column=user", "dp.unit=user", "dp.clipping=vmap", "data.classes=[0, 1, 2]"]
    sets += ["dp.expected_batch_size=4", "dp.delta=1e-3", f"dp.records_per_user={10**12}"]
    argv = [
        "train",
        "digits-mlp-dp",
        "--steps",
        "1",
        "--dataset",
        f"csv:{path}",
        "--out",
        str(tmp_path / "r"),
    ]
    refused(capsys, [*argv, *(a for s in sets for a in ("--set", s))], "dp.records_per_user", "rows")
