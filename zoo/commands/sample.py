"""``zoo sample``: text from a language-model run, through :mod:`zoo.generate` (a key/value
cache, one prefill and one compiled decode loop)."""

from __future__ import annotations

import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from zoo.checks import require_int, require_number
from zoo.configs import MAX_SEED
from zoo.errors import ZooError
from zoo.generate.sampling import GREEDY_BELOW
from zoo.ui import emit_json

if TYPE_CHECKING:
    from zoo.train.checkpoint import Checkpoint


MAX_NEW_TOKENS = 100_000  # tokens one `zoo sample` asks for
DEFAULT_NEW_TOKENS = 200  # without --max-new-tokens, or fewer: what fits (prompt_ids)
MAX_SAMPLES = 256  # --num-samples: one batch
STREAM_EVERY = 8  # decode steps between two writes of streamed text


def prompt_ids(ckpt: Checkpoint, prompt: str, max_new_tokens: int | None) -> tuple[np.ndarray, int]:
    """``(ids, new)``: the prompt's token ids the model reads and the new tokens to ask for.

    ``max_new_tokens`` None is the default: :data:`DEFAULT_NEW_TOKENS`, or what fits beside the
    whole prompt in the model's positions when that is fewer (never under half the positions).
    A prompt longer than the positions minus ``new`` is read from its last tokens (the window
    `zoo sample` has always used); refused when ``max_new_tokens`` leaves no room for any."""
    from zoo.models import decode

    spec = decode.cache_spec(ckpt.model_config)
    limit = spec.limit(ckpt.model_config)
    ids = np.asarray(ckpt.tokenizer.encode(prompt), np.int32)
    new = max_new_tokens
    if new is None:
        new = max(min(DEFAULT_NEW_TOKENS, limit - len(ids)), min(DEFAULT_NEW_TOKENS, limit // 2))
    room = limit - new
    if room < 1:
        keep = (
            f"at most {limit - len(ids)} new tokens to keep the whole prompt ({len(ids)} tokens)"
            if len(ids) < limit
            else f"at most {limit - 1} new tokens (the prompt is then read from its last tokens)"
        )
        raise ZooError(
            f"--max-new-tokens {new} leaves no room for the prompt in the model's "
            f"{spec.limit_name}={limit}; ask for {keep}"
        )
    if len(ids) > room:
        warnings.warn(
            f"the prompt is {len(ids):,} tokens and the model's context {limit:,} ({spec.limit_name}) "
            f"leaves {room:,} beside {new:,} new tokens: it sees only the prompt's last "
            f"{room:,} tokens",
            stacklevel=2,
        )
    return ids[-room:], new


def generate(
    ckpt: Checkpoint,
    prompt: str,
    max_new_tokens: int | None,
    temperature: float,
    seed: int,
    *,
    top_k: int = 0,
    top_p: float = 1.0,
    num_samples: int = 1,
) -> Iterator[list[str]]:
    """Text after ``prompt`` from an LM checkpoint, ``num_samples`` samples in one batch, as it
    is generated: each item holds every sample's new text since the last. Stops at the
    checkpoint's EOS (:func:`zoo.generate.stops.checkpoint_eos`), which is not printed. Bad
    arguments and a checkpoint that is not a language model fail here, before the first token."""
    from zoo.generate import stream
    from zoo.generate.stops import checkpoint_eos

    cfg, tokenizer = ckpt.model_config, ckpt.tokenizer
    if cfg.task_type.tokenized and tokenizer is None:
        raise ZooError(
            f"{str(ckpt.path)!r} is a language model without a tokenizer (imported from a folder "
            "with no tokenizer.json); `zoo sample` needs one: import again from a folder that has it"
        )
    if tokenizer is None or not cfg.task_type.tokenized:
        raise ZooError(f"{str(ckpt.path)!r} is not a language model checkpoint; `zoo sample` needs one")
    check_sample_args(prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed)
    ids, max_new_tokens = prompt_ids(ckpt, prompt, max_new_tokens)
    eos = checkpoint_eos(ckpt)
    try:
        chunks = stream(
            ckpt,  # decoded under its recipe's precision (zoo.generate.Model.of)
            [ids] * num_samples,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_tokens=eos,
            every=STREAM_EVERY,
        )
    except ValueError as error:
        raise ZooError(str(error)) from None

    def pieces() -> Iterator[list[str]]:
        for new, _ in chunks:
            kept = [[t for t in row if t not in eos] for row in new]
            yield [tokenizer.decode(np.asarray(row, np.int32)) if row else "" for row in kept]

    return pieces()


def sample_text(
    ckpt: Checkpoint, prompt: str, max_new_tokens: int, temperature: float, seed: int, **kw
) -> list[str]:
    """Every sample's text after ``prompt`` (:func:`generate`, joined)."""
    parts = list(generate(ckpt, prompt, max_new_tokens, temperature, seed, **kw))
    return ["".join(p[i] for p in parts) for i in range(kw.get("num_samples", 1))]


def unknown_characters(tokenizer, text: str) -> list[str]:
    """The distinct characters of ``text`` that ``tokenizer`` does not know (they encode to
    ``<unk>``), in order of first appearance; none for a vocabulary of ids (``ids:N``)."""
    if not getattr(tokenizer, "has_text", True):  # the prompt is ids in decimal, checked by encode
        return []
    return [c for c in dict.fromkeys(text) if tokenizer.decode(tokenizer.encode(c)) != c]


def check_sample_args(
    prompt: str,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
    num_samples: int = 1,
    seed: int = 0,
) -> None:
    """One-line errors for arguments that would sample nothing, garbage, or for hours
    (``max_new_tokens`` None: the default, fitted to the model in :func:`prompt_ids`)."""
    if not prompt:
        raise ZooError("--prompt is empty; give at least one character to continue from")
    what = f"a whole number in [0, {MAX_SEED}] (32 bits)"
    require_int("--seed", seed, lo=0, hi=MAX_SEED, what=what, error=ZooError)
    if max_new_tokens is None:
        max_new_tokens = DEFAULT_NEW_TOKENS
    require_int("--max-new-tokens", max_new_tokens, lo=1, what="a positive number of tokens", error=ZooError)
    if max_new_tokens > MAX_NEW_TOKENS:
        raise ZooError(
            f"--max-new-tokens {max_new_tokens} is over zoo sample's limit of {MAX_NEW_TOKENS:,} tokens; "
            "continue a long text with several calls, each --prompt ending where the last sample ended"
        )
    what = f"a finite number >= 0 (0, or under {GREEDY_BELOW:g}, samples greedily)"
    require_number("--temperature", temperature, finite=True, lo=0.0, what=what, error=ZooError)
    require_int("--top-k", top_k, lo=0, what="a whole number >= 0 (0 keeps every token)", error=ZooError)
    what = "a number in (0, 1] (1 keeps every token)"
    require_number("--top-p", top_p, positive=True, hi=1.0, what=what, error=ZooError)
    what = f"a whole number in [1, {MAX_SAMPLES}] (one batch)"
    require_int("--num-samples", num_samples, lo=1, hi=MAX_SAMPLES, what=what, error=ZooError)


def _args(args) -> tuple:
    return (
        args.prompt,
        args.max_new_tokens,
        args.temperature,
        args.top_k,
        args.top_p,
        args.num_samples,
        args.seed,
    )


def run_sample(args) -> int:
    from zoo.train import checkpoint

    check_sample_args(*_args(args))
    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    pieces = generate(
        ckpt,
        args.prompt,
        args.max_new_tokens,
        args.temperature,
        args.seed,
        top_k=args.top_k,
        top_p=args.top_p,
        num_samples=args.num_samples,
    )
    unknown = unknown_characters(ckpt.tokenizer, args.prompt)
    if unknown:
        warnings.warn(
            f"the prompt has {len(unknown)} character(s) outside the model's vocabulary: "
            f"{', '.join(map(repr, unknown))}; the model reads each as <unk>",
            stacklevel=1,
        )
    if args.json or args.num_samples > 1:
        parts = list(pieces)
        samples = ["".join(p[i] for p in parts) for i in range(args.num_samples)]
        if args.json:
            emit_json({"prompt": args.prompt, "sample": samples[0], "samples": samples})
        else:
            sys.stdout.write(
                "\n".join(f"--- sample {i + 1}\n{args.prompt}{s}" for i, s in enumerate(samples))
            )
            sys.stdout.write("\n")
        return 0
    # Plain text as it is sampled: no wrapping, no markup, a few tokens at a time.
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    try:
        for piece in pieces:
            out.write(_printable(piece[0]))
            out.flush()
    finally:
        out.write("\n")
        out.flush()
    return 0


def _printable(text: str) -> str:
    """``text`` with control characters (but newlines and tabs) escaped: a sampled ESC or BEL
    would act on the terminal. ``--json`` keeps the text as sampled."""
    return "".join(c if c in "\n\t" or c.isprintable() else ascii(c)[1:-1] for c in text)


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="sample text from a language-model run")
    p.add_argument("checkpoint_dir")
    p.add_argument("--prompt", required=True)
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help=f"new tokens to generate (at most {MAX_NEW_TOKENS:,}; default {DEFAULT_NEW_TOKENS}, or what "
        "fits beside the prompt in the model's positions); a prompt longer than the model's "
        "positions minus these is read from its last tokens",
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.8,
        help=f"0 (or under {GREEDY_BELOW:g}) samples greedily (the argmax)",
    )
    p.add_argument("--top-k", type=int, default=0, help="draw from the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="draw from the smallest set of probability p")
    p.add_argument("--num-samples", type=int, default=1, help="samples of the prompt, in one batch")
    p.add_argument("--seed", type=int, default=0, help=f"in [0, {MAX_SEED}]")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_sample)
