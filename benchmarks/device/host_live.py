"""The bytes of every JAX array on the host device, summed each millisecond through three host
steps (``placement = "update-on-host"``) of a small llama, the host a second CPU device: what
the step's own arrays hold beyond the state, against the pipelined step's budget (RESULTS.md,
"The pipelined host step's host RAM"). A CPU script: on a chip the host's RSS says more.

    .venv/bin/python benchmarks/device/host_live.py exact   # or serial, delayed
"""

import os
import sys
import threading
import time

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
import host_update as hu  # noqa: E402
import jax  # noqa: E402
from devicekit import host_params  # noqa: E402

import zoo  # noqa: E402

SHAPE = "vocab_size=16384,d_model=512,num_layers=8,d_ff=2048,num_heads=8,num_kv_heads=4"


class Args:
    chunk_mib = 4
    inflight_mib = None


def host_live(host) -> int:
    """The bytes of every live JAX array on ``host`` alone."""
    return sum(a.nbytes for a in jax.live_arrays() if not a.is_deleted() and a.devices() == {host})


def main(mode: str) -> None:
    cfg = zoo.get_config("llama-xs", **hu.overrides(SHAPE))
    params = host_params(cfg)
    engine, state, frozen, batch = hu.build(cfg, hu.recipe_for("full", 2, 2, "bfloat16"), params, 32)
    step = hu.MODES[mode](engine, Args)
    mib = lambda n: n / 2**20  # noqa: E731
    print(
        f"state {mib(sum(x.nbytes for x in jax.tree.leaves(state))):.1f} MiB, bench params "
        f"{mib(sum(x.nbytes for x in jax.tree.leaves(params))):.1f} MiB; host {step.host}"
    )
    for i in range(3):
        peak, done = [0], threading.Event()

        def watch(peak=peak, done=done):
            while not done.is_set():
                peak[0] = max(peak[0], host_live(step.host))
                time.sleep(0.001)

        base = host_live(step.host)
        watcher = threading.Thread(target=watch)
        watcher.start()
        state, metrics = step(state, frozen, batch)
        jax.block_until_ready((state, metrics))
        done.set()
        watcher.join()
        limit, most = step.held if isinstance(step, hu.HostStep) else (0, 0)
        held = f"; budget {mib(limit):.1f} MiB, held at most {mib(most):.1f}" if limit else ""
        print(
            f"step {i}: host arrays {mib(base):.1f} MiB before, at most {mib(peak[0]):.1f} "
            f"(+{mib(peak[0] - base):.1f}){held}"
        )


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "exact"
    if mode not in hu.MODES:
        raise SystemExit(f"host_live: unknown mode {mode!r}; valid: {', '.join(hu.MODES)}")
    main(mode)
