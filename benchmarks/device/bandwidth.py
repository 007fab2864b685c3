"""Host <-> device bandwidth of ``jax.devices()[0]``: what ``[train] offload`` pays per step.

    .venv/bin/python benchmarks/device/bandwidth.py                 # 16 MiB .. 1 GiB
    .venv/bin/python benchmarks/device/bandwidth.py --sizes-mib 1 4 --rounds 3    # CPU, quick

Two ways for each direction and float32 size, median of ``--rounds`` after one warm-up:
  put       ``jax.device_put`` of a NumPy array to the device (host->device), and
            ``np.asarray`` of a device array (device->host);
  jit       a jitted copy between memory kinds, as the offloaded step makes them: an array in
            ``pinned_host`` memory to ``device`` memory (host->device) and back (device->host),
            ``sharding.with_memory_kind``; skipped (with the error) where the backend lacks
            ``pinned_host``.
  jit/16    the same bytes as 16 leaves copied by one jitted call (an offloaded state's many leaves).
One JSON line per row (GB/s = 1e9 bytes/s), then a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import SingleDeviceSharding


def _median_seconds(fn, rounds: int) -> float:
    jax.block_until_ready(fn())  # warm-up (and compile)
    times = []
    for _ in range(rounds):
        tic = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


def put_rows(nbytes: int, rounds: int) -> list[dict]:
    device = jax.devices()[0]
    host = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
    on_device = jax.device_put(host, device)
    to_device = _median_seconds(lambda: jax.device_put(host, device), rounds)
    to_host = _median_seconds(lambda: np.asarray(on_device + 0), rounds) - _median_seconds(
        lambda: on_device + 0, rounds
    )  # the copy back, less the add that makes a fresh array to copy
    return [_row("put", "host->device", nbytes, to_device), _row("put", "device->host", nbytes, to_host)]


SPLIT = 16  # leaves in the jit/16 rows: one copy each, which XLA may run side by side


def jit_rows(nbytes: int, rounds: int) -> list[dict]:
    device = jax.devices()[0]
    pinned = SingleDeviceSharding(device, memory_kind="pinned_host")
    on_device = SingleDeviceSharding(device, memory_kind="device")
    x = jnp.ones((nbytes // 4,), jnp.float32)
    try:
        x_host = jax.device_put(x, pinned)
        fetch = jax.jit(lambda a: jax.device_put(a, on_device))
        store = jax.jit(lambda a: jax.device_put(a, pinned))
        rows = [
            _row("jit", "host->device", nbytes, _median_seconds(lambda: fetch(x_host), rounds)),
            _row("jit", "device->host", nbytes, _median_seconds(lambda: store(x), rounds)),
        ]
        parts = list(x.reshape(SPLIT, -1))  # the same bytes as SPLIT leaves, as a state's are
        parts_host = [jax.device_put(a, pinned) for a in parts]
        rows += [
            _row(f"jit/{SPLIT}", "host->device", nbytes, _median_seconds(lambda: fetch(parts_host), rounds)),
            _row(f"jit/{SPLIT}", "device->host", nbytes, _median_seconds(lambda: store(parts), rounds)),
        ]
    except Exception as error:  # a backend without pinned_host
        rows = [{"how": "jit", "bytes": nbytes, "skipped": f"{type(error).__name__}: {error}"[:200]}]
    return rows


def _row(how: str, direction: str, nbytes: int, seconds: float) -> dict:
    return {
        "how": how,
        "direction": direction,
        "bytes": nbytes,
        "ms": round(seconds * 1e3, 3),
        "gb_per_s": round(nbytes / max(seconds, 1e-9) / 1e9, 2),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64, 256, 1024])
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    rows = []
    for mib in args.sizes_mib:
        for row in put_rows(mib << 20, args.rounds) + jit_rows(mib << 20, args.rounds):
            rows.append(row)
            print(json.dumps({"device": jax.devices()[0].device_kind, **row}), flush=True)
    print(f"{'how':<6} {'direction':<13} {'MiB':>6} {'ms':>9} {'GB/s':>8}")
    for r in rows:
        if "skipped" in r:
            print(f"{r['how']:<5} skipped: {r['skipped']}")
        else:
            print(
                f"{r['how']:<6} {r['direction']:<13} {r['bytes'] >> 20:>6} {r['ms']:>9.3f} {r['gb_per_s']:>8.2f}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
