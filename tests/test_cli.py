"""The CLI loads only the module of the command it runs; the command table must match."""

import argparse
import importlib

from zoo import cli


def test_command_table_matches_what_each_module_registers():
    for module, commands in cli.COMMAND_MODULES.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers(dest="command")
        importlib.import_module(module).add_parser(sub)
        assert tuple(sub.choices) == commands, module


def test_a_command_builds_only_its_own_module_and_unknown_builds_all():
    assert set(cli.build_parser("models")._subparsers._group_actions[0].choices) == {"models"}
    everything = {c for commands in cli.COMMAND_MODULES.values() for c in commands}
    assert set(cli.build_parser("nope")._subparsers._group_actions[0].choices) == everything
    assert set(cli.build_parser(None)._subparsers._group_actions[0].choices) == everything
