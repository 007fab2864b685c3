"""Running one command as several ``jax.distributed`` processes on this machine, bounded in
time: ``zoo train ... --coordinator 127.0.0.1:PORT --num-processes N --process-id I``."""

from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(
    command: list[str], count: int, env: dict, timeout: float = 180
) -> list[tuple[int, str, str]]:
    """``(returncode, stdout, stderr)`` of ``command`` run as ``count`` processes of one
    cluster; every process is killed after ``timeout`` seconds."""
    cluster = ["--coordinator", f"127.0.0.1:{free_port()}", "--num-processes", str(count)]
    procs = [
        subprocess.Popen(
            [*command, *cluster, "--process-id", str(i)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs, strict=True)]
