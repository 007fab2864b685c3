"""``zoo plot RUN [RUN...] --out FILE.png``: the curves of runs on shared axes.

Loss (solid) and eval loss (dashed) against steps or the run's wall time, one colour per run,
and below them epsilon against the same axis when any run is DP. Runs of different lengths,
resumed runs (each step once: the last record of a step wins) and runs still in progress are
drawn from what their ``metrics.jsonl`` holds now.
"""

from __future__ import annotations

from pathlib import Path

from zoo.errors import ZooError

X_AXES = {"step": ("step", "step"), "time": ("elapsed_sec", "seconds in the training loop (elapsed_sec)")}


def run_labels(paths: list[Path]) -> list[str]:
    """A legend label per run: the last folders of its path, as few as tell it from the other
    runs (``a/run`` and ``b/run``, not ``run`` twice); a run given twice gets `` (2)``."""
    parts = [Path(p).absolute().parts[1:] or ("/",) for p in paths]
    labels, seen = [], {}
    for q in parts:
        others = [o for o in parts if o != q]
        depth = next((d for d in range(1, len(q)) if all(o[-d:] != q[-d:] for o in others)), len(q))
        label = "/".join(q[-depth:])
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return labels


def plot_runs(runs, out: Path, x: str = "step") -> dict[tuple[str, str], tuple[list, list]]:
    """Draw ``runs`` (:class:`~zoo.train.rundir.RunDir`) into ``out``; returns the curves drawn,
    ``{(run path, metric): (xs, ys)}``, read back off the figure's lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    key, label = X_AXES[x]
    dp = any(run.is_dp for run in runs)
    fig, axes = plt.subplots(2 if dp else 1, 1, figsize=(8, 7 if dp else 4.5), sharex=True, squeeze=False)
    loss_ax = axes[0][0]
    for i, (run, name) in enumerate(zip(runs, run_labels([run.path for run in runs]), strict=True)):
        color = f"C{i % 10}"
        for metric, style in (("loss", "-"), ("eval_loss", "--")):
            xs, ys = run.series(metric, key)
            if xs:
                loss_ax.plot(
                    xs,
                    ys,
                    style,
                    color=color,
                    label=f"{name} {metric}",
                    marker="." if len(xs) < 3 else None,
                    gid=f"{run.path}\t{metric}",
                )
        if dp:
            xs, ys = run.series("epsilon", key)
            if xs:
                axes[1][0].plot(
                    xs, ys, "-o", color=color, markersize=3, label=name, gid=f"{run.path}\tepsilon"
                )
    loss_ax.set_ylabel("loss")
    loss_ax.set_title("loss (solid) and eval loss (dashed)")
    loss_ax.legend(fontsize="small")
    loss_ax.grid(alpha=0.3)
    if dp:
        eps_ax = axes[1][0]
        eps_ax.set_ylabel("epsilon spent")
        eps_ax.set_title("epsilon (DP runs; under DP the training loss is not released)")
        eps_ax.legend(fontsize="small")
        eps_ax.grid(alpha=0.3)
    axes[-1][0].set_xlabel(label)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    drawn = {
        tuple(line.get_gid().split("\t")): (list(line.get_xdata()), list(line.get_ydata()))
        for ax in fig.axes
        for line in ax.get_lines()
    }
    plt.close(fig)
    return drawn


def run_plot(args) -> int:
    from zoo.train.rundir import ELAPSED, load_run

    out = Path(args.out)
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ZooError(f"--out {args.out!r}: name a .png, .svg or .pdf file")
    try:
        runs = [load_run(path) for path in args.runs]
    except ValueError as error:
        raise ZooError(str(error)) from None
    if args.x == "time":
        untimed = [str(run.path) for run in runs if not run.series(ELAPSED)[0]]
        if untimed:
            raise ZooError(
                f"--x time: {', '.join(untimed)} logged no wall time ({ELAPSED}); plot with --x step"
            )
    try:  # an unwritable --out (a folder, a path under a file, /proc, a long name) is one line
        if out.is_dir():
            raise IsADirectoryError(21, "it is a directory")
        under = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
        if under is not None:
            raise NotADirectoryError(20, f"{str(under)!r} is a file, not a folder")
        out.parent.mkdir(parents=True, exist_ok=True)
        plot_runs(runs, out, args.x)
    except OSError as error:
        raise ZooError(
            f"--out {args.out!r}: cannot write the figure there ({error.strerror or error})"
        ) from None
    print(f"wrote {out}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("plot", help="plot the loss, eval loss and epsilon of runs on shared axes")
    p.add_argument("runs", nargs="+", metavar="RUN", help="run directories (finished or in progress)")
    p.add_argument("--out", required=True, metavar="FILE.png", help="the figure to write")
    p.add_argument("--x", choices=sorted(X_AXES), default="step", help="x axis: steps or the run's wall time")
    p.set_defaults(func=run_plot)
