"""Measured choices kept between runs: one JSON file per kind of choice under ``$ZOO_CACHE_DIR``.

Some choices zoo makes by measuring them on the device it runs on, once: the norm form of a
ghost-clipped op per shape (``ghost-forms.json``, :mod:`zoo.dp.ghost.forms`) and the remat policy
and placement ``--remat auto`` picks (``remat-auto.json``, :mod:`zoo.train.auto_remat`). Each
file maps a key (:func:`digest` of what the choice depends on) to an entry, and
:class:`ChoiceCache` is the one way to read and write such a file:

* the folder is ``$ZOO_CACHE_DIR``, default ``~/.cache/zoo`` (:func:`cache_dir`);
* a file that cannot be read (missing, corrupt, cut short, not a JSON object) reads as empty, and
  an entry its caller does not accept as missing: a cache costs speed, never a run;
* a write merges its entry into the file as it is on disk at that moment, under a lock, so two
  runs measuring at once keep both their entries;
* the file is replaced whole (a temporary file renamed over it): a reader, or a writer killed at
  any point, sees the old file or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

try:  # POSIX; where there is no fcntl, two writers at once may lose one entry (never a file)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None

ENV = "ZOO_CACHE_DIR"


def cache_dir() -> Path:
    """Where zoo keeps what it measured or fetched: ``$ZOO_CACHE_DIR``, else ``~/.cache/zoo``."""
    return Path(os.environ.get(ENV) or Path.home() / ".cache" / "zoo")


def digest(parts: dict) -> str:
    """A short key for ``parts`` (JSON values): equal parts, equal keys, whatever their order."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


@contextlib.contextmanager
def locked(path: Path, waiting: str | None = None):
    """Hold an exclusive lock on ``path``'s lock file (beside it, ``NAME.lock``) for the block:
    a second holder waits, and with ``waiting`` says so first, on stderr (an import of minutes
    must not look hung). The operating system drops it when its process dies. Also taken
    around a Hugging Face import's write (:func:`zoo.train.hf.import_cached`)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                print(waiting, file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _replace(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file of its own beside ``path``, then rename it over ``path``."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@dataclass(frozen=True)
class ChoiceCache:
    """One kind of measured choice: the JSON object in ``$ZOO_CACHE_DIR/<file>``."""

    file: str

    @property
    def path(self) -> Path:
        return cache_dir() / self.file

    def read(self) -> dict:
        """Every entry, or ``{}`` when the file is missing or unreadable (a deeply nested file
        raises RecursionError while it is parsed: that reads as empty too)."""
        try:
            doc = json.loads(self.path.read_text())
        except (OSError, ValueError, RecursionError):
            return {}
        return doc if isinstance(doc, dict) else {}

    def get(self, key: str, accept: Callable[[object], bool] = lambda entry: True):
        """The entry at ``key`` if there is one and ``accept(entry)`` says it is whole, else None."""
        entry = self.read().get(key)
        try:
            return entry if entry is not None and accept(entry) else None
        except (AttributeError, KeyError, TypeError, ValueError):  # a hand-edited or older entry
            return None

    def put(self, key: str, entry) -> None:
        """Add (or replace) ``key``'s entry, keeping every other entry on disk now."""
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        with locked(path):
            doc = self.read()
            doc[key] = entry
            _replace(path, json.dumps(doc, indent=1) + "\n")
