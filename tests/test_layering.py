"""zoo's import graph against the layer order written in docs/contributing.md ("Layering").

Every module under ``zoo/`` belongs to one layer of the doc's fenced block, and every import
(``import`` and ``from``, at any depth: inside functions and ``if TYPE_CHECKING:`` blocks too,
relative ones resolved) points to the same layer or one below it. Modules of one layer may
import each other, but no import cycle is allowed, between modules or between the entries of a
layer. The doc's "`X` never imports `Y`" sentences are checked as well. A second test plants
each kind of violation in a throwaway package and asserts that the checker reports it.

Dynamic lookups (``importlib.import_module`` of a table's entry) are not edges: they are how
the CLI, the bench list and the model registry find their rows by name.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections import defaultdict
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
DOC = REPO / "docs" / "contributing.md"
ROOT_ENTRY = "__init__"  # the table's name for the package's own __init__.py


# ----------------------------------------------------------------------------- the doc


def read_layers(doc: str) -> list[list[str]]:
    """The layers of the first fenced block under the ``## Layering`` heading, top first.

    Each line of the block is ``names   description``: the names (``commands/`` for a
    package, ``remat`` for a module, ``__init__`` for the package's own ``__init__.py``),
    separated by commas or two spaces, then two or more spaces and the description (the
    last such field).
    """
    section = _layering_section(doc)
    block = re.search(r"```[^\n]*\n(.*?)```", section, re.S)
    if block is None:
        raise ValueError("docs/contributing.md: no fenced block of layers under '## Layering'")
    layers = []
    for line in block.group(1).splitlines():
        if line.strip():
            fields = re.split(r"\s{2,}", line.strip())
            names = " ".join(fields[:-1] if len(fields) > 1 else fields)
            layers.append([n.strip("`/") for n in re.split(r"[,\s]+", names) if n.strip("`/")])
    return layers


def read_never_rules(doc: str) -> dict[str, set[str]]:
    """The ``"`X` never imports `A`, `B` or `C`"`` sentences of the Layering section."""
    rules: dict[str, set[str]] = defaultdict(set)
    for src, targets in re.findall(
        r"`([\w/]+)`\s+never\s+imports\s+((?:`[\w/]+`(?:,\s*|\s+or\s+|\s+and\s+)?)+)", _layering_section(doc)
    ):
        rules[src.strip("/")].update(t.strip("/") for t in re.findall(r"`([\w/]+)`", targets))
    return dict(rules)


def _layering_section(doc: str) -> str:
    match = re.search(r"^## Layering\n(.*?)(?=^## |\Z)", doc, re.S | re.M)
    if match is None:
        raise ValueError("docs/contributing.md has no '## Layering' section")
    return match.group(1)


# ----------------------------------------------------------------------------- the graph


def find_modules(src_root: Path, package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``src_root/package``."""
    mods = {}
    for path in sorted((src_root / package).rglob("*.py")):
        parts = list(path.relative_to(src_root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imported_names(mods: dict[str, Path], module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    prefix = node.module or ""
    if node.level:  # relative: count up from the module's package
        base = module.split(".")
        if mods[module].name != "__init__.py":
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    # `from pkg import name` imports the module pkg.name where there is one, else pkg itself
    return [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in mods else prefix for a in node.names]


def _longest_module(mods: dict[str, Path], name: str) -> str | None:
    while name not in mods and "." in name:
        name = name.rsplit(".", 1)[0]
    return name if name in mods else None


class _Imports(ast.NodeVisitor):
    """Every import of a module, with its line and whether it sits inside a function."""

    def __init__(self) -> None:
        self.found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []
        self.depth = 0

    def _function(self, node: ast.AST) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        self.found.append((node, self.depth > 0))

    visit_ImportFrom = visit_Import


def import_edges(src_root: Path, package: str) -> tuple[dict[str, Path], list[tuple[str, str, int, bool]]]:
    """The package's modules and its imports between them: (importer, imported, line, in_function)."""
    mods = find_modules(src_root, package)
    edges = []
    for module, path in mods.items():
        visitor = _Imports()
        visitor.visit(ast.parse(path.read_text(), str(path)))
        for node, in_function in visitor.found:
            for name in _imported_names(mods, module, node):
                target = _longest_module(mods, name) if name.split(".")[0] == package else None
                if target is not None and target != module:
                    edges.append((module, target, node.lineno, in_function))
    return mods, sorted(set(edges))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while not comp or comp[-1] != v:
                comp.append(stack.pop())
                on_stack.discard(comp[-1])
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


# ----------------------------------------------------------------------------- the check


def _entry_of(module: str, package: str, entries: list[str]) -> str | None:
    """The table entry a module belongs to: the longest entry naming it or a package above it."""
    rel = module[len(package) + 1 :] if module != package else ROOT_ENTRY
    best = None
    for entry in entries:
        if (rel == entry or rel.startswith(entry + ".")) and (best is None or len(entry) > len(best)):
            best = entry
    return best


def check(src_root: Path, package: str, layers: list[list[str]], never: dict[str, set[str]]) -> list[str]:
    """One line per finding: unplaced modules, stale entries, upward imports, cycles, rule breaks."""
    mods, edges = import_edges(src_root, package)
    level = {e.replace("/", "."): i for i, names in enumerate(layers) for e in names}
    entries = list(level)
    entry = {m: _entry_of(m, package, entries) for m in mods}
    findings = [
        f"module {m} ({mods[m].relative_to(src_root)}) is in no layer of the Layering block"
        for m in mods
        if entry[m] is None
    ]
    findings += [
        f"layer entry `{e}` names no module under {package}/" for e in entries if e not in entry.values()
    ]
    entry_graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, line, in_function in edges:
        a, b = entry[src], entry[dst]
        if a is None or b is None or a == b:
            continue
        if level[a] == level[b]:  # across layers, a cycle needs an upward import: reported as one
            entry_graph[a].add(b)
        where = f"{mods[src].relative_to(src_root)}:{line}" + (" (inside a function)" if in_function else "")
        if level[b] < level[a]:
            findings.append(f"upward import: {where}: {src} -> {dst} (`{a}` is below `{b}`)")
        top_a, top_b = a.split(".")[0], b.split(".")[0]
        if top_b in never.get(top_a, ()):
            findings.append(f"forbidden import: {where}: {src} -> {dst} (`{top_a}` never imports `{top_b}`)")
    module_graph: dict[str, set[str]] = defaultdict(set)
    for src, dst, _, _ in edges:
        module_graph[src].add(dst)
    findings += ["import cycle: " + " <-> ".join(c) for c in _cycles(module_graph)]
    findings += ["cycle between layer entries: " + " <-> ".join(c) for c in _cycles(entry_graph)]
    return findings


# ----------------------------------------------------------------------------- the tests


def test_zoo_imports_follow_the_documented_layers():
    doc = DOC.read_text()
    layers, never = read_layers(doc), read_never_rules(doc)
    assert len(layers) >= 5, layers
    assert never, "the Layering section lost its '`X` never imports `Y`' sentences"
    findings = check(REPO, "zoo", layers, never)
    assert not findings, "zoo's imports break docs/contributing.md's Layering:\n" + "\n".join(findings)


def test_the_checker_sees_zoo_imports_at_every_depth():
    mods, edges = import_edges(REPO, "zoo")
    assert len(mods) > 50 and len(edges) > 200, (len(mods), len(edges))
    assert any(in_function for *_, in_function in edges), "no import inside a function was found"


FAKE_DOC = """\
# Contributing

## Layering

```
__init__, top     the top
mid/              the middle
low  util, base    the bottom
```

`low` never imports `util`; no cycles.

## Next section

```
mid/   a fenced block that is not the layer table
```
"""

FAKE_FILES = {
    "__init__.py": "",
    "top.py": "from fake.mid import a\nimport fake.base\n",  # down: allowed
    "mid/__init__.py": "from .a import g\n",  # its own child: allowed
    "mid/a.py": "from . import b\nfrom ..base import h\n\ndef g():\n    return b, h\n",  # relative, down
    "mid/b.py": "from fake.mid.a import g\n",  # closes the cycle a -> b -> a
    "base.py": "def h():\n    return 0\n",
    "low.py": "from fake import top\nimport fake.util\n",  # up, and a broken rule
    "util.py": "def f():\n    from .mid import b\n\n    return b\n",  # up, inside a function
    "stray.py": "",  # in no layer
}


def test_the_checker_reports_each_planted_violation(tmp_path):
    for rel, text in FAKE_FILES.items():
        path = tmp_path / "fake" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    layers, never = read_layers(FAKE_DOC), read_never_rules(FAKE_DOC)
    assert layers == [["__init__", "top"], ["mid"], ["low", "util", "base"]]
    assert never == {"low": {"util"}}
    findings = check(tmp_path, "fake", layers, never)
    assert sorted(findings) == sorted(
        [
            "module fake.stray (fake/stray.py) is in no layer of the Layering block",
            "upward import: fake/low.py:1: fake.low -> fake.top (`low` is below `top`)",
            "forbidden import: fake/low.py:2: fake.low -> fake.util (`low` never imports `util`)",
            "upward import: fake/util.py:2 (inside a function): fake.util -> fake.mid.b (`util` is below `mid`)",
            "import cycle: fake.mid.a <-> fake.mid.b",
        ]
    ), "\n".join(findings)


def test_the_checker_reports_an_entry_cycle_and_a_stale_entry(tmp_path):
    doc = "## Layering\n\n```\nalpha, beta, gone   one layer\n```\n"
    files = {"__init__.py": "", "alpha/__init__.py": "", "alpha/x.py": "import fake.beta.y\n"}
    files |= {"beta/__init__.py": "", "beta/y.py": "", "beta/z.py": "from fake.alpha import x\n"}
    for rel, text in files.items():
        path = tmp_path / "fake" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    layers = [["__init__", *read_layers(doc)[0]]]
    findings = check(tmp_path, "fake", layers, {})
    assert sorted(findings) == [
        "cycle between layer entries: alpha <-> beta",
        "layer entry `gone` names no module under fake/",
    ], "\n".join(findings)
