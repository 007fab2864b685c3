"""``zoo runs DIR``: a table of every run under DIR, finished or still going."""

from __future__ import annotations

from zoo.errors import ZooError
from zoo.ui import emit_json, print_table

COLUMNS = ("run", "recipe", "steps", "checkpoint", "last eval", "epsilon", "precision", "remat", "elapsed")


def run_row(run) -> dict:
    """What ``zoo runs`` shows of one :class:`~zoo.train.rundir.RunDir`. ``checkpoint``: its
    newest step whose files are all there at their manifest's sizes (checksums unread: `eval`,
    `sample`, `export` and `--resume` check them), None when none is; ``checkpoints_saved``:
    the steps saved, intact or not. ``elapsed_sec``: the run's clock at its last logged line
    (:data:`~zoo.train.rundir.ELAPSED`: the training loop's seconds, a resume's segments summed),
    not a wall time: building and restoring before each segment's first step, the steps a
    killed segment ran past its checkpoint, the final checkpoint write and the gaps between
    segments are not on it (``summary.json``'s ``wall_sec`` is the last segment's alone)."""
    from zoo.train import manifest
    from zoo.train.rundir import ELAPSED

    train = run.recipe.get("train", {})
    summary = run.summary or {}
    evals = [k for k in ("eval_accuracy", "eval_bits_per_char", "eval_loss") if run.last(k) is not None]
    return {
        "run": str(run.path),
        "recipe": run.recipe.get("name", summary.get("recipe", "?")),
        "steps_done": run.steps_done,
        "steps": run.planned_steps,
        "finished": run.summary is not None and run.steps_done == run.planned_steps,
        "checkpoint": manifest.latest_step(run.path, hashes=False),
        "checkpoints_saved": manifest.saved_steps(run.path),
        "last_eval": {k: run.last(k) for k in evals},
        "epsilon": run.last("epsilon"),
        "precision": summary.get("precision", train.get("precision", "float32")),
        "remat": summary.get("remat", train.get("remat", "none")),
        "elapsed_sec": run.last(ELAPSED),
    }


def _cells(row: dict) -> tuple[str, ...]:
    steps = f"{row['steps_done']}/{row['steps']}" if row["steps"] else str(row["steps_done"])
    if not row["finished"]:
        steps += " (not finished)"
    last_eval = ",".join(f"{k.removeprefix('eval_')}={v:.4g}" for k, v in row["last_eval"].items()) or "-"
    epsilon = "-" if row["epsilon"] is None else f"{row['epsilon']:.3g}"
    elapsed = "-" if row["elapsed_sec"] is None else _duration(row["elapsed_sec"])
    checkpoint = "damaged" if row["checkpoint"] is None else str(row["checkpoint"])
    checkpoint = checkpoint if row["checkpoints_saved"] else "-"
    cells = (row["run"], row["recipe"], steps, checkpoint, last_eval, epsilon, row["precision"], row["remat"])
    return (*cells, elapsed)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes // 60}h{minutes % 60:02d}m" if minutes >= 60 else f"{minutes}m{secs:02d}s"


def run_runs(args) -> int:
    from zoo.train.rundir import find_runs, open_run

    try:
        paths = find_runs(args.dir)
        if not paths:
            raise ValueError(f"{args.dir!r} holds no run (no metrics.jsonl at or under it)")
        runs = [open_run(path) for path in paths]  # a run in progress may have logged no step yet
    except ValueError as error:
        raise ZooError(str(error)) from None
    rows = [run_row(run) for run in runs]
    if args.json:
        emit_json(rows)
        return 0
    print_table(f"runs under {args.dir}", COLUMNS, [_cells(row) for row in rows])
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("runs", help="table of the runs under a folder: recipe, steps, last eval, epsilon")
    p.add_argument("dir", metavar="DIR", help="a folder of run directories, e.g. runs/")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON line")
    p.set_defaults(func=run_runs)
