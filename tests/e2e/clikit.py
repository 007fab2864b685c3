"""Running `zoo` in-process and checking that bad input gets one line.

Each case of issue 33 runs ``zoo.cli.main`` in the test process (a subprocess costs seconds of
imports) and asserts the exit code, a single ``error:`` line naming the value, and no traceback.
"""

from __future__ import annotations

from zoo.cli import main


def refused(capsys, argv: list[str], *fragments: str, code: int = 2) -> str:
    """Run ``zoo *argv``; assert it exits ``code`` with one ``error:`` line on stderr holding
    every fragment and no traceback. Returns the line."""
    rc = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    lines = captured.err.strip().splitlines()
    assert rc == code, (rc, captured.err)
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]
