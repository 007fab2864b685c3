"""One run at a time in a run directory: a lock held for the run's life.

Two ``zoo train`` into one ``--out`` at once raced: orbax's steps collided (one run ended in a
traceback) and the other run's ``metrics.jsonl`` was emptied under it. ``hold`` takes an
exclusive ``fcntl.flock`` on ``OUT/.zoo.lock`` before the run directory is checked, and keeps
it until the run ends; a second run (or a ``--resume``) meanwhile is refused in one line naming
the process that holds it. The operating system drops a ``flock`` when its process dies, so a
lock file left by a killed run blocks nothing: the next run takes the lock on it.

The lock file is removed when the run ends, and a folder the lock made is removed with it when
nothing else was written there (a run refused for a bad setting leaves no directory behind).
``zoo import`` and ``zoo export`` write a new folder that must be empty, so theirs is held
``beside`` it (``.NAME.zoo.lock`` in its parent): two into one ``--out`` at once left a broken
checkpoint, or one folder holding two exports' files, and said so with exit 0.
A process that opened the file just before it was removed finds, once it has the lock, that
the name no longer leads to the file it locked, and tries again on the new one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from zoo.errors import ZooError

LOCK = ".zoo.lock"


@contextlib.contextmanager
def hold(out: Path, *, beside: bool = False) -> Iterator[None]:
    """Hold ``out``'s run lock for the block; ZooError, in one line, while another process holds
    it. An ``out`` that cannot take a lock file (a file, a read-only folder, a name too long) is
    left to :func:`zoo.train.resume.check_run_dir`, which says why in its own line. ``beside``:
    the lock file is ``out``'s neighbour, and ``out`` itself is neither made nor written."""
    out = Path(os.path.abspath(out))
    folder, name = (out.parent, f".{out.name}{LOCK}") if beside else (out, LOCK)
    try:
        made = _make_folders(folder)
    except OSError:
        yield
        return
    try:
        fd = _acquire(folder / name, out)
    except BaseException:
        _remove_made(made)
        raise
    try:
        yield
    finally:
        if fd is not None:
            with contextlib.suppress(OSError):
                (folder / name).unlink()  # still ours: no other run can lock it until we close it
            os.close(fd)
        _remove_made(made)


def _make_folders(out: Path) -> list[Path]:
    """Make ``out`` and its missing parents; the folders made, outermost first."""
    missing = []
    parent = out
    while not os.path.exists(parent) and parent != parent.parent:  # False, not raised, for a long name
        missing.append(parent)
        parent = parent.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
            made.append(folder)
        except FileExistsError:  # another process made it first
            pass
        except OSError:
            _remove_made(made)
            raise
    if not out.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(out))
    return made


def _remove_made(made: list[Path]) -> None:
    """Remove the folders this lock made that are still empty, innermost first."""
    for folder in reversed(made):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _acquire(path: Path, out: Path) -> int | None:
    """The descriptor of the locked file, or None where no lock file can be made."""
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a read-only folder: check_run_dir refuses it
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(fd)
            os.close(fd)
            raise ZooError(
                f"{str(out)!r} is in use by another zoo run ({holder}); wait for it to end, or "
                "choose another --out"
            ) from None
        except OSError:  # a file system without flock: the run goes on unlocked, as before
            os.close(fd)
            return None
        if _same_file(fd, path):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            return fd
        os.close(fd)  # the run that held it removed the name: lock the new file


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except (OSError, UnicodeDecodeError):
        pid = ""
    return f"process {pid}" if pid.isdigit() else "another process"
