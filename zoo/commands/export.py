"""``zoo export``: a LoRA run as a plain zoo checkpoint, adapters merged into the weights."""

from __future__ import annotations

from zoo.ui import emit_json, print_table


def run_export(args) -> int:
    from pathlib import Path

    from zoo.lora.export import export
    from zoo.train import checkpoint, runlock  # orbax: loaded only for this verb

    if args.adapter and args.format != "hf":
        from zoo.errors import ZooError

        raise ZooError("--adapter writes PEFT adapter files, a Hugging Face format: add --format hf")
    with runlock.hold(Path(args.out), beside=True):  # one export into a folder at a time
        _check_run(args.run_dir, checkpoint)
        if args.format == "hf":  # a Hugging Face checkpoint directory (zoo.train.hf)
            from zoo.train.hf import export_hf

            result = export_hf(args.run_dir, args.out, adapter=args.adapter, step=args.step)
        else:
            result = export(args.run_dir, args.out, merge=args.merge, step=args.step, checkpoints=checkpoint)
    if args.json:
        emit_json(result)
    else:
        print_table(f"export of {args.run_dir}", ["field", "value"], [(k, str(v)) for k, v in result.items()])
    return 0


def _check_run(run_dir: str, checkpoint) -> None:
    """A RUN with no checkpoint is refused naming both verbs that make one: an export is as
    often of an import (`zoo import`) as of a trained run (`zoo train`)."""
    from pathlib import Path

    from zoo.errors import ZooError

    path = Path(run_dir)
    if checkpoint.saved_steps(path) or (path / "config.json").is_file():
        return  # a run (its damaged steps are load_checkpoint's to report), or a Hugging Face folder
    what = "no run directory" if not path.exists() else "no checkpoint in"
    raise ZooError(
        f"{what} {run_dir!r}: zoo export reads a zoo run; make one with "
        f"`zoo import ORG/NAME --out {run_dir}` (a Hugging Face checkpoint) "
        f"or `zoo train RECIPE --out {run_dir}`"
    )


def add_parser(sub) -> None:
    p = sub.add_parser(
        "export", help="write a LoRA run as a plain checkpoint (--merge: adapters into the weights)"
    )
    p.add_argument("run_dir", metavar="RUN", help="a LoRA run directory")
    p.add_argument("--out", required=True, metavar="DIR", help="a new directory for the checkpoint")
    p.add_argument(
        "--merge", action="store_true", help="fold each adapter into its weight: W + (alpha/rank) B A"
    )
    p.add_argument("--step", type=int, help="the step to export (default: the newest intact one)")
    p.add_argument(
        "--format",
        default="zoo",
        choices=("zoo", "hf"),
        help="hf: config.json and safetensors for transformers (any run; a LoRA run merged, or --adapter)",
    )
    p.add_argument("--adapter", action="store_true", help="with --format hf: PEFT adapter files only")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_export)
