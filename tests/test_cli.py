"""The CLI loads only the module of the command it runs; the command table must match."""

import argparse
import importlib

import pytest

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


def test_out_of_room_anywhere_is_one_line_and_other_errors_keep_their_traceback(monkeypatch, capsys):
    """A command that runs out of room (a full disk, ``ulimit -f``, a quota) says so in one line,
    the file's name or the command's --out in it; any other error is a bug and keeps its
    traceback. Rust's wording (safetensors: "(os error 27)") is read as an OSError's code is."""
    import errno

    import pytest

    from zoo.train.save_guard import out_of_room

    def fails(error):
        def run(args):
            raise error

        monkeypatch.setattr(cli, "build_parser", lambda command: _parser(run))

    fails(OSError(errno.ENOSPC, "No space left on device", "/data/x.bin"))
    assert cli.main(["models"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: could not write /data/x.bin: No space left on device: the disk is full", err
    fails(RuntimeError("Error while serializing: I/O error: File too large (os error 27)"))
    assert cli.main(["models"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: could not write a file: File too large")
    fails(OSError(errno.EACCES, "Permission denied", "/x"))
    with pytest.raises(OSError, match="Permission denied"):
        cli.main(["models"])
    assert out_of_room(ValueError("no os error here")) is None


def _parser(run):
    parser = argparse.ArgumentParser()
    parser.add_argument("words", nargs="*")
    parser.set_defaults(func=run)
    return parser


def test_ctrl_c_while_the_commands_modules_load_is_one_line(monkeypatch, capsys):
    def interrupted(command):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["import", "x", "--out", "y"]) == 130
    assert capsys.readouterr().err.strip() == "interrupted"


@pytest.mark.parametrize("flags", [["--json"], []], ids=["json", "table"])
def test_output_sent_to_a_file_past_its_size_limit_is_refused_not_cut_short(tmp_path, flags):
    """``zoo recipes --json > f`` (and the table, ``zoo recipes > f``) under ``ulimit -f 4``:
    before, the file ended after 4,096 bytes, mid-JSON or mid-table, with exit 0 (a buffered
    stream keeps what did not fit and reports nothing). Both are about 26 kB."""
    import subprocess
    import sys

    out = tmp_path / "recipes.txt"
    cli_line = "import sys; from zoo.cli import main; sys.exit(main(sys.argv[1:]))"
    # the limit set by a shell (ulimit -f 4: 4 x 1,024 bytes), not a preexec_fn (a fork of a process with JAX's threads)
    done = subprocess.run(
        [
            "bash",
            "-c",
            'ulimit -f 4; exec "$0" -c "$1" recipes "${@:3}" > "$2"',
            sys.executable,
            cli_line,
            str(out),
            *flags,
        ],
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr.strip().splitlines() == [
        "error: could not write the standard output: File too large: a file-size limit (ulimit -f) was reached"
    ], done.stderr


def test_a_size_of_zero_or_less_is_refused_not_taken_as_the_default(capsys):
    """``--seq 0`` read as "the default" (``args.seq or ...``): a run that reported another size
    than asked; a negative one failed inside JAX with a traceback. (``--layers`` goes to the
    model, which refuses what it cannot take: an MLP of no hidden layer is a model,
    tests/commands/test_remat.py.)"""
    import pytest

    cases = [
        ["residuals", "transformer-s", "--seq", "0"],
        ["residuals", "transformer-s", "--batch", "-2"],
        ["bench", "remat", "transformer-s", "--batch", "0"],
        ["bench", "dp", "mlp-s", "--seq", "0"],
        ["bench", "finetune", "transformer-s", "--batch", "0"],
        ["bench", "scale", "mlp-s", "--seq", "-1"],
    ]
    for argv in cases:
        with pytest.raises(SystemExit) as exited:
            cli.main(argv)
        assert exited.value.code == 2, argv
        assert f"argument {argv[-2]}: must be at least 1, got {argv[-1]}" in capsys.readouterr().err, argv
