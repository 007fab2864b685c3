"""A doc's Python block, run as a reader pastes it, with the values it shows checked.

A block runs statement by statement in one fresh namespace. Where a bare expression (what a
REPL would echo) carries a comment that reads as a Python literal, on its own last line or on a
comment line right after it (``r["total_device_bytes"], r["total_host_bytes"]  # 43051012, 0``),
that literal is what the doc says the expression gives, and the run must give it. A comment that
is not a literal (``# [2, 128, vocab]``, ``# the new ids``) is prose and is left alone.
"""

from __future__ import annotations

import ast
import io
import tokenize


def _comments(source: str) -> dict[int, tuple[str, bool]]:
    """Line number -> (the comment's text, whether the line holds nothing else)."""
    found = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            alone = not tok.line[: tok.start[1]].strip()
            found[tok.start[0]] = (tok.string[1:].strip(), alone)
    return found


def _literal(text: str):
    try:
        return True, ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False, None


def _is_print(expr: ast.expr) -> bool:
    return isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "print"


def shown_value(comments: dict[int, tuple[str, bool]], node: ast.stmt):
    """``(True, value)`` when the doc shows what the expression statement ``node`` gives."""
    if not isinstance(node, ast.Expr) or _is_print(node.value):  # a print shows text, not a value
        return False, None
    for line, must_be_alone in ((node.end_lineno, False), (node.end_lineno + 1, True)):
        text, alone = comments.get(line, ("", False))
        if text and (alone or not must_be_alone):
            shown, value = _literal(text)
            if shown:
                return True, value
    return False, None


def _same(value, said) -> bool:
    try:
        return bool(value == said)
    except Exception:  # an array against a literal: not what a doc's comment shows
        return False


def run_block(source: str, where: str) -> None:
    """Run a Python block; fail naming the line whose value differs from its comment."""
    comments = _comments(source)
    namespace = {"__name__": "__doc_example__"}
    for node in ast.parse(source, where).body:
        shown, said = shown_value(comments, node)
        if shown:
            value = eval(compile(ast.Expression(node.value), where, "eval"), namespace)
            assert _same(value, said), (
                f"{where}, block line {node.lineno}: gives {value!r}, the doc says {said!r}"
            )
        else:
            exec(compile(ast.Module([node], type_ignores=[]), where, "exec"), namespace)
