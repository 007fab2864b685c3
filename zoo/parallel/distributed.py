"""Many processes: ``jax.distributed.initialize`` from flags or environment variables.

Each process runs the same ``zoo train`` command with its own ``--process-id``; together they
see one global mesh over every process's devices. On CPU the processes talk through gloo.
Process 0 writes metrics and summaries and prints; orbax writes the checkpoint from all of
them.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from dataclasses import dataclass

import jax

from zoo.errors import ZooError

ENV = {  # JAX itself reads the first; zoo reads the other two where flags leave them out
    "coordinator": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


@dataclass(frozen=True)
class Cluster:
    coordinator: str
    num_processes: int
    process_id: int


def cluster_from(coordinator=None, num_processes=None, process_id=None, environ=os.environ) -> Cluster | None:
    """The cluster that flags (or, where they are missing, the environment) describe; None when
    neither names a coordinator."""
    coordinator = coordinator or environ.get(ENV["coordinator"])
    if not coordinator:
        if num_processes is not None or process_id is not None:
            raise ZooError("--num-processes and --process-id need --coordinator HOST:PORT")
        return None
    values = {"num_processes": num_processes, "process_id": process_id}
    for name, value in values.items():
        if value is None:
            text = environ.get(ENV[name])
            if text is None:
                raise ZooError(
                    f"--coordinator {coordinator} needs --{name.replace('_', '-')} (or {ENV[name]})"
                )
            try:
                value = int(text)
            except ValueError:
                raise ZooError(f"{ENV[name]}={text!r} is not an int") from None
        values[name] = value
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ZooError(f"--coordinator {coordinator!r}: write HOST:PORT, e.g. 127.0.0.1:7777")
    if values["num_processes"] < 1:
        raise ZooError(f"--num-processes must be >= 1, got {values['num_processes']}")
    if not 0 <= values["process_id"] < values["num_processes"]:
        raise ZooError(
            f"--process-id {values['process_id']} is outside 0..{values['num_processes'] - 1} "
            f"(--num-processes {values['num_processes']})"
        )
    return Cluster(coordinator, values["num_processes"], values["process_id"])


def initialize(cluster: Cluster | None, timeout_s: int = 120) -> None:
    """Join the cluster (before anything touches a device); a no-op without one."""
    if cluster is None:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU devices only
    drop_stdout_lines(gloo_chatter)
    jax.distributed.initialize(
        coordinator_address=cluster.coordinator,
        # The coordinator listens on the address it is named by, not on every interface.
        coordinator_bind_address=cluster.coordinator,
        num_processes=cluster.num_processes,
        process_id=cluster.process_id,
        initialization_timeout=timeout_s,
    )


def is_main_process() -> bool:
    """True in the process that writes files and prints (process 0, or the only one)."""
    return jax.process_index() == 0


# gloo's C++ prints "[Gloo] Rank R is connected to N peer ranks. Expected number of connected
# peer ranks is : N" to stdout on every rendezvous, 15-16 lines a process for a CPU run of two
# processes, between the run's own lines; no setting turns it off. Its threads write the pieces
# into one buffer, so a line may come mixed with another's pieces, or as a bare number.
GLOO_PIECES = (
    b"[Gloo] Rank ",
    b" is connected to ",
    b" peer ranks. ",
    b"Expected number of connected peer ranks is : ",
)


def gloo_chatter(line: bytes) -> bool:
    """Whether ``line`` holds nothing but gloo's pieces and numbers (a bare number included:
    nothing a run prints on stdout is one)."""
    rest = line
    for piece in GLOO_PIECES:
        rest = rest.replace(piece, b" ")
    words = rest.split()
    return bool(words or rest != line) and all(word.isdigit() for word in words)


def drop_stdout_lines(drop) -> None:
    """From here on, leave out the lines of file descriptor 1 (C++ code writes there directly)
    for which ``drop(line)`` is true: fd 1 becomes a pipe that a thread copies to the real
    stdout line by line; at exit the pipe is closed and drained."""
    sys.stdout.flush()
    real = os.dup(1)
    read, write = os.pipe()
    os.dup2(write, 1)
    os.close(write)

    def copy() -> None:
        with os.fdopen(read, "rb") as lines:
            for line in lines:
                if not drop(line):
                    os.write(real, line)

    thread = threading.Thread(target=copy, daemon=True, name="zoo-stdout-filter")
    thread.start()

    def drain() -> None:
        sys.stdout.flush()
        os.dup2(real, 1)  # the pipe's last writer closes: the thread reads to the end
        thread.join(timeout=5)

    atexit.register(drain)
