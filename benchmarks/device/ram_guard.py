"""A guard on the lent machine's host RAM, beside a prepared call's command (``tpu.sh`` starts it).

When a command runs the machine's RAM out, the machine is given back and nothing the command
wrote comes back, not even its log (a TPU v5e call of ``host_update.py`` at llama-1b's shapes,
2026-12-07). This guard reads ``MemAvailable`` every ``--every`` seconds and, once it falls under
``--floor-mib``, kills the process at or under ``--root`` with the most resident memory (SIGKILL: the
one that is running the RAM out, most often a Python step of the command) and says so in one
line. The command's script then goes on to its next step, and the call returns with its logs.
At the end (SIGTERM, or the root gone) it prints the least RAM it saw available and the most
any one process held.

    python3 benchmarks/device/ram_guard.py --root PID [--floor-mib 3072] [--every 1]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

PROC = Path("/proc")


def available_mib(meminfo: Path = PROC / "meminfo") -> float:
    """``MemAvailable`` of ``/proc/meminfo``, in MiB."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (every thread's), from ``/proc``."""
    out = []
    try:
        tasks = list((PROC / str(pid) / "task").iterdir())
    except OSError:  # gone since it was listed (a step's process that ended)
        return out
    for task in tasks:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (not ``pid`` itself)."""
    found, todo = [], children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children(child)
    return found


def rss_mib(pid: int) -> float:
    """``VmRSS`` of ``pid`` in MiB (0 when it is gone or has none)."""
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def command_of(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)[:160]


def hog(root: int) -> tuple[int, float] | None:
    """``(pid, MiB)`` of the process with the most resident memory: ``root`` or one under it."""
    sizes = [(pid, rss_mib(pid)) for pid in (root, *descendants(root))]
    return max(sizes, key=lambda s: s[1], default=None)


def say(text: str) -> None:
    print(f"ram_guard: {text}", flush=True)


def watch(root: int, floor_mib: float, every: float, meminfo: Path = PROC / "meminfo") -> int:
    """Guard ``root``'s processes until ``root`` is gone (or SIGTERM); the kills made."""
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    start, least, most, kills = time.monotonic(), float("inf"), (0.0, ""), 0
    while not stop and (PROC / str(root)).exists():
        free = available_mib(meminfo)
        least = min(least, free)
        top = hog(root)
        if top is not None and top[1] > most[0]:
            most = (top[1], command_of(top[0]))
        if free < floor_mib and top is not None and top[1] > 0:
            pid, size = top
            say(
                f"host RAM low ({free:,.0f} MiB available < {floor_mib:,.0f}) after "
                f"{time.monotonic() - start:.0f} s: killed pid {pid} ({size:,.0f} MiB resident): {command_of(pid)}"
            )
            try:
                os.kill(pid, signal.SIGKILL)
                kills += 1
            except ProcessLookupError:
                pass
        time.sleep(every)
    say(
        f"least host RAM available {least:,.0f} MiB; the most one process held {most[0]:,.0f} MiB ({most[1]})"
    )
    return kills


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=int, required=True, help="the command's process id")
    parser.add_argument("--floor-mib", type=float, default=3072.0)
    parser.add_argument("--every", type=float, default=1.0)
    parser.add_argument("--meminfo", type=Path, default=PROC / "meminfo", help="(tests) the file read")
    args = parser.parse_args(argv)
    watch(args.root, args.floor_mib, args.every, args.meminfo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
