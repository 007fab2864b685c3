"""The harness every benchmark shares (``zoo bench`` and the scripts under ``benchmarks/``): timed
compilation, compiled-memory figures, the timing loop in interleaved rounds, the median of
per-round ratios with its quartiles, a ``zoo train --json`` child run that becomes one JSON
line, and a labelled scatter plot. The train step the remat benchmarks compile is ``zoo
train``'s own, from its stages: :mod:`zoo.bench.step`."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import jax

from zoo.errors import ZooError


def compile_timed(jitted, *args) -> tuple[object, float, float]:
    """``(compiled, lower_s, compile_s)``: trace+lower, then XLA-compile, each timed."""
    t0 = time.perf_counter()
    lowered = jitted.lower(*args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    return compiled, t1 - t0, t2 - t1


def memory_stats(compiled) -> dict:
    """Byte counts from XLA's ``memory_analysis()`` (zeros where a backend gives none)."""
    stats = compiled.memory_analysis()
    fields = (
        "temp_size_in_bytes",
        "argument_size_in_bytes",
        "output_size_in_bytes",
        "alias_size_in_bytes",
        "generated_code_size_in_bytes",
        "host_temp_size_in_bytes",
    )
    return (
        {f: int(getattr(stats, f, 0) or 0) for f in fields} if stats is not None else dict.fromkeys(fields, 0)
    )


def time_in_rounds(
    steppers: dict[str, Callable[[int], object]],
    rounds: int,
    steps_per_round: int = 1,
    on_round: Callable[[int], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per step of every stepper, one figure per round, read from ``clock`` (the wall
    clock, or ``time.process_time`` for the CPU time of all threads).

    ``stepper(n)`` runs n steps and blocks until they are done. Each stepper takes one
    warm-up step first. The steppers then take turns within every round, so all of them see
    the same machine load, and each takes one untimed step before its timed ones: the
    stepper before it evicted the caches, and training repeats one step, so the steady state
    is what we time.
    """
    if rounds < 1 or steps_per_round < 1:
        raise ZooError(
            f"timing needs at least one round and one step per round; got rounds={rounds} "
            f"(--repeats or --rounds) and steps per round={steps_per_round} (--steps)"
        )
    for stepper in steppers.values():
        stepper(1)
    times: dict[str, list[float]] = {name: [] for name in steppers}
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        for name, stepper in steppers.items():
            stepper(1)
            tic = clock()
            stepper(steps_per_round)
            times[name].append((clock() - tic) / steps_per_round)
    return times


def state_stepper(step: Callable, run: dict, *args) -> Callable[[int], None]:
    """A stepper for :func:`time_in_rounds`: ``n`` calls of
    ``run["state"], run["out"] = step(run["state"], *args)``, then block."""

    def advance(n: int) -> None:
        for _ in range(n):
            run["state"], run["out"] = step(run["state"], *args)
        jax.block_until_ready((run["state"], run["out"]))

    return advance


def call_stepper(fn: Callable, *args) -> Callable[[int], None]:
    """A stepper for :func:`time_in_rounds`: ``n`` calls of ``fn(*args)``, then block on the
    last result (for programs without a state to carry)."""

    def advance(n: int) -> None:
        for _ in range(n):
            out = fn(*args)
        jax.block_until_ready(out)

    return advance


def positive_int(text: str) -> int:
    """argparse type for counts of rounds and steps: an int of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def int_list(text: str | None) -> list[int] | None:
    """``"1,2,8"`` -> ``[1, 2, 8]`` (None for an empty flag); anything else is a ZooError."""
    if not text:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ZooError(f"expected comma-separated ints, got {text!r}") from None


@dataclass(frozen=True)
class Spread:
    """The median and quartiles of per-round ratios."""

    median: float
    q1: float
    q3: float

    def rounded(self, digits: int = 3) -> dict[str, float]:
        return {
            "median": round(self.median, digits),
            "q1": round(self.q1, digits),
            "q3": round(self.q3, digits),
        }


def ratio_spread(times: Sequence[float], base: Sequence[float]) -> Spread:
    """Median and quartiles over rounds of ``times[r] / base[r]``: both figures of a round saw
    the same machine load, so this is steadier than a ratio of medians on a shared machine.

    The quartiles are the exclusive ones (``statistics.quantiles``' default, NumPy's
    ``weibull``: positions (n+1)/4 and 3(n+1)/4), kept inside the smallest and largest ratio;
    one round gives its ratio three times."""
    ratios = [t / b for t, b in zip(times, base, strict=True)]
    if not ratios:
        raise ValueError("ratio_spread needs at least one round; got none")
    if len(ratios) == 1:
        return Spread(ratios[0], ratios[0], ratios[0])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    lo, hi = min(ratios), max(ratios)
    return Spread(statistics.median(ratios), max(q1, lo), min(q3, hi))


def median_ratio(times: Sequence[float], base: Sequence[float]) -> float:
    """Median over rounds of ``times[r] / base[r]`` (:func:`ratio_spread`)."""
    return ratio_spread(times, base).median


# --- a `zoo train --json` run as a child process, one JSON line per run -------------------------


def train_command(recipe: str, out: str | os.PathLike, sets: Sequence[str] = ()) -> list[str]:
    """The child command of one run: ``zoo train RECIPE --json --no-progress --out OUT`` with a
    ``--set`` per entry of ``sets``, through this interpreter."""
    cmd = [sys.executable, "-m", "zoo.cli", "train", recipe, "--json", "--no-progress", "--out", str(out)]
    for s in sets:
        cmd += ["--set", s]
    return cmd


@dataclass(frozen=True)
class ChildRun:
    """What one child run left: its summary (the last line of its stdout, parsed; None when it
    failed), exit status, stderr, wall seconds, peak RSS and the command as a user types it."""

    summary: dict | None
    returncode: int
    stderr: str
    wall_s: float
    peak_rss_mib: float
    command: str


def run_child(cmd: Sequence[str], check: bool = True) -> ChildRun:
    """Run ``cmd`` (from :func:`train_command`), timed, with its peak RSS. With ``check``, a
    failed child stops the benchmark (``SystemExit`` with the command and its stderr's tail)."""
    tic = time.perf_counter()
    with tempfile.TemporaryFile("w+") as errors:  # a file, not a pipe: a long stderr cannot block
        child = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=errors, text=True)
        with child.stdout:
            out = child.stdout.read()
        _, status, usage = os.wait4(child.pid, 0)  # wait4, not wait: the child's own peak RSS
        child.returncode = code = os.waitstatus_to_exitcode(status)
        errors.seek(0)
        err = errors.read()
    wall = time.perf_counter() - tic
    if code and check:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{err[-2000:]}")
    lines = out.strip().splitlines()
    summary = json.loads(lines[-1]) if not code and lines else None
    shown = "zoo " + " ".join(cmd[3:]) if list(cmd[1:3]) == ["-m", "zoo.cli"] else " ".join(cmd)
    return ChildRun(summary, code, err, wall, usage.ru_maxrss / 1024, shown)


def append_row(path: str | os.PathLike, row: dict) -> None:
    """Print ``row`` as one JSON line and append it to ``path`` (its folder made if needed)."""
    line = json.dumps(row)
    print(line, flush=True)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(line + "\n")


def scatter_plot(
    path: str, points: Sequence[tuple[str, float, float]], *, xlabel: str, ylabel: str, title: str
) -> str:
    """Write a PNG scatter of ``(label, x, y)`` points, each labelled. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    colors = [ax.scatter([x], [y], s=40).get_facecolor()[0] for _, x, y in points]
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.set_xlim(left=0, right=max((p[1] for p in points), default=1) * 1.25)
    ax.set_ylim(bottom=0, top=max((p[2] for p in points), default=1) * 1.15)
    fig.tight_layout()
    points, colors = _merge_coincident(ax, points, colors)
    _place_labels(fig, ax, points, colors)
    fig.savefig(path)
    plt.close(fig)
    return path


# Label positions to try, in points from the marker: right, below, above and left of it, then
# the same directions further out (with a leader line back to the marker).
_DIRECTIONS = [
    (1, 0.3, "left"),
    (1, -1, "left"),
    (1, 1.4, "left"),
    (-1, 0.3, "right"),
    (-1, -1, "right"),
    (-1, 1.4, "right"),
    (0, 2.2, "center"),
    (0, -2, "center"),
]
_OFFSETS = [(dx * r, dy * r, align) for r in (6, 16, 28, 40, 55, 70) for dx, dy, align in _DIRECTIONS]
_MARKER_HALF_WIDTH_PX = 5


def _merge_coincident(ax, points, colors):
    """Points whose markers overlap on the figure (policies with the same temp memory and
    nearly the same time) get one label, their names joined, in grey where colours differ."""
    centres = ax.transData.transform([(x, y) for _, x, y in points])
    groups: list[list[int]] = []
    for i, (cx, cy) in enumerate(centres):
        for group in groups:
            gx, gy = centres[group[0]]
            if abs(cx - gx) <= 2 * _MARKER_HALF_WIDTH_PX and abs(cy - gy) <= 2 * _MARKER_HALF_WIDTH_PX:
                group.append(i)
                break
        else:
            groups.append([i])
    merged = [(", ".join(points[i][0] for i in g), points[g[0]][1], points[g[0]][2]) for g in groups]
    return merged, [colors[g[0]] if len(g) == 1 else "dimgray" for g in groups]


def _marker_boxes(ax, points):
    from matplotlib.transforms import Bbox

    h = _MARKER_HALF_WIDTH_PX
    centres = ax.transData.transform([(x, y) for _, x, y in points])
    return [Bbox([[cx - h, cy - h], [cx + h, cy + h]]) for cx, cy in centres]


def _place_labels(fig, ax, points, colors) -> None:
    """Annotate each point, in its marker's colour, at the first offset whose text box
    overlaps no earlier label and no other marker and stays inside the axes (policies often
    share a temp-memory figure, so markers crowd); labels moved off the default spot get a
    thin leader line."""
    from matplotlib.text import Text

    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    markers = _marker_boxes(ax, points)
    placed = []
    for k, ((label, x, y), color) in enumerate(zip(points, colors, strict=True)):
        obstacles = placed + markers[:k] + markers[k + 1 :]
        for i, (dx, dy, align) in enumerate([*_OFFSETS, _OFFSETS[0]]):
            leader = None if i in (0, len(_OFFSETS)) else {"arrowstyle": "-", "color": color, "lw": 0.6}
            note = ax.annotate(
                label,
                (x, y),
                textcoords="offset points",
                xytext=(dx, dy),
                ha=align,
                fontsize=8,
                color=color,
                arrowprops=leader,
            )
            note.update_positions(renderer)
            box = Text.get_window_extent(note, renderer)  # the text alone, not its leader line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if i == len(_OFFSETS) or (inside and not any(box.overlaps(o) for o in obstacles)):
                break  # the last try is the default spot again: every other one collided
            note.remove()
        placed.append(box)
