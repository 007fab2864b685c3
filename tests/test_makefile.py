"""The Makefile's targets: each one declared does something, and ``make help`` lists them all.

A target in ``.PHONY`` without a rule answers ``make bench`` with "Nothing to be done", which
reads like success. So every declared target has a rule with a recipe, carries the ``## ``
line that ``make help`` prints, and ``make help`` prints it; the ``zoo`` commands of ``make
bench`` parse with zoo's own parser, so a renamed flag fails here, not in a reader's shell.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def phony(text: str) -> list[str]:
    return [name for line in re.findall(r"^\.PHONY:(.*)$", text, re.M) for name in line.split()]


def rules(text: str) -> dict[str, list[str]]:
    """Target -> its recipe lines (tab-indented lines right after ``target:``)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        head = re.match(r"^([a-z][\w-]*):(?!=)", line)
        if head:
            current = head.group(1)
            found.setdefault(current, [])
        elif line.startswith("\t") and current is not None:
            found[current].append(line[1:])
        elif line.strip() and not line.startswith("#"):
            current = None
    return found


def helps(text: str) -> dict[str, str]:
    return dict(re.findall(r"^([a-z][\w-]*):.*?## (.+)$", text, re.M))


def faults(text: str) -> list[str]:
    declared, recipes, said = phony(text), rules(text), helps(text)
    out = [f"{t}: declared .PHONY, no rule" for t in declared if t not in recipes]
    out += [f"{t}: a rule without a recipe" for t in declared if t in recipes and not recipes[t]]
    out += [f"{t}: no '## ' line for make help" for t in declared if t not in said]
    return out


def test_every_declared_target_has_a_recipe_and_a_help_line():
    assert not faults((ROOT / "Makefile").read_text()), faults((ROOT / "Makefile").read_text())


def test_the_check_names_each_planted_fault():
    planted = ".PHONY: run bench docs help\nhelp: ## this list\n\t@awk\nrun: ## train\n\tzoo train\ndocs: ## the docs\n"
    assert faults(planted) == [
        "bench: declared .PHONY, no rule",
        "docs: a rule without a recipe",
        "bench: no '## ' line for make help",
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_help_lists_every_target_with_its_line():
    shown = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    text = (ROOT / "Makefile").read_text()
    for target, line in helps(text).items():
        assert re.search(rf"^  make {re.escape(target)} +{re.escape(line)}$", shown, re.M), (target, shown)
    assert set(helps(text)) == set(phony(text))


def test_make_bench_runs_zoo_bench_commands_that_parse():
    from zoo.cli import build_parser

    commands = [c for c in rules((ROOT / "Makefile").read_text())["bench"] if "zoo bench" in c]
    assert len(commands) == 5, commands  # one quick run of each zoo bench
    benched = set()
    for command in commands:
        argv = shlex.split(command.replace("$(BIN)/zoo", "zoo").split("zoo ", 1)[1])
        build_parser("bench").parse_args(argv)
        benched.add(argv[1])
    assert benched == {"engine", "remat", "finetune", "dp", "scale"}


def make_variable(name: str) -> str:
    """A Makefile variable as make expands it (no recipe runs)."""
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "print-%: ; @: $(info $($*))", f"print-{name}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_every_path_make_test_oldest_names_exists():
    """A renamed test file left in OLDEST_TESTS ends `make test-oldest` in pytest's "file or
    directory not found" (tests/dp/test_pca.py, now test_pca_fit.py, did)."""
    paths = make_variable("OLDEST_TESTS").split()
    assert len(paths) > 5 and "tests/dp/test_pitfalls.py" in paths, paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def numerics_named(root: Path) -> list[str]:
    """Test files, folders, classes and functions whose name holds the word "numerics", outside
    the files that mark every test `numerics`: the main pass's ``-k "not numerics or ..."``
    (ISA_REST) matches names as well as markers, so such a test would be left out of both the
    main pass and the numerics set (ISA_SELECT, ``-m numerics``) and never run."""
    found = []
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or not (path.is_dir() or path.suffix == ".py"):
            continue  # what pytest collects from: folders and Python files
        text = path.read_text() if path.suffix == ".py" else ""
        marked = re.search(r"^pytestmark = pytest\.mark\.numerics\b", text, re.M)
        if "numerics" in path.name.lower() and path.name != "numerics.py" and not marked:
            found.append(str(path.relative_to(root)))
        if not marked:
            names = re.findall(r"^\s*(?:def|class) ((?:test|Test)\w*)", text, re.M)
            found += [f"{path.relative_to(root)}::{n}" for n in names if "numerics" in n.lower()]
    return found


def test_no_test_outside_the_marked_files_takes_the_markers_name():
    assert numerics_named(ROOT / "tests") == []


def test_the_name_check_finds_a_planted_name(tmp_path):
    (tmp_path / "test_numerics_twice.py").write_text("def test_numerics_of_a_sum():\n    pass\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "test_numerics_twice.cpython-312.pyc").write_bytes(b"\0")
    (tmp_path / "test_marked_numerics.py").write_text(
        "import pytest\npytestmark = pytest.mark.numerics\n\ndef test_numerics_ok():\n    pass\n"
    )
    assert numerics_named(tmp_path) == [
        "test_numerics_twice.py",
        "test_numerics_twice.py::test_numerics_of_a_sum",
    ]


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_test_runs_the_float_rule_set_under_both_caps_and_the_rest_once():
    """`make test`'s main pass is the complement of the numerics set, which it then runs under
    AVX2 and SSE4_2; CI (.ci/run) runs `make test` and does not repeat the set."""
    skip = make_variable("ISA_SKIP")
    assert make_variable("ISA_SELECT") == f'-m numerics -k "not ({skip})"'
    assert make_variable("ISA_REST") == f'-k "not numerics or ({skip})"'
    if shutil.which("uname") and os.uname().machine in ("x86_64", "AMD64"):
        assert make_variable("ISAS").split() == ["AVX2", "SSE4_2"]
    recipe = rules((ROOT / "Makefile").read_text())["test"]
    assert "$(ISA_REST)" in recipe[0] and "test-isa" in recipe[1], recipe
    assert "test-isa" not in (ROOT / ".ci" / "run").read_text().split("set -euo pipefail")[1]
