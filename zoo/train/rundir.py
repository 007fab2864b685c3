"""A run directory read back, finished or not: its logged records, curves and facts
(``zoo plot``, ``zoo runs``). Reads ``metrics.jsonl``, ``recipe.json`` and ``summary.json``."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from zoo.train import runlog

ELAPSED = "elapsed_sec"  # zoo.train.tracking writes it: seconds of the run, resumed segments summed


def new_run_dir(stem: str, parent: Path = Path("runs"), *, only_process: bool = True) -> Path:
    """The directory a run makes when no ``--out`` is given: ``parent/stem-YYYYMMDD-HHMMSS``, with
    ``-2``, ``-3``... added when a run started in the same second already took that name.

    With several processes (``only_process=False``) the name is the clock's alone: each process
    works it out for itself, and one that saw another's directory would pick a different one."""
    first = parent / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    path, n = first, 1
    while only_process and path.exists():
        n += 1
        path = first.with_name(f"{first.name}-{n}")
    return path


@dataclass(frozen=True)
class RunDir:
    path: Path
    records: tuple[dict, ...]
    recipe: dict
    summary: dict | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def steps_done(self) -> int:
        return max((int(r["step"]) for r in self.records), default=0)

    @property
    def planned_steps(self) -> int | None:
        return self.recipe.get("train", {}).get("steps")

    @property
    def is_dp(self) -> bool:
        return bool(self.recipe.get("dp", {}).get("enabled"))

    def series(self, key: str, x: str = "step") -> tuple[list[float], list[float]]:
        """``(xs, ys)`` of ``key``, one point per step (the last record of a step wins), by step."""
        points: dict[int, tuple[float, float]] = {}
        for record in self.records:
            if key in record and x in record:
                points[int(record["step"])] = (float(record[x]), float(record[key]))
        ordered = [points[step] for step in sorted(points)]
        return [p[0] for p in ordered], [p[1] for p in ordered]

    def last(self, key: str) -> float | None:
        _, ys = self.series(key)
        return ys[-1] if ys else None


def read_records(path: Path) -> list[dict]:
    """The records of ``path/metrics.jsonl``. The last line cut short by a kill is skipped as
    it is; any other line that is not a step's record (a damaged or hand-edited file) is skipped
    with one warning naming the file and the lines, so a gap in a table or plot is said."""
    file = Path(path) / runlog.METRICS
    lines = file.read_text().splitlines() if file.exists() else []
    records, bad = [], []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict) and "step" in record:
            records.append(record)
        elif line.strip() and number < len(lines):
            bad.append(number)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        warnings.warn(
            f"{file}: skipped {len(bad)} line(s) that are not a step's record (line {shown})", stacklevel=2
        )
    return records


def open_run(path: str | Path) -> RunDir:
    """The run at ``path`` as it stands, even one that has logged no step yet (a run in
    progress whose ``metrics.jsonl`` is still empty); ValueError where there is no folder."""
    path = Path(path)
    if not path.is_dir():
        there = "is a file" if path.exists() else "does not exist"
        raise ValueError(f"run directory {str(path)!r} {there}")
    try:
        recipe = json.loads((path / runlog.RECIPE).read_text())
    except (OSError, ValueError):
        recipe = {}
    records = tuple(read_records(path))
    return RunDir(path, records, recipe if isinstance(recipe, dict) else {}, runlog.read_summary(path))


def load_run(path: str | Path) -> RunDir:
    """The run at ``path`` with at least one logged step; ValueError, in one line, where there
    is no run to read."""
    run = open_run(path)
    if not run.records:
        path = run.path
        what = "an empty metrics.jsonl" if (path / runlog.METRICS).exists() else "no metrics.jsonl"
        raise ValueError(f"run directory {str(path)!r} has {what}: no step of a zoo run is logged there yet")
    return run


def find_runs(root: str | Path) -> list[Path]:
    """Every run directory at or under ``root`` (a folder with ``metrics.jsonl``), sorted."""
    root = Path(root)
    if not root.is_dir():
        there = "is a file" if root.exists() else "does not exist"
        raise ValueError(f"{str(root)!r} {there}: give a folder of runs, e.g. runs/")
    return sorted(p.parent for p in root.rglob(runlog.METRICS))
