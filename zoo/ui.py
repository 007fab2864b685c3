"""Terminal output at the edges: rich tables and progress, and one-line JSON for scripts."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text


class _WholeStdout:
    """The stdout console's file: whatever ``sys.stdout`` is at the time (a test's capture
    too), written through :func:`write_out`, so a table or line that does not fit a file-size
    limit is an OSError (one line and exit 2 from the CLI) rather than a file cut short with
    exit 0. Under a live display (a progress bar) ``sys.stdout`` is rich's proxy, which prints
    through this console: the proxied stream is written, as rich's own file lookup does."""

    @staticmethod
    def _stream():
        return getattr(sys.stdout, "rich_proxied_file", sys.stdout)

    def write(self, text: str) -> int:
        write_out(text, self._stream())
        return len(text)

    def flush(self) -> None:
        self._stream().flush()

    def isatty(self) -> bool:
        return self._stream().isatty()

    def fileno(self) -> int:
        return self._stream().fileno()

    @property
    def encoding(self) -> str:
        return getattr(self._stream(), "encoding", None) or "utf-8"


console = Console(file=_WholeStdout())
err_console = Console(stderr=True)


_LONGEST_WORD = 40  # a longer single-word cell (a path, a list of files) folds instead


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]], out=None) -> None:
    """A table whose title and cells are plain text: brackets in user text are not markup.
    Printed on ``out`` (default: the stdout console).

    Nothing is cut off, on a terminal or piped (where rich assumes 80 columns): a column whose
    cells are short single words (names, counts, meshes) is never broken; columns of prose
    wrap, and long words (paths) fold onto the next line. When
    the unbroken columns alone are wider than the console, the lines run past its edge.
    """
    out = out or console
    cells = [[str(cell) for cell in row] for row in rows]
    table = Table(title=Text(title))
    least = len(columns) + 1  # the vertical rules
    for i, column in enumerate(columns):
        texts = [column] + [row[i] for row in cells if i < len(row)]
        longest_word = max(len(word) for text in texts for word in text.split() or [""])
        words = all(len(text.split()) <= 1 for text in texts) and longest_word <= _LONGEST_WORD
        # min_width: a prose column wraps between words, never inside one (up to _LONGEST_WORD)
        table.add_column(
            Text(column), no_wrap=words, overflow="fold", min_width=min(longest_word, _LONGEST_WORD)
        )
        least += min(longest_word, _LONGEST_WORD) + 2  # the cell padding
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    if least > out.width:
        table.width = least
    out.print(table, crop=False)


def emit_json(obj: object) -> None:
    """Print ``obj`` as one JSON line on stdout (the last line scripts read)."""
    write_out(json.dumps(obj, default=_jsonable) + "\n")


def write_out(text: str, stream=None) -> None:
    """``text`` on ``stream`` (default stdout), whole or an OSError: a buffered stream that fills
    a file-size limit keeps the part that did not fit and reports nothing, so the output ended
    cut short with exit 0. On a real file each byte is written by the operating system's own
    calls."""
    stream = sys.stdout if stream is None else stream
    stream.flush()
    try:
        fd = stream.fileno()
    except (AttributeError, ValueError, OSError):  # not a file (a test's capture): as it is
        stream.write(text)
        stream.flush()
        return
    data = text.encode(getattr(stream, "encoding", None) or "utf-8")
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError as error:
        raise OSError(error.errno, error.strerror, "the standard output") from None


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def stage_lines(quiet: bool = False):
    """What a long command prints as it goes: each call writes one plain, dim line on stderr
    (``finetune bench: compiling frozen``), which a log or a pipe shows at once, where a
    progress bar shows nothing until it ends. ``None`` (nothing printed) when ``quiet``."""
    if quiet:
        return None
    return lambda message: err_console.print(message, style="dim", markup=False, highlight=False)


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def rate_text(rate: float | None) -> str:
    """A rate with the digits it has: whole numbers with separators from 100 up (``1,234``),
    three significant figures below (``42.3``, ``0.423``), so that a slow run does not read
    ``0``; ``-`` before a rate is measured (the first step compiles and is not timed)."""
    if rate is None or not math.isfinite(rate) or rate <= 0:
        return "-"
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


class StepLines:
    """Plain progress lines where a progress bar cannot be seen (stderr is a file or a pipe).

    A bar redraws one line on a terminal; written to a log it would show nothing until the run
    ends. Off a terminal, ``update`` prints ``NAME: step D/T`` every ``every`` steps (about ten
    lines a run) with the throughput as the bar shows it (``speed``: tokens a second for an LM,
    with the MFU on an accelerator: zoo.train.pace), the loss when there is one, and the latest
    eval figures. A DP run hands no loss (it is not released), so its lines carry only released
    figures: the step, the padded rows (or their tokens) per second, and the eval metrics and
    epsilon of the latest eval.
    """

    def __init__(
        self, console: Console, name: str, total: int, visible: bool = True, every: int | None = None
    ):
        self.console, self.name, self.total = console, name, total
        self.on = visible and not console.is_terminal
        self.every = every or max(1, total // 10)

    def update(self, done: int, *, speed: str, loss: float | None = None, evals: dict | None = None) -> None:
        if not self.on or not (done % self.every == 0 or done == self.total):
            return
        figures = [speed] + ([] if loss is None else [f"loss {loss:.4f}"])
        figures += [f"{key} {_short(value)}" for key, value in (evals or {}).items()]
        self.console.print(
            Text(f"{self.name}: step {done}/{self.total}  " + ", ".join(figures)), soft_wrap=True
        )


def _short(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
