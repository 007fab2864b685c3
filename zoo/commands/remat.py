"""``zoo residuals``, ``zoo remat-policies`` and ``zoo bench`` (with ``zoo bench remat``)."""

from __future__ import annotations

from zoo.bench.common import positive_int
from zoo.configs import add_model_flags, add_precision_flag, model_flag_overrides
from zoo.remat import POLICIES, get_policy
from zoo.ui import console, emit_json, human_bytes, print_table


def _shape(shape) -> str:
    return "[" + ",".join(str(d) for d in shape) + "]"


def run_residuals(args) -> int:
    from zoo.residuals import residual_report

    get_policy(args.remat)  # unknown names fail here, listing the valid ones
    overrides = model_flag_overrides(args) | ({"num_layers": args.layers} if args.layers is not None else {})
    report = residual_report(
        args.model,
        args.remat,
        backend=args.backend,
        batch=args.batch,
        seq=args.seq,
        precision=args.precision,
        **overrides,
    )
    if args.json:
        emit_json(report)
        return 0
    rows = report["per_block"] if args.per_block else report["residuals"]
    shown = [r for r in rows if r["kind"] in ("activation", "constant") or args.all]
    hidden = [r for r in rows if r not in shown]
    seq = f", seq {report['seq']}" if report["seq"] else ""
    groups = f", {report['groups']} groups" if report["groups"] else ""
    if report["levels"] and not report["groups"]:
        groups = f", levels {'x'.join(map(str, report['levels']))}"
    view = "one block" if args.per_block else "whole model"
    print_table(
        f"residuals of {report['model']} under '{report['policy']}' ({view}; {report['backend']}, "
        f"{report['precision']}, "
        f"L={report['num_layers']}{groups}, batch {report['batch']}{seq})",
        ["name", "shape", "dtype", "bytes", "memory kind", "count", "scope"],
        [
            (
                r["name"] + ("" if r["kind"] == "activation" else f" ({r['kind']})"),
                _shape(r["shape"]),
                r["dtype"],
                human_bytes(r["bytes"]),
                r["memory_kind"],
                r["count"],
                r["scope"],
            )
            for r in shown
        ],
    )
    if hidden:
        console.print(
            f"{len(hidden)} parameter/input residuals ({human_bytes(sum(r['bytes'] for r in hidden))})"
            " not shown and not counted: they are live for the whole step anyway "
            "(--all shows them).",
            highlight=False,
        )
    if args.per_block:
        acts = [r for r in rows if r["kind"] == "activation"]
        dev = sum(r["bytes"] for r in acts if r["memory_kind"] == "device")
        console.print(
            f"one block: [bold]{human_bytes(dev)}[/] on device, "
            f"[bold]{human_bytes(sum(r['bytes'] for r in acts) - dev)}[/] on pinned_host "
            "(the scan keeps this once per layer)",
            highlight=False,
        )
    console.print(
        f"whole model, activation residuals: [bold]{human_bytes(report['total_device_bytes'])}[/] on device "
        f"({report['total_device_bytes']:,} B), [bold]{human_bytes(report['total_host_bytes'])}[/] "
        f"on pinned_host ({report['total_host_bytes']:,} B)",
        highlight=False,
    )
    return 0


def run_policies(args) -> int:
    rows = [{"name": p.name, "description": p.description} for p in POLICIES.values()]
    rows.append(
        {
            "name": "custom:NAME=device|offload|remat,...",
            "description": "per-name placement; names not listed are recomputed",
        }
    )
    rows.append(
        {
            "name": "auto",
            "description": "zoo train only: compile every policy (and on an accelerator every "
            "[train] offload setting) for the run's shapes, time those whose step fits --memory-budget B "
            "(default on an accelerator: its bytes_limit less 5%) and train with the fastest; choice "
            "cached; zoo bench remat --budget B shows the same chooser's table",
        }
    )
    if args.json:
        emit_json(rows)
        return 0
    print_table(
        "remat policies (zoo.remat)", ["name", "description"], [(r["name"], r["description"]) for r in rows]
    )
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "residuals",
        help="what a remat policy keeps for the backward pass",
        description="List the residuals (values saved for the backward pass) of a "
        "model's loss under a remat policy, by activation name.",
    )
    p.add_argument("model", help="model preset, e.g. transformer-s")
    p.add_argument(
        "--remat",
        required=True,
        metavar="POLICY",
        help="remat policy (see zoo remat-policies) or custom:NAME=...",
    )
    p.add_argument("--backend", default="nnx", choices=["nnx", "eqx"])
    p.add_argument("--batch", type=positive_int, default=8)
    p.add_argument("--seq", type=positive_int, default=None, help="sequence length (default: max_len)")
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="override num_layers (the model refuses a count it cannot take)",
    )
    add_model_flags(p)
    add_precision_flag(p, "the step's precision policy: bfloat16 computes (and saves) in bf16")
    p.add_argument("--per-block", action="store_true", help="show one scanned block only")
    p.add_argument("--all", action="store_true", help="also list parameter residuals")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run_residuals)

    p = sub.add_parser("remat-policies", help="list the named remat policies")
    p.add_argument("--json", action="store_true", help="print a JSON list")
    p.set_defaults(func=run_policies)
