"""The rows of ``zoo bench dp`` (:mod:`zoo.bench.dp`): a step builder per DP-SGD implementation, each given one :class:`Setup`.

zoo's own rows come from the clipping table (:data:`zoo.dp.clipping.CLIPPING`), read when the
bench runs: a clipping method registered there is a row here with nothing to add. Other
libraries' DP-SGD steps are rows registered by name (:func:`register_method`)."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import optax

from zoo import microbatch as microbatches
from zoo.api import example_batch, example_labels
from zoo.bench.common import memory_stats
from zoo.dp import CLIPPING, privatize
from zoo.dp.noise import DEFAULT_NOISE_PRNG, NOISE_PRNGS
from zoo.dp.plan import DPPlan, fixed_batch_plan
from zoo.errors import ZooError
from zoo.precision import FLOAT32, Precision
from zoo.train import stages
from zoo.train.engine import Engine, GradientSettings, make_engine
from zoo.train.state import TrainState

BASELINE = "non-private"
LR, MOMENTUM, CLIP, SIGMA = 0.1, 0.9, 1.0, 1.0
Step = Callable[[TrainState, dict, dict], tuple[TrainState, dict]]


@dataclass(frozen=True)
class Setup:
    """What every method builder gets: the non-private engine (its remat policy and precision)
    and the DP constants. ``microbatch_size`` is the k of the ``zoo microbatch`` row;
    ``step_microbatch`` (``--microbatch``), when set, makes every zoo row and the non-private
    row take the logical batch of ``batch_size`` in microbatches of that many examples."""

    engine: Engine  # dp=None; its optimizer is the shared SGD-with-momentum
    batch_size: int
    microbatch_size: int
    clip_norm: float = CLIP
    noise_multiplier: float = SIGMA
    step_microbatch: int | None = None

    def plan(self, **settings) -> DPPlan:
        """The DP plan of a fixed batch of ``batch_size`` with the bench's clip norm and noise
        multiplier; ``settings`` are other ``[dp]`` fields (``clipping``, ``microbatch_size``...)."""
        return fixed_batch_plan(
            self.batch_size, noise_multiplier=self.noise_multiplier, clip_norm=self.clip_norm, **settings
        )

    def dp_engine(self, microbatch_size: int | None) -> Engine:
        """The engine's DP step with vmap clipping (in chunks of ``microbatch_size`` if set)."""
        plan = self.plan(clipping="vmap", microbatch_size=microbatch_size)
        return dataclasses.replace(self.engine, dp=plan)

    def one_example_loss(self, trainable, frozen, x, y):
        """Loss of one example (no leading batch axis), as the engine's DP step defines it."""
        return self.engine.example_losses(trainable, frozen, x[None], y[None])[0][0]


def setup_for(cfg, backend: str, batch: int, microbatch: int, freeze: Sequence[str], seed: int, **options):
    """``(Setup, params)``: the model start and engine of the run stages
    (:func:`zoo.train.stages.config_start`, :func:`~zoo.train.engine.make_engine`) for a preset
    on the bench's synthetic batches, with the bench's SGD with momentum; ``options`` are
    :func:`setup_from`'s."""
    start = stages.config_start(cfg, seed=seed, patterns=tuple(freeze))
    return setup_from(start, backend, batch, microbatch, **options)


def setup_from(
    start: stages.Start,
    backend: str,
    batch: int,
    microbatch: int,
    *,
    remat: str = "none",
    precision: Precision = FLOAT32,
    step_microbatch: int | None = None,
):
    """:func:`setup_for` from a model start made elsewhere: a recipe's
    (:func:`zoo.train.stages.model_start`, its freeze plan included), under the ``remat`` policy
    and ``precision``; ``step_microbatch``: :class:`Setup`'s."""
    opt = optax.sgd(LR, momentum=MOMENTUM)
    engine = make_engine(start, GradientSettings(backend, opt, remat=remat, precision=precision))
    setup = Setup(
        engine=engine, batch_size=batch, microbatch_size=microbatch, step_microbatch=step_microbatch
    )
    return setup, start.params


def check_microbatch(k: int, batch: int, name: str = "--microbatch") -> int:
    """``k`` if it divides the batch; else a ZooError naming ``name``, ``k`` and the valid sizes
    (:func:`zoo.microbatch.count`'s one message)."""
    try:
        microbatches.count(batch, k, name)
    except ValueError as error:
        raise ZooError(str(error)) from None
    return k


def synthetic_batch(cfg, batch: int, seq: int | None, seed: int) -> dict:
    """The bench's batch: ``batch`` examples of the model's input, all kept."""
    x = example_batch(cfg, batch, seed=seed, seq_len=seq)
    return {"x": x, "y": example_labels(cfg, x), "mask": jnp.ones((batch,), jnp.float32)}


def compile_step(step: Step, state, frozen, batch):
    """``step`` jitted with its state donated, compiled for these arguments."""
    return jax.jit(step, donate_argnames="state").lower(state, frozen, batch).compile()


def fresh_state(setup: Setup, params, optimizer, seed: int):
    """A fresh ``(state, frozen)`` of ``params``: the trainable leaves copied (the step donates
    its state), the frozen ones as a training run holds them (:meth:`zoo.precision.Precision.held`),
    not copied (no step donates them). Frozen leaves already in the compute dtype are shared by
    every row (a 1B base held in bf16 is on the chip once, ``benchmarks/device/dp_lora.py``); float32 ones under bf16 are
    cast once per row."""
    trainable, frozen = setup.engine.freeze.split(params)
    trainable = jax.tree.map(jnp.copy, trainable)
    return TrainState.create(trainable, optimizer, seed), setup.engine.precision.held(frozen)


def compile_rows(names, rows, setup, params, data, seed, progress) -> dict:
    """Each named row's step, compiled on fresh state: ``{name: run}``."""
    runs = {}
    for name in names:
        if progress is not None:
            progress(f"dp bench: compiling {name}")
        step, optimizer = rows[name](setup)
        state, frozen = fresh_state(setup, params, optimizer, seed)
        tic = time.perf_counter()
        compiled = compile_step(step, state, frozen, data)
        compile_s = time.perf_counter() - tic
        runs[name] = {
            "compiled": compiled,
            "state": state,
            "frozen": frozen,
            "compile_s": compile_s,
            "temp": memory_stats(compiled)["temp_size_in_bytes"],
            "program": program_digest(compiled),
            "ran": ran(name, setup, data),  # a ghost row: the method its step runs
        }
    return runs


def program_digest(compiled) -> str:
    """The compiled program's digest, its source locations left out: two rows (or two versions
    of zoo) that print the same one ran one program."""
    text = re.sub(r", metadata=\{[^}]*\}", "", compiled.as_text())
    text = "\n".join(line for line in text.splitlines() if not re.match(r"^\s*\d+ [\"{]", line))
    return hashlib.sha256(text.encode()).hexdigest()[:10]


Builder = Callable[[Setup], tuple[Step, optax.GradientTransformation]]
_OTHERS: dict[str, Builder] = {}  # rows registered by name, in order
_OTHERS_DEFAULT: list[str] = []


def register_method(name: str, builder: Builder, default: bool = True) -> Builder:
    """Add a row to the bench (after zoo's rows, in registration order). ``default=False`` rows
    run only when asked for with ``methods=[...]`` / ``--methods``."""
    _OTHERS[name] = builder
    if default and name not in _OTHERS_DEFAULT:
        _OTHERS_DEFAULT.append(name)
    return builder


def _zoo_rows() -> list[tuple[str, Builder, bool]]:
    """``(row, builder, runs by default)`` for each clipping method in the table: its row,
    its microbatched row if it has one, and opt-in rows with the other noise PRNGs."""
    rows = []
    for method in CLIPPING.values():
        rows.append((method.label, _zoo_step(method.name, False, DEFAULT_NOISE_PRNG), True))
        if method.bench_microbatch_label:
            rows.append(
                (method.bench_microbatch_label, _zoo_step(method.name, True, DEFAULT_NOISE_PRNG), True)
            )
        for prng in NOISE_PRNGS:
            if prng != DEFAULT_NOISE_PRNG:  # e.g. --methods "ghost,ghost threefry2x32"
                rows.append((f"{method.label} {prng}", _zoo_step(method.name, False, prng), False))
    return rows


def methods() -> dict[str, Builder]:
    """Every row, by name: the non-private baseline, zoo's clipping methods, other libraries'."""
    return {BASELINE: _non_private, **{name: b for name, b, _ in _zoo_rows()}, **_OTHERS}


def default_methods(microbatched: bool = False) -> list[str]:
    """The rows that run without ``--methods``; ``microbatched`` (``--microbatch``): zoo's rows
    only, without the ``zoo microbatch`` row (every row then takes microbatches), since other
    libraries' rows take the whole batch at once."""
    if microbatched:
        labels = {m.bench_microbatch_label for m in CLIPPING.values()}
        return [BASELINE, *(name for name, _, default in _zoo_rows() if default and name not in labels)]
    return [BASELINE, *(name for name, _, default in _zoo_rows() if default), *_OTHERS_DEFAULT]


def _sgd_step(setup: Setup, grads_fn) -> Step:
    """A train step whose gradient comes from ``grads_fn(state, frozen, batch) -> (loss, grads)``."""
    opt = setup.engine.optimizer

    def step(state, frozen, batch):
        loss, grads = grads_fn(state, frozen, batch)
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        return (
            TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, state.rng),
            {"loss": loss},
        )

    return step


def _non_private(setup: Setup):
    """The engine's ordinary step; with ``step_microbatch``, the engine's step accumulating the
    gradient of the mean loss over the microbatches (:func:`zoo.microbatch.accumulate`), as the
    DP rows take them."""
    grad = dataclasses.replace(setup.engine.grad, microbatch_size=setup.step_microbatch)
    engine = dataclasses.replace(setup.engine, grad=grad)
    return engine.train_step_fn, engine.optimizer


def _zoo_step(clipping: str, microbatched: bool, noise_prng: str, style: str = "all-layer") -> Builder:
    """The engine's DP step with the ``clipping`` method (microbatched: in chunks of k) in the
    clipping ``style`` (``dp.clipping_style``)."""

    def build(setup: Setup):
        microbatch = setup.microbatch_size if microbatched else setup.step_microbatch
        plan = setup.plan(
            clipping=clipping, microbatch_size=microbatch, noise_prng=noise_prng, clipping_style=style
        )
        return dataclasses.replace(setup.engine, dp=plan).train_step_fn, setup.engine.optimizer

    return build


def _noised(setup: Setup, state, grad_sum):
    """The rows' one Gaussian mechanism on a clipped sum (the step's key, the public batch)."""
    return privatize(
        grad_sum,
        state.step_key(),
        noise_multiplier=setup.noise_multiplier,
        l2_clip_norm=setup.clip_norm,
        expected_batch_size=setup.batch_size,
    )


def _jax_privacy(setup: Setup):
    from jax_privacy.clipping import clipped_grad

    def masked(trainable, frozen, x, y, m):
        return setup.one_example_loss(trainable, frozen, x, y) * m

    clipped = clipped_grad(
        masked,
        argnums=0,
        l2_clip_norm=setup.clip_norm,
        batch_argnums=(2, 3, 4),
        keep_batch_dim=False,
        return_values=True,
    )

    def grads_fn(state, frozen, batch):
        grad_sum, aux = clipped(state.params, frozen, batch["x"], batch["y"], batch["mask"])
        grads = _noised(setup, state, grad_sum)
        return aux.values.sum() / jnp.maximum(batch["mask"].sum(), 1.0), grads

    return _sgd_step(setup, grads_fn), setup.engine.optimizer


def _optax_dpsgd(setup: Setup):
    opt = optax.contrib.dpsgd(
        LR, l2_norm_clip=setup.clip_norm, noise_multiplier=setup.noise_multiplier, seed=0, momentum=MOMENTUM
    )

    def step(state, frozen, batch):
        def masked(trainable, x, y, m):
            return setup.one_example_loss(trainable, frozen, x, y) * m

        losses, grads = jax.vmap(jax.value_and_grad(masked), in_axes=(None, 0, 0, 0))(
            state.params, batch["x"], batch["y"], batch["mask"]
        )
        updates, opt_state = opt.update(grads, state.opt_state, state.params)
        return (
            TrainState(state.step + 1, optax.apply_updates(state.params, updates), opt_state, state.rng),
            {"loss": losses.sum() / jnp.maximum(batch["mask"].sum(), 1.0)},
        )

    return step, opt


def _ghost_forced(method: str) -> Builder:
    """Ghost clipping by ``method`` (``"bookkeeping"``, ``"backward"``) whatever the remat policy,
    on the whole batch, then the same ``privatize``: the method ``auto`` did not pick has a row."""

    def build(setup: Setup):
        from zoo.dp import ClipRequest
        from zoo.dp.ghost import ghost_clipped_grad_sum

        engine = setup.engine

        def grads_fn(state, frozen, batch):
            request = ClipRequest(setup.clip_norm, example_mask=batch["mask"])
            grad_sum, _, losses = ghost_clipped_grad_sum(
                engine.cfg,
                state.params,
                batch["x"],
                batch["y"],
                request,
                frozen=frozen,
                freeze_plan=engine.freeze,
                remat=engine.stack,
                precision=engine.precision,
                method=method,
            )
            grads = _noised(setup, state, grad_sum)
            count = jnp.maximum(batch["mask"].sum(), 1.0)
            return jnp.where(batch["mask"] > 0, losses, 0.0).sum() / count, grads

        return _sgd_step(setup, grads_fn), engine.optimizer

    return build


_RAN = {"bookkeeping": "book-keeping", "backward": "second backward"}


def ran(name: str, setup: Setup, data: dict) -> str | None:
    """What a ghost row's step runs, for its label: ``book-keeping``, ``second backward``,
    ``layer-wise taps`` or ``vmap fallback`` (the model's leaves not each claimed by one op);
    None for the other rows."""
    from zoo.dp.ghost import method_for, unsupported_reason

    method = {GHOST: "auto", "ghost bookkeeping": "bookkeeping", "ghost backward": "backward"}.get(name)
    if method is None and name != "ghost layer-wise":
        return None
    e, x = setup.engine, data["x"]
    if unsupported_reason(e.cfg, x, e.freeze):
        return "vmap fallback"
    found = method and method_for(e.cfg, x, e.freeze, e.stack, e.precision, method)
    return _RAN[found] if found else "layer-wise taps"


register_method("ghost bookkeeping", _ghost_forced("bookkeeping"), default=False)
register_method("ghost backward", _ghost_forced("backward"))
register_method("ghost layer-wise", _zoo_step("ghost", False, DEFAULT_NOISE_PRNG, "layer-wise"))
register_method("jax_privacy clipped_grad", _jax_privacy)
register_method("optax dpsgd", _optax_dpsgd)
GHOST = CLIPPING["ghost"].label  # ghost clipping's row


# ----------------------------------------------------------------------------- measuring


def microbatch_sweep(
    setup: Setup,
    params,
    cfg,
    seq,
    ks: Sequence[int] | None = None,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    known: dict | None = None,
) -> list[dict]:
    """Compiled temp bytes of the DP step for each k, and for all B at once, at batch B and 2B
    (compile only). ``known`` maps ``(batch, k or None)`` to temp bytes already measured."""
    batch = setup.batch_size
    ks = list(ks) if ks else sorted({max(1, batch // 32), max(1, batch // 8), max(1, batch // 2)})
    for k in ks:
        check_microbatch(k, batch)
    known = dict(known or {})
    rows = []
    for b in (batch, 2 * batch):
        data = None
        for k in [*ks, None]:
            if (b, k) not in known:
                if progress is not None:
                    progress(f"dp bench: microbatch sweep k={k or 'all'} at batch {b}")
                data = data if data is not None else synthetic_batch(cfg, b, seq, seed)
                sized = dataclasses.replace(setup, batch_size=b)
                engine = sized.dp_engine(k)
                state, frozen = fresh_state(sized, params, engine.optimizer, seed)
                compiled = compile_step(engine.train_step_fn, state, frozen, data)
                known[(b, k)] = memory_stats(compiled)["temp_size_in_bytes"]
            rows.append(
                {
                    "batch": b,
                    "microbatch": k if k is not None else b,
                    "vmap_all": k is None,
                    "temp_bytes": known[(b, k)],
                }
            )
    return rows
