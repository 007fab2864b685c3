"""Helpers shared by the ``zoo bench`` benchmarks: a jitted train step, timed compilation,
compiled-memory figures, step timing and a labelled scatter plot."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import jax
import optax

from zoo.api import apply_fn
from zoo.configs import ModelConfig
from zoo.train.losses import per_example_loss


def train_step(cfg: ModelConfig, backend: str, remat="none",
               optimizer: optax.GradientTransformation | None = None):
    """``(step, optimizer)``: a jitted AdamW step on canonical params, params and optimizer
    state donated. ``step(params, opt_state, x, y) -> (params, opt_state, loss)``, where the
    loss is the mean cross-entropy of ``zoo.apply_fn(cfg, backend)`` under ``remat``."""
    apply = apply_fn(cfg, backend)
    optimizer = optimizer or optax.adamw(1e-3)

    def step(params, opt_state, x, y):
        def loss_fn(p):
            return per_example_loss(apply(p, x, remat), y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(step, donate_argnums=(0, 1)), optimizer


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
    fields = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes",
              "alias_size_in_bytes", "generated_code_size_in_bytes", "host_temp_size_in_bytes")
    return {f: int(getattr(stats, f, 0) or 0) for f in fields} if stats is not None else \
        dict.fromkeys(fields, 0)


def median_ms(run: Callable[[], object], repeats: int, warmup: int = 1) -> float:
    """Median wall time of ``run()`` in milliseconds; ``run`` must block until done."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def scatter_plot(path: str, points: Sequence[tuple[str, float, float]], *, xlabel: str,
                 ylabel: str, title: str) -> str:
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
    _place_labels(fig, ax, points, colors)
    fig.savefig(path)
    plt.close(fig)
    return path


# Label positions to try, in points from the marker: right, below, above, then to the left.
_OFFSETS = [(6, 4, "left"), (6, -12, "left"), (6, 14, "left"), (6, -24, "left"),
            (-6, 4, "right"), (-6, -12, "right"), (6, 26, "left"), (-6, 16, "right")]


def _place_labels(fig, ax, points, colors) -> None:
    """Annotate each point, in its marker's colour, at the first offset whose text box
    overlaps no earlier label (policies often share a temp-memory figure, so markers
    coincide); labels moved off the default spot get a thin leader line."""
    renderer = fig.canvas.get_renderer()
    placed = []
    for (label, x, y), color in zip(points, colors):
        for i, (dx, dy, align) in enumerate(_OFFSETS):
            leader = None if i == 0 else {"arrowstyle": "-", "color": color, "lw": 0.6}
            note = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy),
                               ha=align, fontsize=8, color=color, arrowprops=leader)
            box = note.get_window_extent(renderer)
            if not any(box.overlaps(other) for other in placed):
                break
            note.remove()
        else:
            note = ax.annotate(label, (x, y), textcoords="offset points", xytext=(6, 4),
                               fontsize=8, color=color)
            box = note.get_window_extent(renderer)
        placed.append(box)
