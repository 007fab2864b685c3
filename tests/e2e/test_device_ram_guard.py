"""benchmarks/device/ram_guard.py: the lent machine's host RAM guarded, so that a command that
runs it out loses its largest process, not the machine and every log (on this CPU, with the RAM
it reads from a file the test writes)."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "benchmarks" / "device" / "ram_guard.py"
# a shell (a few MiB) whose child holds about 200 MiB: the guard must pick the child
TREE = f"{sys.executable} -c 'import time; x = bytearray(200 * 2**20); x[::4096] = b\"1\" * len(x[::4096]); time.sleep(120)'; exit $?"


def meminfo(path: Path, available_kib: int) -> Path:
    path.write_text(f"MemTotal:       41000000 kB\nMemAvailable:   {available_kib} kB\n")
    return path


def started_tree():
    shell = subprocess.Popen(["bash", "-c", TREE])
    sys.path.insert(0, str(GUARD.parent))
    try:
        import ram_guard
    finally:
        sys.path.remove(str(GUARD.parent))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # until the child holds its bytes
        under = ram_guard.descendants(shell.pid)
        if len(under) == 1 and ram_guard.rss_mib(under[0]) > 150:
            return shell, under[0]
        time.sleep(0.1)
    shell.kill()
    pytest.fail("the child never held its 200 MiB")


def guard(root: int, info: Path, floor: int = 3072):
    cmd = [sys.executable, str(GUARD), "--root", str(root), "--floor-mib", str(floor), "--every", "0.1"]
    return subprocess.Popen([*cmd, "--meminfo", str(info)], stdout=subprocess.PIPE, text=True)


def test_low_ram_kills_the_largest_process_and_says_so(tmp_path):
    shell, child = started_tree()
    watcher = guard(shell.pid, meminfo(tmp_path / "meminfo", 1024 * 1024))  # 1 GiB < 3 GiB
    try:
        assert shell.wait(timeout=30) == 128 + signal.SIGKILL  # the shell's child was killed
        out, _ = watcher.communicate(timeout=30)  # the root gone, the guard ends
    finally:
        shell.kill()
        watcher.kill()
    assert f"killed pid {child} (" in out and "1,024 MiB available < 3,072" in out, out
    assert "least host RAM available 1,024 MiB" in out, out


def test_enough_ram_kills_nothing(tmp_path):
    shell, child = started_tree()
    watcher = guard(shell.pid, meminfo(tmp_path / "meminfo", 30 * 1024 * 1024))  # 30 GiB
    try:
        time.sleep(1.0)
        assert shell.poll() is None and os.path.exists(f"/proc/{child}")
        watcher.send_signal(signal.SIGTERM)  # as tpu.sh ends it
        out, _ = watcher.communicate(timeout=30)
    finally:
        shell.kill()
        watcher.kill()
    assert "killed" not in out and "least host RAM available 30,720 MiB" in out, out
    assert "the most one process held" in out and "bytearray" in out, out


def test_a_process_gone_while_listed_has_no_children():
    """The TPU call of 2026-12-07 lost its guard to a step's process that ended between the
    guard's listing and its read of the process's threads."""
    sys.path.insert(0, str(GUARD.parent))
    try:
        import ram_guard
    finally:
        sys.path.remove(str(GUARD.parent))
    done = subprocess.Popen(["true"])
    done.wait()
    assert ram_guard.children(done.pid) == [] and ram_guard.descendants(done.pid) == []


def test_host_memory_has_a_peak_where_proc_has_no_high_water_mark(monkeypatch):
    """devicekit's host memory on a /proc without VmHWM (the TPU v5e machine's): the peak
    comes from its sampling thread, and a 300 MB array held for a moment shows in it."""
    import numpy as np

    sys.path.insert(0, str(GUARD.parent))
    try:
        import devicekit
    finally:
        sys.path.remove(str(GUARD.parent))
    real = devicekit._status
    monkeypatch.setattr(devicekit, "_status", lambda: {k: v for k, v in real().items() if k != "VmHWM"})
    devicekit.reset_host_peak()
    before = devicekit.host_memory()
    held = np.ones(300 * 2**20 // 8)
    time.sleep(0.3)
    del held
    after = devicekit.host_memory()
    assert after["peak"] - before["rss"] > 250 * 2**20, (before, after)
    assert after["rss"] - before["rss"] < 100 * 2**20, (before, after)


@pytest.mark.parametrize("floor, code", [(1e9, 3), (0.0, 0)])
def test_the_tripwire_ends_a_process_under_its_floor_with_every_stack(floor, code):
    """devicekit.ram_tripwire: under the floor (here above any machine's RAM) the process ends
    with status 3 and the stack of the thread that was working; above it, nothing happens."""
    script = (
        f"import sys, time; sys.path.insert(0, {str(GUARD.parent)!r}); import devicekit\n"
        "def working_here():\n"
        f"    devicekit.ram_tripwire({floor}, every=0.01)\n"
        "    time.sleep(1.0)\n"
        "working_here()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert ("ram tripwire:" in done.stderr and "working_here" in done.stderr) == (code == 3), done.stderr
