"""``zoo sample``: text from a language-model run."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from zoo.errors import ZooError
from zoo.ui import console, emit_json

if TYPE_CHECKING:
    from zoo.train.checkpoint import Checkpoint


def sample_text(ckpt: Checkpoint, prompt: str, length: int, temperature: float, seed: int) -> str:
    """Sample ``length`` characters after ``prompt`` from an LM checkpoint.

    The model always sees a fixed [1, max_len] window, so the step compiles once.
    """
    from zoo.api import apply_fn

    cfg, tokenizer = ckpt.model_config, ckpt.tokenizer
    if tokenizer is None or cfg.task != "lm":
        raise ZooError(f"{str(ckpt.path)!r} is not a language model checkpoint; `zoo sample` needs one")
    apply = apply_fn(cfg, ckpt.backend)
    window = cfg.max_len

    @jax.jit
    def next_token(params, tokens, position, key):
        logits = apply(params, tokens[None])[0, position]
        if temperature <= 0:
            return jnp.argmax(logits)
        return jax.random.categorical(key, logits / temperature)

    check_sample_args(prompt, length, temperature)
    ids = list(tokenizer.encode(prompt))
    key = jax.random.key(seed)
    for i in range(length):
        context = ids[-window:]
        tokens = np.zeros(window, np.int32)
        tokens[: len(context)] = context
        token = next_token(ckpt.params, tokens, len(context) - 1, jax.random.fold_in(key, i))
        ids.append(int(token))
    return tokenizer.decode(np.asarray(ids[len(tokenizer.encode(prompt)) :], np.int32))


def check_sample_args(prompt: str, length: int, temperature: float) -> None:
    """One-line errors for arguments that would sample nothing or garbage."""
    if not prompt:
        raise ZooError("--prompt is empty; give at least one character to continue from")
    if length < 1:
        raise ZooError(f"--length must be a positive number of characters, got {length}")
    if not math.isfinite(temperature) or temperature < 0:
        raise ZooError(f"--temperature must be a finite number >= 0 (0 samples greedily), got {temperature}")


def run_sample(args) -> int:
    from zoo.train import checkpoint

    check_sample_args(args.prompt, args.length, args.temperature)
    ckpt = checkpoint.load_checkpoint(args.checkpoint_dir)
    text = sample_text(ckpt, args.prompt, args.length, args.temperature, args.seed)
    if args.json:
        emit_json({"prompt": args.prompt, "sample": text})
    else:
        console.print(args.prompt + text, markup=False, highlight=False)
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("sample", help="sample text from a language-model run")
    p.add_argument("checkpoint_dir")
    p.add_argument("--prompt", required=True)
    p.add_argument("--length", type=int, default=200)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_sample)
