"""``zoo.commands.audit``: the progress bar gives the audit's rate in steps a second, once."""

from __future__ import annotations

import zoo.audit.report as report
from zoo.cli import main


def test_the_audit_bar_reads_steps_per_second_and_nothing_else(capsys, monkeypatch, tmp_path):
    def audit(recipe, out, *, progress, **kwargs) -> dict:  # the run itself is tested in tests/audit
        progress(3, 0.5)
        return {"epsilon": 1.0, "bounds": {"loss": 0.5}}

    monkeypatch.setattr(report, "audit", audit)
    capsys.readouterr()
    assert main(["audit", "digits-mlp-dp", "--out", str(tmp_path / "a"), "--json"]) == 0
    bar = [line for line in capsys.readouterr().err.splitlines() if line.startswith("audit digits-mlp-dp")]
    assert bar and " steps/s" in bar[-1] and "ex/s" not in bar[-1] and "steps/s," not in bar[-1], bar


def test_the_audit_says_each_part_and_its_steps_as_it_goes_off_a_terminal(capsys, tmp_path):
    """Minutes of an audit print as they go (issue 67): the parts in order, and off a terminal
    (stderr here is captured, as a log or a pipe is) a line per tenth of the steps."""
    argv = [
        "audit",
        "digits-mlp-dp",
        "--set",
        "train.steps=2",
        "--canaries",
        "20",
        "--out",
        str(tmp_path / "a"),
    ]
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("audit: ")]
    assert [line.split(" (")[0].split(",")[0] for line in said] == [
        "audit: building the run of digits-mlp-dp with 20 canaries",
        "audit: training 2 steps",
        "audit: step 1/2",
        "audit: step 2/2",
        "audit: scoring the canaries",
        "audit: writing audit.json",
    ], said
    argv[-1] = str(tmp_path / "b")
    assert main([*argv, "--no-progress", "--json"]) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("audit: ")]
