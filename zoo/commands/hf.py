"""``zoo import``: a Hugging Face checkpoint (GPT-2, Llama family) as a zoo checkpoint."""

from __future__ import annotations

from zoo.ui import console, emit_json, print_table


def run_import(args) -> int:
    from pathlib import Path

    from zoo.train import runlock
    from zoo.train.hf import import_checkpoint

    with runlock.hold(Path(args.out), beside=True):  # one import into a folder at a time
        result = import_checkpoint(args.source, args.out, backend=args.backend, dtype=args.dtype)
    if args.json:
        emit_json(result)
    else:
        rows = [(k, str(v)) for k, v in result.items() if k != "finetune"]
        print_table(f"import of {args.source}", ["field", "value"], rows)
        # a command to copy: one line, never wrapped inside a table cell
        console.print(f"fine-tune: {result['finetune']}", markup=False, highlight=False, soft_wrap=True)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "import", help="write a Hugging Face checkpoint (GPT-2, Llama family) as a zoo checkpoint"
    )
    p.add_argument(
        "source",
        metavar="SRC",
        help="a directory with config.json and model.safetensors (or a sharded index), or ORG/NAME[@REV]",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="a new directory for the checkpoint")
    p.add_argument("--backend", default="nnx", choices=("nnx", "eqx"), help="the backend its runs use")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "float16"),
        help="the dtype of the imported weights (default float32; bfloat16 keeps a bf16 checkpoint's)",
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_import)
