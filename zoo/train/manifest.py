"""A checkpoint step's manifest: which saved steps a run has, and whether each is intact.

``zoo_manifest.json`` is a step's last file (:mod:`zoo.train.checkpoint` writes it after orbax
renames the step into place): the size and sha256 of every other file of the step. A step is
*intact* when its manifest exists and every file matches it. This module reads and writes
manifests without orbax, so a command that only looks at runs (``zoo runs``) does not import
it; ``hashes=False`` checks the sizes and skips the checksums, a cheap look at a 20 GB step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zoo.data.tokens.store import file_sha256
from zoo.train.runlog import atomic_write

CHECKPOINT_DIR = "checkpoints"
DAMAGED_DIR = "damaged-checkpoints"
MANIFEST = "zoo_manifest.json"
MANIFEST_FORMAT = "zoo.checkpoint_manifest"


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir).absolute() / CHECKPOINT_DIR / str(step)


sha256 = file_sha256  # the token store's: one hash of a file, read in blocks


def digests(where: Path) -> dict[str, list]:
    """``{relative path: [size, sha256]}`` for every file of a step but the manifest."""
    out = {}
    for path in sorted(where.rglob("*")):
        if path.is_file() and path.name != MANIFEST and not path.name.startswith(MANIFEST):
            out[path.relative_to(where).as_posix()] = [path.stat().st_size, sha256(path)]
    return out


def write_manifest(where: Path) -> None:
    body = json.dumps({"format": MANIFEST_FORMAT, "version": 1, "files": digests(where)}, indent=1)
    atomic_write(where / MANIFEST, body)


def step_problem(run_dir: Path, step: int, *, hashes: bool = True) -> str | None:
    """What is wrong with a saved step, or None when it is intact (``hashes=False``: when its
    files are there at their sizes, checksums unread)."""
    where = step_dir(run_dir, step)
    try:
        doc = json.loads((where / MANIFEST).read_text())
    except FileNotFoundError:
        return f"it has no {MANIFEST} (its write did not finish)"
    except (OSError, ValueError):
        doc = None
    files = doc.get("files") if isinstance(doc, dict) and doc.get("format") == MANIFEST_FORMAT else None
    if not isinstance(files, dict) or not all(_is_entry(rel, entry) for rel, entry in files.items()):
        return f"its {MANIFEST} is unreadable"
    try:
        for rel, (size, sha) in files.items():
            path = where / rel
            if not path.is_file():
                return f"{rel} is missing"
            if path.stat().st_size != size:
                return f"{rel} has {path.stat().st_size} bytes, its manifest says {size}"
            if hashes and sha256(path) != sha:
                return f"{rel} does not match its checksum"
    except OSError as error:  # removed or unreadable while we looked
        return f"it could not be read ({error.strerror or error})"
    return None


def _is_entry(rel: object, entry: object) -> bool:
    parts = Path(rel).parts if isinstance(rel, str) else ("..",)
    return (
        not Path(rel).is_absolute()
        and ".." not in parts
        and isinstance(entry, list)
        and len(entry) == 2
        and isinstance(entry[0], int)
        and isinstance(entry[1], str)
    )


def saved_steps(run_dir: Path) -> list[int]:
    """Every step directory under ``run_dir/checkpoints``, intact or not, oldest first."""
    root = Path(run_dir) / CHECKPOINT_DIR
    if not os.path.isdir(root):  # False, not an error, for a name too long or under a file
        return []
    return sorted(int(p.name) for p in root.iterdir() if p.is_dir() and p.name.isdigit())


def latest_step(run_dir: Path, *, hashes: bool = True) -> int | None:
    """The newest intact step (:func:`step_problem` with ``hashes``), or None. Quiet: it neither
    warns nor raises."""
    steps = saved_steps(run_dir)
    return next((s for s in reversed(steps) if step_problem(run_dir, s, hashes=hashes) is None), None)
