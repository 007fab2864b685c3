"""The ``zoo`` command line. Each feature module adds its own subcommands via ``add_parser``."""

from __future__ import annotations

import argparse
import importlib
import sys

from zoo.errors import ZooError
from zoo.ui import err_console

# Modules that define ``add_parser(subparsers)``; each registers one or more subcommands.
COMMAND_MODULES = (
    "zoo.commands.models",
    "zoo.commands.train",
    "zoo.commands.remat",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="zoo", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except ZooError as error:
        err_console.print(f"[bold red]error:[/] {error}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
