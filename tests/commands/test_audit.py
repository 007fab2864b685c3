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
