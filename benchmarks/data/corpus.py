"""A generated text corpus for the data benchmarks (not committed): ``round(mb)`` files of about
``mb / round(mb)`` MB (at least one), each a document of lines drawn at random, with a fixed
seed, from CPython's bundled pydoc topics (English prose and Python code, about 500 KB of
distinct text). What it was made with is recorded in the hidden ``.corpus.json``, which
``text:DIR`` and ``zoo tokenize`` leave out: the corpus is its ``.txt`` files and nothing else.

    .venv/bin/python benchmarks/data/corpus.py /tmp/zoo-corpus-200mb --mb 200

Imported by the other scripts of this folder (``corpus.make(path, mb)``); a folder that
already holds a corpus of that size is kept.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

FILE_MB = 1
DONE = ".corpus.json"  # hidden: not a document of the corpus


def _lines() -> np.ndarray:
    from pydoc_data.topics import topics

    lines = [line for key in sorted(topics) for line in topics[key].splitlines() if line.strip()]
    return np.asarray(lines, dtype=object)


def make(root: str | Path, mb: float, seed: int = 0) -> list[Path]:
    """The files of a corpus of ``mb`` MB (1e6 bytes) under ``root``, written unless there."""
    root = Path(root)
    done = root / DONE
    if done.exists() and json.loads(done.read_text()) == {"mb": mb, "seed": seed}:
        return sorted(root.glob("*.txt"))
    root.mkdir(parents=True, exist_ok=True)
    lines, rng = _lines(), np.random.default_rng(seed)
    mean = float(np.mean([len(s) + 1 for s in lines]))
    target, written, paths = int(mb * 1e6), 0, []
    files = max(round(mb / FILE_MB), 1)
    for i in range(files):  # each file a share of what is left: no sliver of a file at the end
        picks = rng.integers(0, len(lines), max(int((target - written) / (files - i) / mean), 1))
        path = root / f"{i:05d}.txt"
        path.write_text("\n".join(lines[picks]) + "\n", encoding="utf-8")
        written += path.stat().st_size
        paths.append(path)
    done.write_text(json.dumps({"mb": mb, "seed": seed}))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root")
    parser.add_argument("--mb", type=float, required=True)
    args = parser.parse_args()
    paths = make(args.root, args.mb)
    print(f"{len(paths)} files, {sum(p.stat().st_size for p in paths) / 1e6:,.1f} MB in {args.root}")


if __name__ == "__main__":
    main()
