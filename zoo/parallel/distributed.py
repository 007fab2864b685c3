"""Many processes: ``jax.distributed.initialize`` from flags or environment variables.

Each process runs the same ``zoo train`` command with its own ``--process-id``; together they
see one global mesh over every process's devices. On CPU the processes talk through gloo.
Process 0 writes metrics and summaries and prints; orbax writes the checkpoint from all of
them.
"""

from __future__ import annotations

import os
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
