"""The sizes and the places docs/contributing.md asks of zoo's code ("Layering").

A file holds one idea and is read in one sitting: a module of ``zoo/`` stays within
``MAX_FILE_LINES`` lines, and a function's body (its docstring left out: a long why is welcome)
within ``MAX_FUNCTION_LINES``. A model kind lives in one folder: its config class and its NNX and
Equinox classes come from files of one directory. The import layers themselves are
``tests/test_layering.py``'s. Each check is a function of a source tree, so the planted test
below can hand it a throwaway package.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "contributing.md"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 80


def _python_files(package: Path) -> list[Path]:
    return sorted(package.rglob("*.py"))


def long_files(package: Path, limit: int = MAX_FILE_LINES) -> list[str]:
    """One line per module of ``package`` with more than ``limit`` lines."""
    found = []
    for path in _python_files(package):
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found.append(f"{path.relative_to(package.parent)}: {lines} lines, more than {limit}")
    return found


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines from a function's first statement after its docstring to its end."""
    body = node.body
    has_docstring = isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
    first = body[1] if has_docstring and len(body) > 1 else body[0]
    return node.end_lineno - first.lineno + 1


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """One line per function (methods and nested ones too) whose body runs past ``limit`` lines."""
    found = []
    for path in _python_files(package):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > limit:
                where = f"{path.relative_to(package.parent)}:{node.lineno}"
                found.append(f"{where}: {node.name} runs {_body_lines(node)} lines, more than {limit}")
    return found


def scattered_kinds(kinds) -> list[str]:
    """One line per model kind whose config, NNX and Equinox classes are not in one folder."""
    found = []
    for kind in kinds:
        classes = (kind.config, kind.module_class("nnx"), kind.module_class("eqx"))
        folders = sorted({str(Path(inspect.getfile(c)).parent) for c in classes})
        if len(folders) > 1:
            found.append(
                f"model kind {kind.name} is spread over {len(folders)} folders: {', '.join(folders)}"
            )
    return found


def test_the_doc_states_the_limits_checked_here():
    said = " ".join(DOC.read_text().split())
    assert f"Files stay under {MAX_FILE_LINES} lines and functions under {MAX_FUNCTION_LINES}" in said
    assert "tests/test_structure.py" in said


def test_zoo_modules_stay_within_the_file_size():
    assert not long_files(ROOT / "zoo"), "\n".join(long_files(ROOT / "zoo"))


def test_zoo_functions_stay_within_the_function_size():
    assert not long_functions(ROOT / "zoo"), "\n".join(long_functions(ROOT / "zoo"))


def test_each_model_kind_lives_in_one_folder():
    from zoo.models.registry import kinds

    assert len(kinds()) >= 4
    assert not scattered_kinds(kinds()), "\n".join(scattered_kinds(kinds()))


def _function(name: str, body_lines: int, doc_lines: int = 0) -> str:
    doc = ['    """', *(["    why"] * doc_lines), '    """'] if doc_lines else []
    return "\n".join([f"def {name}():", *doc, *(["    x = 1"] * (body_lines - 1)), "    return x", ""])


def test_the_checks_name_each_planted_fault(tmp_path):
    package = tmp_path / "fake"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (package / "fits.py").write_text("x = 1\n" * MAX_FILE_LINES)
    (package / "funcs.py").write_text(
        _function("too_long", MAX_FUNCTION_LINES + 1)
        + _function("just_fits", MAX_FUNCTION_LINES)
        + _function("long_why_short_body", 5, doc_lines=MAX_FUNCTION_LINES)
        + "class Holder:\n"
        + re.sub(r"(?m)^", "    ", _function("method_too_long", MAX_FUNCTION_LINES + 2))
    )
    assert long_files(package) == [f"fake/long.py: {MAX_FILE_LINES + 1} lines, more than {MAX_FILE_LINES}"]
    method_at = (package / "funcs.py").read_text().splitlines().index("    def method_too_long():") + 1
    assert long_functions(package) == [
        f"fake/funcs.py:1: too_long runs {MAX_FUNCTION_LINES + 1} lines, more than {MAX_FUNCTION_LINES}",
        f"fake/funcs.py:{method_at}: method_too_long runs {MAX_FUNCTION_LINES + 2} lines, more than {MAX_FUNCTION_LINES}",
    ]


def test_a_kind_spread_over_two_folders_is_named():
    from zoo.models.mlp.config import MLPConfig
    from zoo.models.registry import kind_of
    from zoo.models.transformer.config import TransformerConfig

    mlp = kind_of(MLPConfig())
    elsewhere = type(mlp)(**{**mlp.__dict__, "eqx": kind_of(TransformerConfig()).module_class("eqx")})
    found = scattered_kinds([mlp, elsewhere])
    assert len(found) == 1 and found[0].startswith("model kind mlp is spread over 2 folders"), found
