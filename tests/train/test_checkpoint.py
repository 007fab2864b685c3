"""``zoo.train.checkpoint``: a folder with no checkpoint names both ways to make one."""

from __future__ import annotations

import pytest

from zoo.errors import ZooError
from zoo.train.checkpoint import resolve_step


def test_a_folder_without_checkpoints_names_zoo_train_and_zoo_import(tmp_path):
    with pytest.raises(ZooError) as refused:
        resolve_step(tmp_path)
    said = str(refused.value)
    assert "`zoo train --out DIR`" in said and "`zoo import SRC --out DIR`" in said
    assert "\n" not in said
