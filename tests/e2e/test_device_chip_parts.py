"""benchmarks/device/chip_parts.sh, the chip's measurements in parts of one device call each: the
parts its header documents, its usage line lists and its ``case`` runs are the same, and every
part the docs and results name is one of them. (Each part's scripts run at --small in the other
tests/e2e/test_device_*.py files; ``SMALL=1`` runs a part at that size.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device" / "chip_parts.sh"


def test_the_parts_documented_listed_and_run_are_the_same():
    text = SCRIPT.read_text()
    documented = re.findall(r"^#\s+bash benchmarks/device/tpu.sh -- bash \S+chip_parts.sh (\S+)", text, re.M)
    run = re.findall(r"^([a-z][\w-]*)\)$", text, re.M)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    listed = done.stderr.strip().removeprefix("usage: chip_parts.sh ").split("|")
    assert documented == run == listed and len(run) == 6, (documented, run, listed)


def test_every_part_the_docs_name_exists():
    """...and no page runs the script by its old name (``open_rows.sh``, after two issues)."""
    parts = set(re.findall(r"^([a-z][\w-]*)\)$", SCRIPT.read_text(), re.M))
    pages = [*REPO.glob("docs/*.md"), *REPO.glob("benchmarks/**/*.md"), REPO / "README.md"]
    named, stale = {}, []
    for path in pages:
        text = path.read_text()
        for part in re.findall(r"chip_parts\.sh ([a-z][\w-]*)", text):
            named.setdefault(part, []).append(path.relative_to(REPO).as_posix())
        stale += [path.relative_to(REPO).as_posix()] if re.search(r"open_rows\.sh \w", text) else []
    assert named and set(named) <= parts, {p: where for p, where in named.items() if p not in parts}
    assert stale == []
