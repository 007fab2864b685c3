"""Terminal output at the edges: rich tables and progress, and one-line JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

console = Console(stderr=False)
err_console = Console(stderr=True)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], out=None) -> None:
    """A table whose title and cells are plain text: brackets in user text are not markup.
    Printed on ``out`` (default: the stdout console)."""
    table = Table(title=Text(title))
    for column in columns:
        table.add_column(Text(column))
    for row in rows:
        table.add_row(*(Text(str(cell)) for cell in row))
    (out or console).print(table)


def emit_json(obj: object) -> None:
    """Print ``obj`` as one JSON line on stdout (the last line scripts read)."""
    sys.stdout.write(json.dumps(obj, default=_jsonable) + "\n")
    sys.stdout.flush()


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
