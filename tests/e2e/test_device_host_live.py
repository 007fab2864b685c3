"""benchmarks/device/host_live.py: the host's JAX arrays summed through three host steps, run as
the benchmarks' README shows it (the figures are RESULTS.md's, not this test's)."""

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "device" / "host_live.py"


def test_the_probe_reports_three_steps_against_the_pipelines_budget():
    done = subprocess.run([sys.executable, str(SCRIPT), "exact"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "host cpu:1" in done.stdout, done.stdout  # the host a second CPU device, not the first
    steps = re.findall(
        r"step (\d): host arrays ([\d.]+) MiB before, at most ([\d.]+) .*budget ([\d.]+) MiB", done.stdout
    )
    assert [s[0] for s in steps] == ["0", "1", "2"], done.stdout
    assert all(
        float(at_most) >= float(before) > 0 and float(budget) > 0 for _, before, at_most, budget in steps
    )


def test_a_bad_mode_or_floor_is_one_line_naming_it():
    done = subprocess.run([sys.executable, str(SCRIPT), "bogus"], capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "unknown mode 'bogus'; valid: exact, serial, delayed" in done.stderr
    update = SCRIPT.with_name("host_update.py")
    done = subprocess.run(
        [sys.executable, str(update), "--ram-floor-gib", "0"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 2 and "--ram-floor-gib 0.0: the floor is a number of GiB > 0" in done.stderr
    for flags, says in (
        (["--ram-floor-gib", "4", "--ram-trail-gib", "-1"], "--ram-trail-gib -1.0: a number of GiB > 0"),
        (["--ram-trail-gib", "1"], "--ram-trail-gib 1.0: a number of GiB > 0, with --ram-floor-gib"),
    ):
        done = subprocess.run(
            [sys.executable, str(update), *flags], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 2 and says in done.stderr, (flags, done.stderr[-500:])
