"""What the scripts of ``benchmarks/device/`` share. A library only: nothing here runs on import,
and no script imports another script.

- the model config of a row (:func:`config`: a preset, or its kind's small config on a CPU);
- MFU (:func:`step_mfu`): zoo's one FLOP count and one peak lookup (``zoo.train.throughput``),
  so every script's figure of one step agrees;
- a compiled step's device footprint (:func:`footprint`) and whether an error is an
  out-of-memory one (:func:`out_of_memory`);
- params drawn on the host's cores and kept in host memory (:func:`host_params`);
- the median of timed steps after a warm-up (:func:`median_step_seconds`);
- the host's resident memory and its high-water mark since a reset (:func:`host_memory`,
  :func:`reset_host_peak`: Linux's ``/proc/self``, which counts XLA's buffers as tracemalloc
  cannot);
- progress lines on stderr with the seconds since the start (:func:`say`).

A script sets ``XLA_PYTHON_CLIENT_PREALLOCATE`` before it imports this module (which imports
JAX). The scripts sit beside it, so ``import devicekit`` finds it through ``sys.path[0]``, the
script's folder: no ``sys.path`` edits.
"""

from __future__ import annotations

import faulthandler
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np

import zoo
from zoo.models import canonical, registry
from zoo.parallel.placement import host_device
from zoo.remat import footprint as footprint_of
from zoo.remat import step_bytes
from zoo.train import throughput

OOM_WORDS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory", "exceeds")
T0 = time.time()


def say(text: str) -> None:
    """One progress line on stderr: ``[seconds since the start] text``."""
    print(f"[{time.time() - T0:7.1f} s] {text}", file=sys.stderr, flush=True)


def config(preset: str, small: bool):
    """The config of ``preset``, or with ``small`` its kind's small config (a CPU run)."""
    cfg = zoo.get_config(preset)
    return registry.get_kind(cfg.kind).small if small else cfg


def step_mfu(
    cfg, batch: int, seq: int, seconds: float, precision: str = "bfloat16", freeze=None
) -> float | None:
    """MFU of one training step of ``cfg`` on ``batch`` rows of ``seq`` tokens that took
    ``seconds``: ``zoo.train.throughput.step_flops`` over the time and the device's peak in
    ``precision`` (None where the peak is not known: a CPU). ``freeze``: the step's freeze plan
    (its engine's ``freeze``), so that frozen weights and LoRA's base count what their backward
    computes, as ``zoo train``'s own figure does: without it a frozen-layer step counts every
    weight's gradient (a frozen llama-1b read 93.7% on a TPU v5e, 2026-12-07)."""
    return throughput.mfu(throughput.step_flops(cfg, batch, seq, freeze), seconds, precision)


def footprint(compiled) -> int:
    """Device bytes of a compiled step: the larger of XLA's peak (where reported) and arguments +
    outputs - aliased + temp in device memory (``zoo.remat.step_bytes``: an offloaded state's
    host-memory arguments are not the chip's)."""
    peak = int(getattr(compiled.memory_analysis(), "peak_memory_in_bytes", 0) or 0)
    return max(peak, footprint_of(step_bytes(compiled, host_separate=jax.devices()[0].platform != "cpu")))


def out_of_memory(error: BaseException | str) -> bool:
    """Whether an error (or its text) says that something did not fit in memory."""
    return any(word in str(error) for word in OOM_WORDS)


def host_params(cfg, chunks: int = 16) -> dict:
    """Params of ``cfg`` in host memory: scaled normals for the weights (``w``), ones for norm
    scales, zeros for the biases, drawn by NumPy on the host's cores (each matrix in up to ``chunks``
    slices of its first axis, one generator each, on a thread pool: NumPy's generators let go of
    the GIL) and placed on the host device. A benchmark's weights need a shape and a scale, not
    the preset's own initialisation: ``canonical.init_params`` on the host's CPU takes minutes at
    3B, and drawing on the chip and copying out took 170 s for llama-1b's 4.9 GB on a TPU v5e
    (2026-12-07). The values depend on the shapes and ``chunks`` only, not on the thread count."""
    shapes = jax.eval_shape(lambda: canonical.init_params(cfg, 0))
    host = host_device() or jax.devices()[0]

    def draw(index, leaf, pool):
        out = np.empty(leaf.shape, np.float32)
        step = -(-leaf.shape[0] // chunks)

        def part(start):
            rng = np.random.default_rng([index, start])
            rng.standard_normal(out=out[start : start + step], dtype=np.float32)
            out[start : start + step] *= 0.02

        list(pool.map(part, range(0, leaf.shape[0], step)))
        return out

    def fill(path, leaf, index, pool):
        last = path[-1].key
        if last == "w":
            value = draw(index, leaf, pool)
        else:  # a layer stack's norm scales and biases have two axes too
            value = (np.ones if last == "scale" else np.zeros)(leaf.shape, np.float32)
        return jax.device_put(value.astype(leaf.dtype, copy=False), host)

    leaves = jax.tree_util.tree_leaves_with_path(shapes)
    with ThreadPoolExecutor(max_workers=min(chunks, os.cpu_count() or 1)) as pool:
        filled = [fill(path, leaf, i, pool) for i, (path, leaf) in enumerate(leaves)]
    return jax.tree.unflatten(jax.tree.structure(shapes), filled)


def median_step_seconds(stepper, steps: int) -> float:
    """The median of ``steps`` timed steps of ``stepper`` (``stepper(1)`` runs one and blocks),
    after one untimed warm-up."""
    stepper(1)
    times = []
    for _ in range(steps):
        tic = time.perf_counter()
        stepper(1)
        times.append(time.perf_counter() - tic)
    return statistics.median(times)


class _PeakWatch:
    """The process's resident bytes sampled every ``every`` seconds on a daemon thread, and the
    most seen since the last reset: the peak where ``/proc/self/status`` has no ``VmHWM`` or
    ``clear_refs`` does not reset it (the TPU v5e machine's ``/proc`` has neither: a call of
    2026-12-07 lost its rows to the missing key). It misses a spike shorter than ``every``."""

    def __init__(self, every: float = 0.02) -> None:
        self.every, self.peak, self._thread = every, 0, None
        self.hwm_resets = True  # VmHWM counts from the last reset (at first: the process's start)

    def reset(self, now: int) -> None:
        self.peak = now
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True, name="rss-watch")
            self._thread.start()

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, _status().get("VmRSS", 0))
            time.sleep(self.every)


def _status() -> dict[str, int]:
    """``/proc/self/status``'s ``VmRSS`` and ``VmHWM`` in bytes, those it has (none off Linux)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS:", "VmHWM:")))
    except OSError:
        return {}
    return {k: int(v.split()[0]) * 1024 for k, v in fields.items()}


_WATCH = _PeakWatch()


def host_memory() -> dict[str, int]:
    """The process's resident bytes now (``rss``) and at most since the last
    :func:`reset_host_peak` (``peak``): ``VmHWM`` where the kernel resets it, else the most a
    sampling thread saw (:class:`_PeakWatch`); empty where ``/proc/self/status`` has no ``VmRSS``."""
    now = _status()
    if "VmRSS" not in now:
        return {}
    peak = max(now["VmRSS"], _WATCH.peak)
    if "VmHWM" in now and _WATCH.hwm_resets:
        peak = now["VmHWM"]
    return {"rss": now["VmRSS"], "peak": peak}


def _where() -> str:
    """Each thread's innermost frame in zoo's or the scripts' code, one line: ``name file:line``."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        while frame is not None and not any(k in frame.f_code.co_filename for k in ("/zoo/", "/benchmarks/")):
            frame = frame.f_back
        if frame is not None and names.get(ident) != "ram-tripwire":
            where = f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}"
            out.append(f"{names.get(ident, ident)} {where}")
    return "; ".join(sorted(out))


def ram_tripwire(
    floor_gib: float, limit_gib: float | None = None, every: float = 0.01, trail_gib: float | None = None
) -> threading.Thread:
    """A daemon thread that ends the process (exit status 3) once the machine's ``MemAvailable``
    falls under ``floor_gib`` (or, with ``limit_gib``, the process's resident memory passes it),
    after printing both and every thread's Python stack (``faulthandler``): where the memory
    went. The lent machine is given back, with every log lost, when its RAM runs out faster than
    ``ram_guard.py`` (one read a second) can act; this reads every ``every`` seconds from
    inside the process. On the TPU v5e machine ``VmRSS`` read 30.0 GiB while ``MemAvailable``
    still had 23.2 of about 44 GiB (2026-12-07): its RSS counts more than the RAM the process
    takes, so the floor is the sure test there. ``trail_gib``: a line each time ``MemAvailable``
    has fallen (or risen) that much since the last one, with the seconds since the start and
    where each thread is in zoo's or the scripts' code (:func:`_where`): the timeline of the
    fall that the stacks end."""

    from ram_guard import available_mib  # the guard's own reading of /proc/meminfo

    def available_gib() -> float:
        try:
            return available_mib() / 1024
        except (OSError, RuntimeError):  # no /proc/meminfo, or no MemAvailable in it
            return float("inf")

    start, last = time.perf_counter(), [available_gib()]

    def watch() -> None:
        while True:
            rss, free = _status().get("VmRSS", 0) / 2**30, available_gib()
            if trail_gib is not None and abs(free - last[0]) >= trail_gib:
                last[0] = free
                print(
                    f"ram trail: {time.perf_counter() - start:7.2f} s, {free:.2f} GiB available; {_where()}",
                    file=sys.stderr,
                    flush=True,
                )
            if free < floor_gib or (limit_gib is not None and rss > limit_gib):
                print(
                    f"ram tripwire: host RSS {rss:.2f} GiB (limit {limit_gib}), {free:.2f} GiB available"
                    f" (floor {floor_gib}); every thread's stack:",
                    file=sys.stderr,
                    flush=True,
                )
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                sys.stderr.flush()
                os._exit(3)
            time.sleep(every)

    thread = threading.Thread(target=watch, daemon=True, name="ram-tripwire")
    thread.start()
    return thread


def reset_host_peak() -> None:
    """Start :func:`host_memory`'s ``peak`` again from the resident bytes now: Linux's
    ``clear_refs`` where it takes, and the sampling thread's maximum in any case."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        _WATCH.hwm_resets = True
    except OSError:
        _WATCH.hwm_resets = False
    _WATCH.reset(_status().get("VmRSS", 0))
