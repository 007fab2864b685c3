"""zoo.parallel.host_step's pipeline (the default step of placement = "update-on-host"): leaf
by leaf, in pieces, it equals the whole-tree step (SerialHostStep) bit for bit, with and
without the global-norm clip, under float32 and bfloat16; the delayed update (update_delay = 1)
equals a hand-written delayed reference bit for bit. Each check has its planted bugs."""

import dataclasses

import jax
import numpy as np
import optax
import pytest

from tests.conftest import random_params
from tests.numerics import assert_bitwise_equal
from tests.parallel.test_host_step import stale_moments, update_twice
from tests.parallel.test_placement import LLAMA, batch_of
from zoo.parallel import host_leaves, host_step
from zoo.parallel.host_leaves import LeafUpdates, row_bounds
from zoo.parallel.host_step import HostStep, SerialHostStep
from zoo.parallel.placement import PLACEMENTS
from zoo.precision import Precision
from zoo.train.engine import GradientSettings, make_engine
from zoo.train.start import config_start

STEPS = 4
PIECES = 1000  # bytes: every leaf of the small Llama with 2+ rows is cut
CLIPPED = optax.chain(optax.clip_by_global_norm(0.05), optax.adamw(1e-2, weight_decay=0.1))
OPTIMIZERS = {"adamw": optax.adamw(1e-2, weight_decay=0.1), "clipped": CLIPPED}


def engine_for(precision: str, optimizer: str):
    params = random_params(LLAMA, 1)
    start = config_start(LLAMA, params, patterns=("blocks.mlp_norm",))
    grad = GradientSettings("nnx", OPTIMIZERS[optimizer], precision=Precision(precision))
    return make_engine(start, grad, PLACEMENTS["update-on-host"]), params


def run(step, engine, params) -> tuple:
    """``STEPS`` steps of ``step``: the final state on the host and the metrics."""
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    seen = []
    for i in range(STEPS):
        state, metrics = step(state, frozen, batch_of(i))
        seen.append({k: np.asarray(v) for k, v in metrics.items()})
    return jax.device_get(state), seen


def check_pipeline(precision="bfloat16", optimizer="clipped", chunk_bytes=PIECES) -> None:
    engine, params = engine_for(precision, optimizer)
    expected = run(SerialHostStep(engine), engine, params)
    step = HostStep(engine, chunk_bytes=chunk_bytes)
    actual = run(step, engine, params)
    assert_bitwise_equal(actual, expected)
    compiles = step.cache_sizes()
    run(step, engine, params)  # a second run: no program compiles again
    assert step.cache_sizes() == compiles, compiles


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
def test_the_pipeline_equals_the_whole_tree_step_bit_for_bit(precision, optimizer):
    check_pipeline(precision, optimizer)


def test_one_piece_a_leaf_equals_it_too():
    check_pipeline(chunk_bytes=host_leaves.CHUNK_BYTES)


def test_the_clip_reads_the_whole_gradients_norm():
    """The clip bites at this norm (else the clipped check would not test it)."""
    engine, params = engine_for("float32", "clipped")
    _, metrics = run(HostStep(engine), engine, params)
    assert all(m["grad_norm"] > 0.05 for m in metrics), [m["grad_norm"] for m in metrics]


def swapped_leaves(monkeypatch):
    """Planted: the gradients of two leaves of one shape change places."""
    update = HostStep._update

    def planted(step, state, leaves, grads, *rest):
        shapes = [g.shape for g in grads]
        i, j = next((i, j) for i in range(len(grads)) for j in range(i) if shapes[i] == shapes[j])
        grads[i], grads[j] = grads[j], grads[i]
        return update(step, state, leaves, grads, *rest)

    monkeypatch.setattr(HostStep, "_update", planted)


def reversed_pieces(monkeypatch):
    """Planted: a leaf's pieces come down in reverse order (a piece's gradient applied to
    another piece's rows), where they are all one shape (else the leaf's program, compiled
    for the cut's shapes, refuses them)."""
    cut = host_step.pieces

    def planted(x, edges):
        chunks = cut(x, edges)
        return chunks[::-1] if len({c.shape for c in chunks}) == 1 else chunks

    monkeypatch.setattr(host_step, "pieces", planted)


def off_by_one(monkeypatch):
    """Planted: every piece but the first starts a row early (a row sent twice, the last one
    not at all)."""

    def cut(x, edges):
        if len(edges) == 2:
            return (x,)
        starts = [max(a - 1, 0) for a in edges[:-1]]
        return tuple(x[a : a + (b - c)] for a, b, c in zip(starts, edges[1:], edges[:-1], strict=True))

    monkeypatch.setattr(host_step, "pieces", cut)


@pytest.mark.parametrize("plant", [swapped_leaves, reversed_pieces, off_by_one])
def test_the_bitwise_check_catches_misplaced_pieces(plant, monkeypatch):
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        check_pipeline()


@pytest.mark.parametrize("plant", [stale_moments, update_twice])
def test_the_bitwise_check_catches_a_wrong_leaf_update(plant, monkeypatch):
    compile_leaf = LeafUpdates.compile
    monkeypatch.setattr(LeafUpdates, "compile", lambda self, *a: plant(compile_leaf(self, *a)))
    with pytest.raises(AssertionError):
        check_pipeline()


def delayed_reference(engine, params) -> tuple:
    """ZeRO-Offload's delayed update written out with the whole-tree step's programs: step t's
    gradient at the params before step t-1's update (``p_{t-2}``; the first two at ``p_0``),
    applied to the params after it."""
    serial = SerialHostStep(engine)
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    copy = lambda tree: jax.tree.map(lambda x: x.copy(), tree)  # noqa: E731 - the update donates
    behind = [copy(state.params)]  # p_{t-2}, p_{t-1}
    seen = []
    for i in range(STEPS):
        at = dataclasses.replace(state, params=behind[0])
        loss, grads, report = serial.grads(serial.up(at), frozen, batch_of(i))
        loss, grads = jax.device_put((loss, grads), serial.host)
        state, metrics = serial.update(state, loss, grads)
        seen.append({k: np.asarray(v) for k, v in {**metrics, **report}.items()})
        behind = [behind[-1], copy(state.params)]
    return jax.device_get(state), seen


def check_delayed(delay: int = 1) -> None:
    engine, params = engine_for("bfloat16", "clipped")
    expected = delayed_reference(engine, params)
    assert_bitwise_equal(
        run(HostStep(engine, update_delay=delay, chunk_bytes=PIECES), engine, params), expected
    )


def test_the_delayed_update_equals_the_delayed_reference_bit_for_bit():
    check_delayed()


def test_the_delayed_check_catches_a_step_that_is_not_delayed():
    with pytest.raises(AssertionError):
        check_delayed(delay=0)


def test_the_delayed_update_is_another_algorithm():
    """The first step is the exact one's (nothing to be behind); the second is computed at the
    first params again, so its loss is not the exact run's."""
    engine, params = engine_for("bfloat16", "clipped")
    exact = run(HostStep(engine), engine, params)
    delayed = run(HostStep(engine, update_delay=1), engine, params)
    assert float(exact[1][0]["loss"]) == float(delayed[1][0]["loss"])
    assert float(exact[1][1]["loss"]) != float(delayed[1][1]["loss"])


def test_a_state_the_step_did_not_make_restarts_the_delay():
    """A restored state (not the arrays the step returned) is computed at, not a stale copy."""
    engine, params = engine_for("float32", "adamw")
    step = HostStep(engine, update_delay=1)
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    state, _ = step(state, frozen, batch_of(0))
    state, _ = step(state, frozen, batch_of(1))
    restored = jax.device_put(jax.device_get(state), step.host)  # new arrays, equal values
    _, resumed = step(restored, frozen, batch_of(2))
    exact = HostStep(engine)
    _, fresh = exact(jax.device_put(jax.device_get(state), step.host), frozen, batch_of(2))
    assert float(resumed["loss"]) == float(fresh["loss"])


def test_the_params_go_up_as_their_leaves_are_updated(monkeypatch):
    """The exact step sends the params up inside the step that updated them: the next step and
    the eval pass find them on the device, and only the first step sends its own."""
    engine, params = engine_for("bfloat16", "clipped")
    sent = []
    up_all = HostStep._up_all
    monkeypatch.setattr(HostStep, "_up_all", lambda self, *a: sent.append(len(a[0])) or up_all(self, *a))
    step = HostStep(engine)
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    for i in range(3):
        state, _ = step(state, frozen, batch_of(i))
    on_device = step.params_up(state.params)
    assert sent == [len(jax.tree.leaves(state.params))], sent
    assert_bitwise_equal(on_device, SerialHostStep(engine).params_up(state.params))


@pytest.mark.parametrize(
    "shape, nbytes, chunk, edges",
    [
        ((16, 4), 256, 64, (0, 4, 8, 12, 16)),
        ((10, 4), 160, 64, (0, 4, 7, 10)),  # 3 pieces, the first one row longer
        ((3, 100), 1200, 1, (0, 1, 2, 3)),  # at most one piece a row
        ((1, 100), 400, 64, (0, 1)),
        ((), 4, 1, (0, 1)),
        ((8, 2), 64, 64, (0, 8)),  # fits: one piece
    ],
)
def test_a_leaf_is_cut_into_pieces_of_at_most_chunk_bytes(shape, nbytes, chunk, edges):
    assert row_bounds(shape, nbytes, chunk) == edges


def test_a_bad_delay_or_piece_size_is_one_line():
    engine, _ = engine_for("float32", "adamw")
    with pytest.raises(ValueError, match=r"update_delay = 2 is not one of \(0, 1\)"):
        HostStep(engine, update_delay=2)
    with pytest.raises(ValueError, match="chunk_bytes = 0 must be"):
        HostStep(engine, chunk_bytes=0)
