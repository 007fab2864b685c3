"""``zoo sample``: text from a language-model run."""

from __future__ import annotations

import math
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ZooError
from zoo.ui import emit_json

if TYPE_CHECKING:
    from zoo.train.checkpoint import Checkpoint


MAX_LENGTH = 100_000  # characters one `zoo sample` generates (one model call each)


def generate(ckpt: Checkpoint, prompt: str, length: int, temperature: float, seed: int) -> Iterator[str]:
    """The ``length`` characters after ``prompt`` from an LM checkpoint, one at a time, as they
    are sampled. Bad arguments and a checkpoint that is not a language model fail here, before
    the first character.

    The model always sees a fixed [1, max_len] window (the last ``max_len`` characters), so the
    step compiles once.
    """
    from zoo.api import apply_fn

    cfg, tokenizer = ckpt.model_config, ckpt.tokenizer
    if cfg.task == "lm" and tokenizer is None:
        raise ZooError(
            f"{str(ckpt.path)!r} is a language model without a tokenizer (imported from a folder "
            "with no tokenizer.json); `zoo sample` needs one: import again from a folder that has it"
        )
    if tokenizer is None or cfg.task != "lm":
        raise ZooError(f"{str(ckpt.path)!r} is not a language model checkpoint; `zoo sample` needs one")
    check_sample_args(prompt, length, temperature)
    apply = apply_fn(cfg, ckpt.backend)

    @jax.jit
    def next_token(params, tokens, position, key):
        logits = apply(params, tokens[None])[0, position]
        if temperature <= 0:
            return jnp.argmax(logits)
        return jax.random.categorical(key, logits / temperature)

    def characters() -> Iterator[str]:
        ids, window = list(tokenizer.encode(prompt)), cfg.max_len
        key = jax.random.key(seed)
        for i in range(length):
            context = ids[-window:]
            tokens = np.zeros(window, np.int32)
            tokens[: len(context)] = context
            token = int(next_token(ckpt.params, tokens, len(context) - 1, jax.random.fold_in(key, i)))
            ids.append(token)
            yield tokenizer.decode(np.asarray([token], np.int32))

    return characters()


def sample_text(ckpt: Checkpoint, prompt: str, length: int, temperature: float, seed: int) -> str:
    """The ``length`` characters after ``prompt`` (:func:`generate`, joined)."""
    return "".join(generate(ckpt, prompt, length, temperature, seed))


def unknown_characters(tokenizer, text: str) -> list[str]:
    """The distinct characters of ``text`` that ``tokenizer`` does not know (they encode to
    ``<unk>``), in order of first appearance."""
    return [c for c in dict.fromkeys(text) if tokenizer.decode(tokenizer.encode(c)) != c]


def check_sample_args(prompt: str, length: int, temperature: float) -> None:
    """One-line errors for arguments that would sample nothing, garbage, or for hours."""
    if not prompt:
        raise ZooError("--prompt is empty; give at least one character to continue from")
    if length < 1:
        raise ZooError(f"--length must be a positive number of characters, got {length}")
    if length > MAX_LENGTH:
        raise ZooError(
            f"--length {length} is over zoo sample's limit of {MAX_LENGTH:,} characters "
            "(one model call each); continue a long text with several calls, each --prompt "
            "ending where the last sample ended"
        )
    if not math.isfinite(temperature) or temperature < 0:
        raise ZooError(f"--temperature must be a finite number >= 0 (0 samples greedily), got {temperature}")


def run_sample(args) -> int:
    from zoo.train import checkpoint

    check_sample_args(args.prompt, args.length, args.temperature)
    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    pieces = generate(ckpt, args.prompt, args.length, args.temperature, args.seed)
    unknown = unknown_characters(ckpt.tokenizer, args.prompt)
    if unknown:
        warnings.warn(
            f"the prompt has {len(unknown)} character(s) outside the model's vocabulary: "
            f"{', '.join(map(repr, unknown))}; the model reads each as <unk>",
            stacklevel=1,
        )
    window, prompt_len = ckpt.model_config.max_len, len(ckpt.tokenizer.encode(args.prompt))
    if prompt_len > window:
        warnings.warn(
            f"the prompt is {prompt_len:,} tokens and the model's context {window:,}: it sees only "
            f"the prompt's last {window:,} tokens",
            stacklevel=1,
        )
    if args.json:
        emit_json({"prompt": args.prompt, "sample": "".join(pieces)})
        return 0
    # Plain text as it is sampled: no wrapping, no markup, nothing held back until the end.
    out = sys.stdout
    out.write(args.prompt)
    out.flush()
    try:
        for piece in pieces:
            out.write(_printable(piece))
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
    p.add_argument("--length", type=int, default=200, help=f"characters to sample (at most {MAX_LENGTH:,})")
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_sample)
