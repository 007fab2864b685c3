"""Issue 41, items 10-25: messages that misled or said nothing, now one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
from clikit import refused

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"

pytestmark = pytest.mark.xdist_group("hf")


def test_import_out_empty_is_refused_not_the_current_directory(tmp_path, capsys, monkeypatch):
    """Item 18: ``--out ""`` wrote ``checkpoints/`` into the current directory."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["import", str(FIXTURES / "gpt2"), "--out", ""], "--out is empty")
    assert list(tmp_path.iterdir()) == []
