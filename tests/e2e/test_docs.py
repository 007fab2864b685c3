"""The README's command-line block, each doc's first example and every doc's Python block, run
as written, in order, offline.

A new user types the README's commands top to bottom, from the root of a checkout, in a shell:
``zoo`` is found only once a line above has put ``.venv/bin`` on the PATH (``source
.venv/bin/activate``; ``make run`` does not), as it is for the user. Then a doc's first example,
then the doc's Python blocks. Each line here is one test, in the order shown, in one working
directory per block that stands for the checkout's root (it links every entry there but the
outputs, so `tests/fixtures/...` and `benchmarks/...` resolve as they do for the user, and what
the commands write stays out of the checkout), so a command's inputs must come from an earlier
line or from the checkout. No command of a doc may write over a run the README made. Lines run
in-process through ``zoo.cli.main`` (``python ...`` lines as a child), with short steps:
``zoo train`` and ``zoo audit`` get ``--set train.steps=2``. Nothing else is changed. A Python
block runs as pasted, and a value it shows in a comment must be the one it gives
(``doc_python.py``).

A line is skipped only when its comment carries an explicit marker (a Python block: its first
line's): ``[network]`` (needs the Hugging Face Hub or a package index), ``[devices]`` (needs
more devices than one process has) or ``[long]`` (minutes of compute: a full benchmark, the
whole test suite). A placeholder (``<RUN>``) fails the test: a shown command names real inputs
or is marked.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.doc_python import run_block
from zoo.cli import main

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2
MARKERS = ("[network]", "[devices]", "[long]")
SHORT = {"train": ["--set", f"train.steps={STEPS}"], "audit": ["--set", f"train.steps={STEPS}"]}
OUTPUTS = {"runs", "hf", "out", "build"}  # what the commands (and the .gitignore) write at the root
ACTIVATE = ".venv/bin/activate"  # what puts `zoo` (.venv/bin/zoo, made by `make`) on a shell's PATH
# The docs train the same recipes more than once (python-docs-lm-dp in dp.md and dp-recipes.md,
# digits-mlp-dp in dp.md and ghost.md, the pretrain runs the README and two docs start from):
# the walk runs on one worker (one xdist group; each doc's lines still run in order in their
# own directory); the run's persistent compilation cache (tests/conftest.py) reads a program
# compiled for one line back for the next that builds it.
GROUP = "docs-walk"


def linked() -> list[str]:
    """The entries of the checkout's root a walk's directory links: all but hidden ones, build
    outputs and what the shown commands write."""
    return sorted(
        p.name
        for p in ROOT.iterdir()
        if not p.name.startswith(".") and p.name not in OUTPUTS and not p.name.endswith(".egg-info")
    )


@dataclass(frozen=True)
class Line:
    doc: str  # README.md or docs/NAME.md
    number: int  # 1-based line in the file
    text: str  # the command as shown (continuations joined), or a whole Python block
    python: bool = False

    @property
    def marker(self) -> str | None:
        first = self.text.splitlines()[0] if self.text else ""
        comment = first if self.python and first.startswith("#") else ""
        comment = comment if self.python else self.text.partition(" #")[2]
        return next((m for m in MARKERS if m in comment), None)


def _blocks(path: Path):
    """Every fenced block of ``path``: (language, first line number, lines)."""
    lang, start, body = None, 0, []
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body = line[3:].strip() or "text", i + 1, []
            else:
                yield lang, start, body
                lang = None
        elif lang is not None:
            body.append(line)


def _commands(doc: str, start: int, body: list[str]) -> list[Line]:
    """The command lines of a shell block, backslash continuations joined."""
    lines, pending, first = [], "", start
    for i, raw in enumerate(body, start):
        if not pending:
            first = i
        if raw.rstrip().endswith("\\"):
            pending += raw.rstrip()[:-1] + " "
            continue
        text, pending = (pending + raw).strip(), ""
        if text and not text.startswith("#"):
            lines.append(Line(doc, first, text))
    return lines


def readme_lines() -> list[Line]:
    """The block under the README's "Command line" heading, then its Python block."""
    text = (ROOT / "README.md").read_text().splitlines()
    heading = text.index("## Command line") + 1
    blocks = [b for b in _blocks(ROOT / "README.md") if b[1] > heading]
    shell = next(b for b in blocks if b[0] == "bash")
    python = next(b for b in blocks if b[0] == "python")
    return _commands("README.md", shell[1], shell[2]) + [
        Line("README.md", python[1], "\n".join(python[2]), python=True)
    ]


def first_example(doc: Path) -> list[Line]:
    """A doc's first example: its first ``bash`` or ``python`` block."""
    name = f"docs/{doc.name}"
    found = next((b for b in _blocks(doc) if b[0] in ("bash", "python")), None)
    if found is None:
        return [Line(name, 0, "# no bash or python block: a doc's first example must be one")]
    lang, start, body = found
    if lang == "python":
        return [Line(name, start, "\n".join(body), python=True)]
    return _commands(name, start, body)


def _argv(command: str) -> list[str]:
    argv = shlex.split(command, comments=True)
    if argv[:1] == ["zoo"] and len(argv) > 1 and argv[1] in SHORT:
        argv += SHORT[argv[1]]
    return argv


def run_line(line: Line, cwd: Path) -> None:
    """Run one shown line in ``cwd``; fail with what it printed when it does not exit 0."""
    if line.python:
        run_block(line.text, f"{line.doc}:{line.number}")
        return
    assert not re.search(r"<[A-Z_]+>", line.text), f"{line.doc}:{line.number} shows a placeholder"
    for command in line.text.split(" && "):
        argv = _argv(command)
        assert argv, f"{line.doc}:{line.number}: {line.text}"
        if argv[0] == "zoo" and ">" in argv:  # `zoo ... > FILE`: stdout into a file
            at = argv.index(">")
            with open(cwd / argv[at + 1], "w") as out, contextlib.redirect_stdout(out):
                rc = main(argv[1:at] + argv[at + 2 :])
        elif argv[0] == "zoo":
            rc = main(argv[1:])
        elif argv[:2] in (["source", ACTIVATE], [".", ACTIVATE]):
            rc = 0 if (cwd / ACTIVATE).is_file() and (cwd / ACTIVATE).with_name("zoo").is_file() else 1
        elif argv[0] in ("python", ".venv/bin/python"):
            done = subprocess.run([sys.executable, *argv[1:]], cwd=cwd, capture_output=True, text=True)
            rc = done.returncode
            assert rc == 0, done.stderr[-2000:]
        else:
            raise AssertionError(f"{line.doc}:{line.number}: not a command the walk knows: {command}")
        assert rc == 0, f"{line.doc}:{line.number}: `{command}` exited {rc}"


def _workdir(tmp_path_factory, name: str) -> Path:
    cwd = tmp_path_factory.mktemp(name)
    for name in linked():
        os.symlink(ROOT / name, cwd / name)
    # the environment `make` built (CI's .venv; else the one running the tests)
    os.symlink(ROOT / ".venv" if (ROOT / ".venv").is_dir() else Path(sys.prefix), cwd / ".venv")
    return cwd


def _params(lines: list[Line]):
    out = []
    for line in lines:
        marks = [pytest.mark.xdist_group(GROUP)]
        if line.marker:
            marks.append(pytest.mark.skip(reason=f"marked {line.marker} in {line.doc}"))
        out.append(pytest.param(line, id=f"{line.doc}:{line.number}", marks=marks))
    return out


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory) -> Path:
    return _workdir(tmp_path_factory, "readme")


def zoo_on_path(lines: list[Line], line: Line) -> bool:
    """Whether a line above ``line`` put ``zoo`` on the shell's PATH, as a reader's shell has it."""
    above = lines[: lines.index(line)]
    return any(
        shlex.split(a.text, comments=True)[:2] in (["source", ACTIVATE], [".", ACTIVATE]) for a in above
    )


def _runs_zoo(line: Line) -> bool:
    return not line.python and any(
        shlex.split(c, comments=True)[:1] == ["zoo"] for c in line.text.split(" && ")
    )


@pytest.mark.parametrize("line", _params(readme_lines()))
def test_readme_command_runs_as_written(line, readme_dir, monkeypatch):
    if _runs_zoo(line):
        assert zoo_on_path(readme_lines(), line), (
            f"README.md:{line.number}: zoo: command not found (no line above it puts .venv/bin on the PATH)"
        )
    monkeypatch.chdir(readme_dir)
    run_line(line, readme_dir)


DOCS = sorted((ROOT / "docs").glob("*.md"))
_DIRS: dict[str, Path] = {}


@pytest.mark.parametrize(
    "line",
    [p for doc in DOCS for p in _params(first_example(doc))],
)
def test_first_example_of_each_doc_runs_as_written(line, tmp_path_factory, monkeypatch):
    _run_in_docs_dir(line, tmp_path_factory, monkeypatch)


def _run_in_docs_dir(line: Line, tmp_path_factory, monkeypatch) -> None:
    if line.doc not in _DIRS:  # one directory per doc, shared by its lines in order
        _DIRS[line.doc] = _workdir(tmp_path_factory, Path(line.doc).stem)
    monkeypatch.chdir(_DIRS[line.doc])
    run_line(line, _DIRS[line.doc])


def python_blocks(doc: Path) -> list[Line]:
    """A doc's Python blocks after its first example (that one runs with the first examples)."""
    name, first = f"docs/{doc.name}", first_example(doc)
    blocks = [
        Line(name, start, "\n".join(body), python=True)
        for lang, start, body in _blocks(doc)
        if lang == "python"
    ]
    return [b for b in blocks if b not in first]


@pytest.mark.parametrize(
    "line",
    [p for doc in DOCS for p in _params(python_blocks(doc))],
)
def test_every_python_block_of_each_doc_runs_as_written(line, tmp_path_factory, monkeypatch):
    """After the doc's first example, in its directory: a block may read what that example made."""
    _run_in_docs_dir(line, tmp_path_factory, monkeypatch)


def test_the_readme_says_its_block_runs_from_the_root_the_walk_stands_for(tmp_path_factory):
    said = " ".join((ROOT / "README.md").read_text().split())
    assert "from the root of a checkout" in said  # where tests/fixtures/... and benchmarks/... resolve
    cwd = _workdir(tmp_path_factory, "root")
    assert {"tests", "benchmarks", "README.md", "zoo"} <= {p.name for p in cwd.iterdir()}


def _written(lines: list[Line]) -> set[str]:
    """The folders the ``zoo`` lines write afresh with ``--out`` (``--resume`` keeps a run)."""
    out = set()
    for line in lines:
        for command in line.text.split(" && ") if not line.python else ():
            try:
                argv = shlex.split(command, comments=True)
            except ValueError:  # a transcript's line, not a command
                continue
            if argv[:1] == ["zoo"] and "--out" in argv and "--resume" not in argv and not line.marker:
                out.add(os.path.normpath(argv[argv.index("--out") + 1]))
    return out


def every_command(doc: Path) -> list[Line]:
    """Every command line a doc shows, in any block but Python and TOML."""
    name = f"docs/{doc.name}"
    return [
        c
        for lang, start, body in _blocks(doc)
        if lang not in ("python", "toml")
        for c in _commands(name, start, body)
    ]


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_no_command_of_a_doc_writes_over_a_run_the_readme_made(doc):
    """A user who ran the README runs a doc's commands in the same folder: an ``--out`` the
    README wrote already holds checkpoints, and ``zoo train`` refuses it."""
    readme = _written(readme_lines())
    clashes = [
        f"{c.doc}:{c.number}: {sorted(_written([c]) & readme)}"
        for c in every_command(doc)
        if _written([c]) & readme
    ]
    assert not clashes, "writes over the README's runs: " + "; ".join(clashes)


def test_the_data_docs_stand_in_corpus_is_what_its_comment_says(tmp_path_factory, monkeypatch):
    """docs/data.md's first line makes a corpus its comment sizes in files; ``zoo tokenize``
    reads those files as its documents, and nothing else the script wrote."""
    from zoo.data.tokens.documents import open_documents

    line = first_example(ROOT / "docs" / "data.md")[0]
    files = int(re.search(r"(\d+) files", line.text.partition(" #")[2]).group(1))
    cwd = _workdir(tmp_path_factory, "corpus")
    monkeypatch.chdir(cwd)
    run_line(line, cwd)
    folder = cwd / shlex.split(line.text, comments=True)[2]
    assert open_documents(f"text:{folder}").documents == files
    assert len([p for p in folder.iterdir() if not p.name.startswith(".")]) == files


def transcripts(doc: Path, command: str) -> list[tuple[int, str, str]]:
    """The blocks of ``doc`` that show ``$ COMMAND ...`` and what it printed: (line, argv, text)."""
    return [
        (start, body[0][2:], "\n".join(body[1:]))
        for _, start, body in _blocks(doc)
        if body and body[0].startswith(f"$ {command} ")
    ]


def _figure(pattern: str, text: str) -> int | None:
    found = re.search(pattern, text)
    return int(found.group(1).replace(",", "")) if found else None


RESIDUALS = transcripts(ROOT / "docs" / "remat.md", "zoo residuals")


@pytest.mark.parametrize(
    ("start", "command", "text"), RESIDUALS, ids=[f"docs/remat.md:{start}" for start, _, _ in RESIDUALS]
)
def test_the_residual_figures_docs_show_are_what_the_command_prints(start, command, text, capsys):
    """docs/remat.md's ``$ zoo residuals ...`` transcripts: the totals in bytes, the number of
    parameter/input rows and of the 'outside' rows a transcript leaves out, as the command
    gives them today (--json, the same report)."""
    capsys.readouterr()
    assert main([*shlex.split(command)[1:], "--json"]) == 0
    report = __import__("json").loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = report["residuals"]
    outside = [r for r in rows if r["kind"] == "activation" and r["scope"] == "outside"]
    shown_outside = len(re.findall(r"│ outside │", text))
    figures = {
        r"on device \(([\d,]+) B\)": report["total_device_bytes"],
        r"on pinned_host \(([\d,]+) B\)": report["total_host_bytes"],
        r"(\d+) parameter/input residuals": len([r for r in rows if r["kind"] != "activation"]),
        r"\.\.\. (\d+) more 'outside' rows": len(outside) - shown_outside,
    }
    said = {pattern: _figure(pattern, text) for pattern in figures}
    assert {p: v for p, v in figures.items() if said[p] is not None} == {
        p: v for p, v in said.items() if v is not None
    }, f"docs/remat.md:{start}"


def test_the_padded_shape_docs_dp_gives_is_the_one_python_docs_lm_dp_builds():
    """docs/dp-recipes.md's python-docs-lm-dp section: the padded batch the run's summary reports."""
    import warnings

    from zoo import recipes
    from zoo.train.run import build_run

    said = _figure(r"fixed padded shape \((\d+) windows", (ROOT / "docs" / "dp-recipes.md").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = build_run(recipes.load_recipe("python-docs-lm-dp"), choose_remat=False)
    assert said == run.dp.sampler.padded_batch_size
