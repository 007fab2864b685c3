"""zoo.train.runlock: one run at a time in a run directory (the two-process case and a killed
run are in tests/e2e/test_run_lock.py)."""

from __future__ import annotations

import fcntl
import os

import pytest

from zoo.errors import ZooError
from zoo.train import runlock


def test_a_held_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    out = tmp_path / "run"
    with runlock.hold(out):
        assert (out / runlock.LOCK).read_text().strip() == str(os.getpid())
        with pytest.raises(ZooError, match=rf"in use by another zoo run \(process {os.getpid()}\)"):
            with runlock.hold(out):  # another open file description: flock conflicts
                pass
    with runlock.hold(out):  # released: taken again
        pass


def test_a_lock_file_nobody_holds_blocks_nothing_and_goes_with_the_run(tmp_path):
    """A killed run leaves its lock file behind, with its pid, but no lock."""
    out = tmp_path / "run"
    out.mkdir()
    (out / runlock.LOCK).write_text("999999\n")
    with runlock.hold(out):
        assert (out / runlock.LOCK).read_text().strip() == str(os.getpid())
    assert not (out / runlock.LOCK).exists() and out.is_dir()


def test_a_refused_run_leaves_no_folder_the_lock_made(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(ValueError, match="a bad setting"):
        with runlock.hold(out):
            assert out.is_dir()
            raise ValueError("a bad setting")
    assert not (tmp_path / "new").exists()


def test_a_lock_whose_file_was_removed_meanwhile_is_taken_on_the_new_file(tmp_path, monkeypatch):
    """The holder removes the name as it ends; a process that opened the old file and then got
    its lock must not believe it holds the run: it locks the file the name now leads to."""
    out = tmp_path / "run"
    out.mkdir()
    path = out / runlock.LOCK
    flock, calls = fcntl.flock, []

    def flock_after_a_removal(fd, op):
        if not calls:  # the first try: the name is removed and made again between open and lock
            path.unlink()
            path.write_text("")
        calls.append(fd)
        return flock(fd, op)

    monkeypatch.setattr(runlock.fcntl, "flock", flock_after_a_removal)
    with runlock.hold(out):
        assert len(calls) == 2
        assert os.fstat(calls[-1]).st_ino == path.stat().st_ino


def test_an_out_that_cannot_hold_a_lock_is_left_to_the_run_dir_check(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("x")
    with runlock.hold(afile), runlock.hold(afile / "under"):
        pass  # zoo.train.resume.check_run_dir refuses both, in its own line
    assert afile.read_text() == "x"


def test_a_lock_beside_a_folder_leaves_the_folder_to_its_writer(tmp_path):
    """zoo import and export: the folder they write must be empty, so the lock is its neighbour."""
    out = tmp_path / "new" / "export"
    with runlock.hold(out, beside=True):
        assert not out.exists() and (tmp_path / "new" / f".export{runlock.LOCK}").is_file()
        with pytest.raises(ZooError, match="in use by another zoo run"):
            with runlock.hold(out, beside=True):
                pass
        out.mkdir()
    assert [p.name for p in (tmp_path / "new").iterdir()] == ["export"]


@pytest.mark.parametrize(
    "argv",
    [
        ["import", "tests/fixtures/hf/llama3-tied"],
        ["export", "runs-that-do-not-matter", "--merge"],
        ["export", "runs-that-do-not-matter", "--format", "hf"],
    ],
    ids=["import", "export", "export hf"],
)
def test_an_import_or_export_into_a_folder_in_use_is_refused_in_one_line(argv, tmp_path, capsys):
    from zoo.cli import main

    out = tmp_path / "out"
    with runlock.hold(out, beside=True):  # another import or export into the same --out
        assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "is in use by another zoo run" in err and len(err.strip().splitlines()) == 1, err
    assert list(tmp_path.iterdir()) == []
