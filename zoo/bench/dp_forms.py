"""``zoo bench dp --forms``: ghost clipping's per-layer choice of norm form, and what it saved.

``formula`` lists, for every dense site of the model at the bench's shape (its microbatch, its
precision), the form :mod:`zoo.dp.ghost.forms` takes and the multiply-adds of each form, with
the totals of the chosen forms against all-Gram and all-materialised; it compiles nothing and
runs nothing, so it works at any size on any machine. ``measure`` also times both forms of each
distinct shape on this device (:mod:`zoo.dp.ghost.measure`), caches the faster, and the bench's
ghost rows then run with those choices.
"""

from __future__ import annotations

from zoo.dp.ghost import measure as ghost_measure
from zoo.dp.ghost import stages
from zoo.errors import choice_error

FORMS_MODES = ("formula", "measure")


def forms_table(mode: str | None, setup, params, data, progress=None) -> dict | None:
    """The choice table (:func:`zoo.dp.ghost.measure.choice_table`) of the bench's model on the
    first microbatch of ``data`` (the rule's batch); None without a ``mode``."""
    if mode is None:
        return None
    if mode not in FORMS_MODES:
        raise choice_error("--forms", mode, FORMS_MODES)
    if progress is not None:
        progress(f"dp bench: ghost norm forms ({mode})")
    engine = setup.engine
    k = setup.step_microbatch or setup.batch_size
    x, y = data["x"][:k], data["y"][:k]
    gp = stages.prepare(engine.cfg, x, engine.freeze, engine.stack, engine.precision)
    rows = ghost_measure.site_shapes(gp, params, x, y)
    timings = None
    if mode == "measure":
        timings = ghost_measure.measure([r["shape"] for r in rows], progress=progress)
    return ghost_measure.choice_table(rows, timings)


def print_forms(table: dict, title: str) -> None:
    from zoo.ui import print_table

    timed = table["timed"]

    def ms(row, form):
        return f"{row['ms'][form]:.2f}" if row["ms"] else "-"

    rows = []
    for r in table["rows"]:
        s = r["shape"]
        rows.append(
            (
                r["site"],
                str(r["layers"]),
                f"{s['batch']} x {s['seq']}",
                f"{s['d_in']} x {s['d_out']}",
                f"{r['gflop']['gram']:.1f}",
                f"{r['gflop']['materialise']:.1f}",
                ms(r, "gram"),
                ms(r, "materialise"),
                r["formula"],
                r["chosen"],
            )
        )
    for name, (gflop, total_ms) in table["totals"].items():
        label = {
            "chosen": "total, as chosen",
            "gram": "total, all Gram",
            "materialise": "total, all materialised",
        }
        rows.append(
            (label[name], "", "", "", f"{gflop:.1f}", "", f"{total_ms:.2f}" if timed else "-", "", "", "")
        )
    print_table(
        title,
        [
            "site",
            "layers",
            "B x T",
            "d_in x d_out",
            "GFLOP gram",
            "GFLOP mat.",
            "ms gram",
            "ms mat.",
            "formula",
            "chosen",
        ],
        rows,
    )


def add_forms_arguments(parser) -> None:
    parser.add_argument(
        "--forms",
        default=None,
        choices=FORMS_MODES,
        help="also print ghost clipping's norm form per dense site: by formula, or measured "
        "(both forms timed once on this device and cached; the ghost rows then use them)",
    )
    parser.add_argument(
        "--forms-only", action="store_true", help="print the --forms table alone (no step compiled or timed)"
    )
