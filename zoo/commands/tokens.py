"""``zoo tokenize SRC --out DIR --vocabulary V``: write a token store, streamed in bounded memory."""

from __future__ import annotations

from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from zoo.data.table import document_forms
from zoo.data.tokens.documents import SPLITS
from zoo.data.vocabulary import FORMS
from zoo.ui import emit_json, err_console


def _progress_bar(show: bool) -> Progress:
    return Progress(
        TextColumn("tokenize"),
        BarColumn(),
        TextColumn("{task.fields[read]}"),
        TextColumn("{task.fields[tokens]} tokens"),
        TextColumn("{task.fields[rate]} tokens/s"),
        TimeElapsedColumn(),
        console=err_console,
        disable=not show,
        transient=False,
    )


def _read(unit: str, done: int, total: int | None) -> str:
    if unit == "bytes":  # in kB below 1 MB: a 45 kB file is not "0.0/0.0 MB"
        scale, name = (1e6, "MB") if max(done, total or 0) >= 1e6 else (1e3, "kB")
        shown = f"{done / scale:,.1f}" + (f"/{total / scale:,.1f}" if total else "")
        return f"{shown} {name}"
    return f"{done:,}" + (f"/{total:,}" if total else "") + " rows"


def run_tokenize(args) -> int:
    from zoo.data.tokens.build import balance_notice, check_text_vocabulary, tokenize

    check_text_vocabulary(args.vocabulary)  # a bad form is refused before anything is read
    # The bar starts with the first progress report: a vocabulary or source that cannot be read
    # is refused before it, in one line with no empty bar above it.
    progress, bar = _progress_bar(args.progress), None

    def show(p) -> None:
        nonlocal bar
        if bar is None:
            progress.start()
            bar = progress.add_task("tokenize", total=None, read="-", tokens="0", rate="-")
        rate = p.tokens / p.seconds if p.seconds else 0.0
        progress.update(
            bar,
            completed=p.done,
            total=p.total,
            read=_read(p.unit, p.done, p.total),
            tokens=f"{p.tokens:,}",
            rate=f"{rate:,.0f}",
        )

    try:
        meta = tokenize(
            args.source,
            args.out,
            args.vocabulary,
            eval_fraction=args.eval_fraction,
            split=args.split,
            text_column=args.text_column,
            on_progress=show,
        )
    finally:
        if bar is not None:
            progress.stop()
    splits = meta["splits"]
    line = (
        f"wrote {args.out}: {splits['train']['tokens']:,} train tokens in {splits['train']['documents']:,} "
        f"documents, {splits['eval']['tokens']:,} eval tokens in {splits['eval']['documents']:,} "
        f"({meta['dtype']}, {meta['vocab_size']:,} ids); train on it with --dataset tokens:{args.out}"
    )
    err_console.print(line, markup=False, highlight=False, soft_wrap=True)
    notice = balance_notice(meta)
    if notice:
        err_console.print(notice, markup=False, highlight=False, soft_wrap=True)
    if args.json:
        emit_json({"out": str(args.out), **meta})
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "tokenize",
        help="write a token store (tokens:DIR) from a text source, streamed in bounded memory",
        description=(
            "Tokenize SRC once into a token store that training reads by index (data.dataset = "
            "tokens:DIR). The store appears at --out only when complete."
        ),
    )
    p.add_argument(
        "source", metavar="SRC", help=f"the text to tokenize: {', '.join(f.usage for f in document_forms())}"
    )
    p.add_argument("--out", required=True, help="the store's directory (must not exist, or be empty)")
    p.add_argument(
        "--vocabulary",
        required=True,
        help=f"a declared vocabulary: {', '.join(f for f in FORMS if f != 'ids:N')} (never fitted on the text)",
    )
    p.add_argument(
        "--eval-fraction",
        type=float,
        default=0.1,
        help="the share held out as the eval split (default 0.1), by the --split rule",
    )
    p.add_argument(
        "--split",
        choices=SPLITS,
        default="auto",
        help="documents: every 1/F-th document whole, the first included; tail: the last F of each "
        "document's ids; auto (default): tail when SRC names fewer than 1/F documents, else documents",
    )
    p.add_argument("--text-column", default="text", help="parquet: and hf: sources: the column of text")
    p.add_argument("--json", action="store_true", help="print store.json as a last JSON line")
    p.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    p.set_defaults(func=run_tokenize)
