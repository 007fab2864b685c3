"""What the Markdown of the repository points at is in the repository, and is there.

A reader follows a doc's link to another page or a heading of it, and runs the scripts the docs
name from the root of a checkout. A page that is split or a heading that is renamed leaves links
behind it; a script named from outside the checkout works on one machine only. So:

- every relative link (``[text](path#heading)``) of every ``.md`` file resolves to a file inside
  the repository, and its ``#heading``, on a Markdown page, is one of that page's headings, as
  GitHub names them;
- every ``python PATH.py`` the README or a manual (``docs/``) shows (``.venv/bin/python`` too)
  names a file of the repository, from its root. (A ``RESULTS.md`` may record a run of an old
  tree, from a worktree of another commit.)

The second half of each test plants each kind of fault in a throwaway tree and sees it named.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTPUTS = {"runs", "hf", "out", "build"}  # what the shown commands write at the root
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
SCRIPT = re.compile(r"(?:^|[\s`(])(?:\.venv/bin/)?python3? ((?:\.\./|\./)?[\w./-]+\.py)\b")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def markdown_files(root: Path) -> list[Path]:
    """The repository's pages: every ``.md`` outside hidden folders and what commands write."""
    return sorted(
        p
        for p in root.rglob("*.md")
        if not any(part.startswith(".") or part in OUTPUTS for part in p.relative_to(root).parts[:-1])
    )


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings (a repeated one gets ``-1``, ``-2``, ...)."""
    seen: dict[str, int] = {}
    for line in FENCE.sub("", text).splitlines():
        found = re.match(r"#{1,6} (.+)", line)
        if found:
            name = slug(found.group(1))
            seen[name] = seen.get(name, -1) + 1
    return {name if n == 0 else f"{name}-{n}" for name, count in seen.items() for n in range(count + 1)}


def link_faults(root: Path) -> list[str]:
    """One line per link that leaves the repository, names no file, or names no heading."""
    faults = []
    for page in markdown_files(root):
        text = CODE_SPAN.sub("", FENCE.sub("", page.read_text()))
        for target in LINK.findall(text):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
                continue
            path, _, heading = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: ({target})"
            if not dest.is_relative_to(root.resolve()):
                faults.append(f"{where} points outside the repository")
            elif not dest.exists():
                faults.append(f"{where} names no file")
            elif heading and dest.suffix == ".md" and heading not in anchors(dest.read_text()):
                faults.append(f"{where} names no heading of {dest.relative_to(root.resolve())}")
    return faults


def manuals(root: Path) -> list[Path]:
    """The pages a user follows: the README and ``docs/``."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def script_faults(root: Path) -> list[str]:
    """One line per ``python PATH.py`` of a manual that names no file of the repository, from
    its root."""
    faults = []
    for page in manuals(root):
        for script in SCRIPT.findall(page.read_text()):
            dest = (root / script).resolve()
            if not dest.is_relative_to(root.resolve()) or not dest.is_file():
                faults.append(f"{page.relative_to(root)}: runs {script}, not a file of the repository")
    return faults


def test_every_link_of_the_docs_resolves_inside_the_repository():
    assert not link_faults(ROOT), "\n".join(link_faults(ROOT))


def test_every_script_the_docs_run_is_a_file_of_the_repository():
    assert not script_faults(ROOT), "\n".join(script_faults(ROOT))


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checks_name_each_planted_fault(tmp_path):
    repo = _tree(
        tmp_path / "repo",
        {
            "README.md": "[ok](docs/a.md#two-words) [gone](docs/b.md) [stale](docs/a.md#moved)\n"
            "[out](../elsewhere.md) `[not a link](x.md)` [web](https://example.org)\n",
            "docs/a.md": "# Title\n\n## Two words\n\n```bash\n# Moved\npython tools/check.py\n"
            "python ../shared/tools/structure.py\n.venv/bin/python tools/gone.py\n```\n[self](#title)\n",
            "tools/check.py": "",
            "runs/x/notes.md": "[ignored](nowhere.md)\n",
        },
    )
    (tmp_path / "elsewhere.md").write_text("# elsewhere\n")
    assert sorted(link_faults(repo)) == [
        "README.md: (../elsewhere.md) points outside the repository",
        "README.md: (docs/a.md#moved) names no heading of docs/a.md",
        "README.md: (docs/b.md) names no file",
    ]
    assert sorted(script_faults(repo)) == [
        "docs/a.md: runs ../shared/tools/structure.py, not a file of the repository",
        "docs/a.md: runs tools/gone.py, not a file of the repository",
    ]


def test_anchors_are_githubs():
    text = "# A `zoo audit`: run\n## Logical batches: `dp.microbatch_size`\n## Same\n## Same\n"
    assert anchors(text) == {"a-zoo-audit-run", "logical-batches-dpmicrobatch_size", "same", "same-1"}
