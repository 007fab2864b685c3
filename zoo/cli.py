"""The ``zoo`` command line. Each feature module adds its own subcommands via ``add_parser``."""

from __future__ import annotations

import argparse
import importlib
import sys
import warnings

from rich.markup import escape

from zoo.errors import ZooError
from zoo.ui import err_console

DESCRIPTION = (
    "zoo: train, evaluate, sample, export and benchmark small JAX models (Flax NNX and "
    "Equinox), with remat policies, DP-SGD and device meshes. `zoo recipes` lists what to "
    "train; `zoo COMMAND --help` shows a command's flags."
)

# Modules that define ``add_parser(subparsers)``, with the subcommands each one registers.
COMMAND_MODULES = {
    "zoo.commands.models": ("models",),
    "zoo.commands.train": ("train", "eval", "params"),
    "zoo.commands.sample": ("sample",),
    "zoo.commands.recipes": ("recipes",),
    "zoo.commands.remat": ("residuals", "remat-policies"),
    "zoo.commands.bench": ("bench",),
    "zoo.commands.audit": ("audit",),
    "zoo.commands.export": ("export",),
    "zoo.commands.hf": ("import",),
    "zoo.commands.tokens": ("tokenize",),
    "zoo.commands.plot": ("plot",),
    "zoo.commands.runs": ("runs",),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The full parser, or with ``command`` only the module that defines it: the command
    modules import orbax, datasets and dp_accounting, which take seconds to load."""
    parser = argparse.ArgumentParser(prog="zoo", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = [m for m, commands in COMMAND_MODULES.items() if command in commands]
    for name in modules or COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    # One line per warning, user text as plain text (not rich markup, not a source excerpt).
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    args = None
    try:
        # the parser imports the command's modules (seconds): a Ctrl-C meanwhile is one line too
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # output sent to a full file fails here, in one line, not at exit
        return code
    except ZooError as error:
        _error(str(error))
        return 2
    except KeyboardInterrupt:
        err_console.print("[bold red]interrupted[/]", highlight=False)
        return 130
    except Exception as error:  # out of room (a full disk, ulimit -f) anywhere: one line
        from zoo.train.save_guard import out_of_room

        cause = out_of_room(error)
        if cause is None:
            raise
        where = getattr(error, "filename", None)
        if where is None and _stdout_failed():
            where = "the standard output"
        if where is None and getattr(args, "out", None):
            where = f"under {args.out}"
        _error(f"could not write {where or 'a file'}: {cause}")
        return 2
    finally:
        warnings.showwarning = shown


def _error(text: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False, soft_wrap=True)


def _stdout_failed() -> bool:
    """Whether the standard output cannot take what it holds; if so its file descriptor is
    pointed at /dev/null, so that the interpreter's last flush does not fail a second time."""
    try:
        sys.stdout.flush()
        return False
    except OSError:
        import os

        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, sys.stdout.fileno())
            os.close(null)
        except (OSError, ValueError, AttributeError):  # not a real file (a test's capture)
            pass
        return True


if __name__ == "__main__":
    sys.exit(main())
