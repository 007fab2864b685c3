"""Generation: prompts as token ids in, new token ids out, with a key/value cache.

:func:`generate` pads a batch of prompts of different lengths to one length bucket, fills each
layer's cache with one forward over them (the prefill) and draws the new tokens in one compiled
``lax.while_loop`` (:mod:`zoo.generate.loop`). Each row gives the tokens it gives alone. The
cache is the kind's (``zoo.models.decode``): any LM kind that registers one generates.
:func:`stream` yields the same tokens a few steps at a time, from the same two programs.

    from zoo.generate import Model, generate
    out = generate(Model(cfg, "nnx", params), [[1, 2, 3], [4, 5]], max_new_tokens=20, temperature=0)
    out.tokens[0], out.stopped[0]   # the new ids of the first prompt, and "eos" or "length"
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from zoo.checks import require_int
from zoo.configs import MAX_SEED
from zoo.generate import loop
from zoo.generate.sampling import Sampling
from zoo.models import decode
from zoo.precision import DEFAULT as DEFAULT_PRECISION
from zoo.precision import get_precision

__all__ = ["Generation", "Model", "Sampling", "check_request", "generate", "stream"]

MAX_STOPS = 8  # stop ids pass as a fixed-size array, so their number does not recompile


@dataclass(frozen=True)
class Model:
    """A model config, its backend, its canonical params and the precision policy it runs
    under (:mod:`zoo.precision`; a checkpoint has all four: the one it was trained with)."""

    config: object
    backend: str
    params: dict
    precision: str = DEFAULT_PRECISION

    @classmethod
    def of(cls, source) -> Model:
        """``source`` itself, or a :class:`zoo.train.checkpoint.Checkpoint`'s model under the
        precision of its recipe (``train.precision``)."""
        if isinstance(source, Model):
            return source
        precision = source.recipe.train.precision
        return cls(source.model_config, source.backend, source.params, precision)

    def in_compute(self) -> tuple[dict, str]:
        """``(params, cache dtype)`` as the model decodes under its policy: the params in the
        compute dtype (a bf16 run decodes with bf16 weights and activations) and a cache in it
        too (half the bytes under bf16). Norm statistics, the softmax and the logits stay
        float32, as in training (:mod:`zoo.models.ops`)."""
        policy = get_precision(self.precision)
        return policy.to_compute(self.params), policy.compute_dtype.name


@dataclass(frozen=True)
class Generation:
    """The new tokens of each prompt (a stop token, when one ended it, is the last), why each
    stopped (``"eos"``: a stop token; ``"length"``: ``max_new_tokens`` reached) and, when asked
    for, the logits [B, N, V] each new token was chosen from."""

    tokens: tuple[tuple[int, ...], ...]
    stopped: tuple[str, ...]
    logits: np.ndarray | None = None


def check_request(cfg, prompts, max_new_tokens: int) -> int:
    """Raise ValueError (one line) for a request the model cannot serve; returns its limit:
    empty prompts, ids outside the vocabulary, and a prompt plus ``max_new_tokens`` beyond the
    positions the model can attend to."""
    spec = decode.cache_spec(cfg)
    max_new_tokens = require_int("max_new_tokens", max_new_tokens, lo=1, what="a positive whole number")
    if not len(prompts):
        raise ValueError("no prompts: give at least one prompt of token ids")
    limit = spec.limit(cfg)
    for i, prompt in enumerate(prompts):
        ids = np.asarray(prompt)
        if ids.ndim != 1 or not ids.size or not np.issubdtype(ids.dtype, np.integer):
            raise ValueError(f"prompt {i} must be a non-empty sequence of int token ids, got {prompt!r:.60}")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"prompt {i} has ids outside the vocabulary [0, {cfg.vocab_size})")
        if ids.size + max_new_tokens > limit:
            raise ValueError(
                f"prompt {i} ({ids.size} tokens) + {max_new_tokens} new tokens = {ids.size + max_new_tokens} "
                f"positions, beyond the model's {spec.limit_name}={limit}; ask for at most "
                f"{max(limit - ids.size, 0)} new tokens or shorten the prompt"
            )
    return limit


def _stops(stop_tokens, vocab_size: int) -> np.ndarray:
    """The stop ids as the fixed-size array the decode loop takes. An id that is not a whole
    number in [0, 2**31) is refused; one past the vocabulary can never be drawn, so it is left
    out with a warning (a tokenizer's or an imported config's EOS may lie past a small model's
    vocabulary)."""
    what = f"a token id: a whole number in [0, {2**31 - 1}] (the model's vocabulary is [0, {vocab_size}))"
    ids = {require_int("stop token", t, lo=0, hi=2**31 - 1, what=what) for t in stop_tokens}
    outside = sorted(i for i in ids if i >= vocab_size)
    if outside:
        warnings.warn(
            f"stop token(s) {', '.join(map(str, outside))} lie outside the vocabulary [0, {vocab_size}): "
            "the model never draws them, so they stop nothing",
            stacklevel=3,
        )
    stops = sorted(ids - set(outside))
    if len(stops) > MAX_STOPS:
        raise ValueError(f"at most {MAX_STOPS} stop tokens, got {len(stops)}")
    return np.asarray(stops + [-1] * (MAX_STOPS - len(stops)), np.int32)


def _start(model: Model, prompts, max_new_tokens, seed, keep_logits):
    """The padded prompts through the prefill: ``(state, P)``."""
    lengths = np.asarray([len(p) for p in prompts], np.int32)
    width = loop.bucket(int(lengths.max()))
    padded = np.zeros((len(prompts), width), np.int32)
    for row, prompt in enumerate(prompts):
        padded[row, width - len(prompt) :] = np.asarray(prompt, np.int32)
    length = width + loop.bucket(max_new_tokens)
    new = loop.bucket(max_new_tokens)
    params, dtype = model.in_compute()
    state = loop.prefill(
        model.config,
        model.backend,
        params,
        padded,
        lengths,
        np.uint32(seed),
        length=length,
        new=new,
        keep_logits=keep_logits,
        dtype=dtype,
        lanes=decode.row_lanes(),
    )
    return params, state, width


def stream(
    source,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_tokens: Sequence[int] = (),
    every: int = 8,
    keep_logits: bool = False,
) -> Iterator[tuple[list[list[int]], loop.State]]:
    """:func:`generate`, ``every`` steps at a time: yields each row's tokens new since the last
    yield (none once it has stopped) and the loop state, valid until the next item (the decode
    loop takes its buffers over). The same two compiled programs: the decode loop is called
    with a step bound ``every`` further each time."""
    model = Model.of(source)
    sampling = Sampling(temperature, top_k, top_p)
    check_request(model.config, prompts, max_new_tokens)
    # NumPy integers are taken wherever Python ints are: the checks return plain ints
    max_new_tokens = require_int("max_new_tokens", max_new_tokens, lo=1)
    every = require_int("every", every, lo=1, what="a positive whole number of steps")
    stops = _stops(stop_tokens, model.config.vocab_size)
    seed = require_int("seed", seed, lo=0, hi=MAX_SEED, what=f"a whole number in [0, {MAX_SEED}] (32 bits)")
    params, state, width = _start(model, prompts, max_new_tokens, seed, keep_logits)
    shown = np.zeros(len(prompts), np.int64)
    step = 0
    while step < max_new_tokens:
        step = min(step + every, max_new_tokens)
        state = loop.decode_steps(
            model.config, model.backend, sampling, params, state, np.int32(step), stops, width=width
        )
        tokens, count = np.asarray(state.tokens), np.asarray(state.count)
        yield [tokens[r, shown[r] : count[r]].tolist() for r in range(len(prompts))], state
        shown = count
        if bool(np.asarray(state.done).all()):
            return


def generate(
    source,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    stop_tokens: Sequence[int] = (),
    keep_logits: bool = False,
) -> Generation:
    """New tokens after each of ``prompts`` (token ids; a batch of different lengths).

    Args:
      source: a :class:`Model` (config, backend, canonical params) or a checkpoint.
      prompts: one sequence of token ids per row.
      max_new_tokens: at most this many new tokens per prompt; prompt plus new tokens must fit
        the model's positions (``max_len``), or ValueError says by how much they do not.
      temperature: 0 is greedy (argmax), and so is any temperature below
        :data:`zoo.generate.sampling.GREEDY_BELOW` (1e-4); otherwise logits / temperature are
        sampled.
      top_k, top_p: draw from the ``top_k`` most likely tokens (0: all) and the smallest set
        whose probability reaches ``top_p`` (1: all).
      seed: the draws of row r are a function of (seed, r, step) alone; in [0, 2**32).
      stop_tokens: ids that end a row (EOS); kept as its last new token. Ids past the
        vocabulary are left out with a warning (they are never drawn).
      keep_logits: also return the logits each new token was chosen from.

    Returns:
      a :class:`Generation`.
    """
    chunks = stream(
        source,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop_tokens=stop_tokens,
        every=max_new_tokens,
        keep_logits=keep_logits,
    )
    state = list(chunks)[-1][1]  # every=max_new_tokens: one chunk
    tokens, count, done = (np.asarray(x) for x in (state.tokens, state.count, state.done))
    logits = np.asarray(state.seen)[:, :max_new_tokens] if keep_logits else None
    return Generation(
        tokens=tuple(tuple(tokens[r, : count[r]].tolist()) for r in range(len(prompts))),
        stopped=tuple("eos" if d else "length" for d in done),
        logits=logits,
    )
