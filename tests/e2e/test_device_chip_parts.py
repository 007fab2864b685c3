"""benchmarks/device/chip_parts.sh, the chip's measurements in parts of one device call each: the
parts its header documents, its usage line lists and its ``case`` runs are the same, and every
part the docs and results name is one of them. (Each part's scripts run at --small in the other
tests/e2e/test_device_*.py files; ``SMALL=1`` runs a part at that size.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "device" / "chip_parts.sh"


def test_the_parts_documented_listed_and_run_are_the_same():
    text = SCRIPT.read_text()
    documented = re.findall(r"^#\s+bash benchmarks/device/tpu.sh -- bash \S+chip_parts.sh (\S+)", text, re.M)
    run = re.findall(r"^([a-z][\w-]*)\)$", text, re.M)
    done = subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    listed = done.stderr.strip().removeprefix("usage: chip_parts.sh ").split("|")
    assert documented == run == listed and len(run) == 8, (documented, run, listed)


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


@pytest.mark.slow
def test_the_dp_acceptance_parts_run_every_row_at_a_tiny_size(tmp_path):
    """Issue 65's prepared calls (two: the B 8 tables, then the many-microbatch rows), ``SMALL=1``
    on this CPU: every step exits 0, and each table has the rows the acceptance reads (the
    ghost row naming the method that ran)."""
    env = {**os.environ, "SMALL": "1", "OUT": str(tmp_path), "PY": sys.executable}
    # The children inherit the suite's XLA flags, level-0 compiles included (tests/conftest.py):
    # at a tiny size a row is all compile, and SMALL times the noise in 3 rounds of 2 calls
    # (at level 0 philox's 30 rounds of 20 took 20 s of the step's 25 under load).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    out = ""
    for part in ("dp-acceptance", "dp-acceptance-batches"):
        done = subprocess.run(
            ["bash", str(SCRIPT), part], env=env, capture_output=True, text=True, timeout=900
        )
        out += done.stdout
    exits = re.findall(r"^== (\w+): exit (\d+)", out, re.M)
    assert [name for name, _ in exits] == ["dp_1024x8", "dp_256x8", "noise_normals", "dp_logical", "dp_lora"]
    assert all(code == "0" for _, code in exits), out[-3000:]
    tables = {}
    for name, methods in ROWS.items():
        (table,) = tables[name] = [
            json.loads(line)
            for line in (tmp_path / f"{name}.log").read_text().splitlines()
            if line[:1] == "{"
        ]
        assert [row["method"] for row in table["rows"]] == ["non-private", *methods], (name, table["rows"])
        assert all(row["step_ms"] > 0 for row in table["rows"]), table["rows"]
        ran = {row["method"]: row.get("ran") for row in table["rows"] if row["method"] in GHOSTS}
        expected = {"ghost backward": "second backward", "ghost layer-wise": "layer-wise taps"}
        assert all(ran[m] == expected.get(m, ran[m]) for m in ran), ran
        assert ran.get("ghost", "book-keeping") in ("book-keeping", "second backward"), ran
    assert "philox4x32" in (tmp_path / "noise_normals.log").read_text()
    # dp_lora.py's ghost row on adapters (this run is the script's one at --small): a frozen
    # base, and tokens/s read from each row's ms/step at the part's SMALL batch of 16
    (lora,) = tables["dp_lora"]
    assert lora["frozen_params"] > lora["trainable_params"] > 0
    for row in lora["rows"]:
        assert row["tokens_per_s"] == pytest.approx(16 * lora["seq"] / (row["step_ms"] / 1e3), rel=0.01)


GHOSTS = ["ghost", "ghost backward", "ghost layer-wise"]
ROWS = {  # each step of the parts: the methods of its table after the non-private row
    "dp_1024x8": [*GHOSTS, "jax_privacy clipped_grad"],
    "dp_256x8": ["ghost", "ghost layer-wise", "jax_privacy clipped_grad"],
    "dp_logical": ["ghost"],
    "dp_lora": ["ghost"],
}
