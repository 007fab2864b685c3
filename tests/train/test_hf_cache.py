"""``--init-from hf:SRC``'s import cache (``zoo.train.hf.import_cached``): two runs importing
one source at once, and an import that fails halfway through its write."""

from __future__ import annotations

import shutil
import threading
import time
import warnings
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.tiny import HF_FIXTURES
from zoo.train import hf, manifest
from zoo.train.checkpoint import load_checkpoint

pytestmark = pytest.mark.xdist_group("hf")

SRC = str(HF_FIXTURES / "llama-kv1")
TIMEOUT = 120  # seconds any one wait may take before the test gives up


def entries(cache: Path) -> list[str]:
    """What the cache holds besides its lock files (hidden folders: imports being written)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.endswith(".lock")) if cache.exists() else []


def assert_whole(out: Path, reference: Path) -> None:
    """``out`` is an intact import (every file at its manifest's checksum) equal to ``reference``."""
    assert manifest.latest_step(out) == 0, out
    got, want = load_checkpoint(out).params, load_checkpoint(reference).params
    jax.tree.map(np.testing.assert_array_equal, got, want)


@pytest.mark.filterwarnings("ignore:hf.*reusing its import:UserWarning")  # the second's line
def test_two_imports_at_once_end_with_one_whole_entry_that_both_use(tmp_path, monkeypatch, capsys):
    """The first import is held halfway through its write while a second one starts. Checked
    and written unlocked, the second saw no intact step, removed the first's folder while it
    was being written (the first failed: FileNotFoundError) and imported into it. Now the
    second waits, saying so in one line (it waited silently, as if hung), nothing half-written
    is ever at the entry's path, and both get one import."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZOO_HF_CACHE", str(cache))
    real, writes = hf.import_checkpoint, []
    held, release = threading.Event(), threading.Event()

    def held_halfway(src, out, **kw):
        writes.append(Path(out))
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "half-written").write_text("")  # what a reader must never take for an import
        if len(writes) == 1:
            held.set()
            release.wait(TIMEOUT)
        (Path(out) / "half-written").unlink()
        return real(src, out, **kw)

    monkeypatch.setattr(hf, "import_checkpoint", held_halfway)
    results, errors = {}, {}

    def run(name: str) -> None:
        try:
            results[name] = hf.import_cached(SRC)
        except BaseException as error:  # noqa: BLE001 - reported below, with the thread's name
            errors[name] = error

    first = threading.Thread(target=run, args=("first",), daemon=True)
    first.start()
    assert held.wait(TIMEOUT), "the first import never started its write"
    second = threading.Thread(target=run, args=("second",), daemon=True)
    second.start()
    time.sleep(1.0)  # the second import waits for the first, or races it
    during = [name for name in entries(cache) if not name.startswith(".")]
    release.set()
    for thread in (first, second):
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "an import did not end"
    assert errors == {}, errors
    waits = [line for line in capsys.readouterr().err.splitlines() if "another run is importing it" in line]
    assert len(waits) == 1 and f"hf:{SRC}:" in waits[0], waits
    assert during == [], f"an entry was visible while the first import was half-written: {during}"
    assert results["first"] == results["second"]
    assert len(writes) == 1, writes  # the second used the first's import
    out = results["first"]
    assert entries(cache) == [out.name]
    reference = tmp_path / "reference"
    real(SRC, reference)
    assert_whole(out, reference)


def test_an_import_that_fails_halfway_leaves_no_entry_and_the_next_run_imports_again(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("ZOO_HF_CACHE", str(cache))
    real = hf.import_checkpoint

    def fails_halfway(src, out, **kw):  # the weights are written, the manifest (written last) is not
        real(src, out, **kw)
        (manifest.step_dir(Path(out), 0) / manifest.MANIFEST).unlink()
        raise RuntimeError("the disk went away halfway through the write")

    monkeypatch.setattr(hf, "import_checkpoint", fails_halfway)
    with pytest.raises(RuntimeError, match="halfway"):
        hf.import_cached(SRC)
    assert entries(cache) == []  # neither an entry nor the folder it was written in
    monkeypatch.setattr(hf, "import_checkpoint", real)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a reuse would warn: this run imports again
        out = hf.import_cached(SRC)
    reference = tmp_path / "reference"
    real(SRC, reference)
    assert_whole(out, reference)
    # A killed import leaves its hidden folder: the next import removes it.
    shutil.rmtree(out)
    killed = cache / f".{out.name}.killed"
    (killed / "checkpoints").mkdir(parents=True)
    assert hf.import_cached(SRC) == out and entries(cache) == [out.name]
    assert_whole(out, reference)
