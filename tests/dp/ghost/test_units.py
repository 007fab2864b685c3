"""Ghost clipping of users (zoo.dp.ghost.units): each user's mean gradient over its filled
record slots, clipped as one unit, without per-user gradients, against the vmap user path
(zoo.dp.users.user_loss under zoo.dp.clipped_grad_sum, as the engine runs it with
dp.clipping = "vmap"), which differentiates each user's mean loss on the real model.

The users: 4 of k = 3 slots; user 0 fills all three, user 1 two (not a prefix: its empty slot
holds a real record, which must add nothing), user 2 one, and user 3 is padding (no slot, user
mask 0; its rows NaN where the input is a float)."""

import dataclasses
import functools

import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, reduction_size
from tests.dp.ghost.test_api import KINDS, ShiftedMLP, ShiftedMLPConfig, batch, params_of
from tests.dp.ghost.test_rules import TIED
from tests.numerics import assert_close
from zoo.dp import ClipRequest, clipped_grad_sum, ghost
from zoo.dp.ghost.units import Units
from zoo.dp.users import user_loss
from zoo.losses import per_example_loss
from zoo.models import registry

pytestmark = pytest.mark.numerics

K = 3
SLOTS = np.array([[1, 1, 1], [1, 0, 1], [1, 0, 0], [0, 0, 0]], np.float32)
USERS = (SLOTS.sum(axis=1) > 0).astype(np.float32)  # the request's mask: a drawn user
ROWS = SLOTS.size


@functools.cache
def vmap_users(cfg):
    """The vmap user path on the real model: ``(grad sum, norms [U], losses [U])``."""
    apply = zoo.apply_fn(cfg, "nnx")
    loss = user_loss(lambda p, fz, x, y: per_example_loss(apply(p, x), y))

    def run(params, x, y, clip):
        xs = x.reshape(len(SLOTS), K, *x.shape[1:])
        ys = {"y": y.reshape(len(SLOTS), K, *y.shape[1:]), "mask": SLOTS}
        return clipped_grad_sum(
            loss, params, xs, ys, request=ClipRequest(clip, example_mask=USERS), frozen={}
        )

    return fast_jit(run)


@functools.cache
def ghost_users(cfg, method="auto", dense=None):
    def run(params, x, y, clip):
        request = ClipRequest(clip, example_mask=USERS)
        return ghost.ghost_clipped_grad_sum(
            cfg, params, x, y, request, method=method, dense=dense, slots=SLOTS
        )

    return fast_jit(run)


def data(cfg, seed=0):
    x, y = batch(cfg, seed=seed, b=ROWS)
    if np.issubdtype(x.dtype, np.floating):
        x[USERS.repeat(K) == 0] = np.nan  # the padding user's rows hold garbage
    return x, y


def compare(cfg, method="auto", dense=None, x=None, y=None):
    """Ghost against vmap per user, at a clip bound between the users' norms."""
    params = params_of(cfg)
    if x is None:
        x, y = data(cfg)
    reference = vmap_users(cfg)
    unclipped = np.asarray(reference(params, x, y, np.float32(np.inf))[1])[USERS > 0]
    clip = np.float32(np.median(unclipped))
    assert np.any(unclipped > clip) and np.any(unclipped < clip), "clipping should be partly active"
    ours, norms, losses = ghost_users(cfg, method, dense)(params, x, y, clip)
    ref, ref_norms, ref_losses = reference(params, x, y, clip)
    n = reduction_size(cfg, ROWS)
    assert_close(norms, ref_norms, n=n, what="per-user norms")
    assert_close(ours, ref, n=n, what="clipped sum")
    assert_close(np.asarray(losses)[USERS > 0], np.asarray(ref_losses)[USERS > 0], n=n, what="losses")
    assert float(norms[-1]) == 0.0  # the padding user


@pytest.mark.parametrize("kind", ["transformer", "llama", "mlp"])
def test_ghost_clips_each_users_mean_gradient_as_the_vmap_path(kind):
    compare(KINDS[kind])


@pytest.mark.parametrize("kind", ["transformer", "mlp"])
def test_the_second_backward_clips_users_too(kind):
    compare(KINDS[kind], method="backward")


def test_the_gram_form_runs_over_a_users_concatenated_tokens():
    """Every sequence op and the token table in the Gram form (at k T = 48 positions the
    automatic choice materialises them all); a token shared by two records of one user writes
    one row of the table, so the user's records must meet in one norm."""
    cfg = KINDS["transformer"]
    x, y = data(cfg, seed=1)
    x = x % 4  # few distinct tokens: the records of a user share rows of the table
    compare(cfg, dense="gram", x=x, y=y)


def test_a_tied_heads_cross_term_runs_over_a_users_tokens():
    """The table read by the embedding and by the tied head: the cross term of the two ops'
    gradients pairs every token of a user's records with every position of them."""
    cfg = TIED["llama-tied"]
    x, y = data(cfg, seed=2)
    compare(cfg, x=x % 5, y=y)


def test_a_model_ghost_cannot_read_falls_back_to_the_vmap_user_path():
    """A parameter outside the op set (tests/dp/ghost/test_api.py's shifted MLP): the fallback
    clips users too."""
    registry.register(ShiftedMLPConfig, nnx=ShiftedMLP, eqx=ShiftedMLP, presets={})
    try:
        with pytest.warns(UserWarning, match=r"\['shift\.b'\].*vmap path"):
            compare(ShiftedMLPConfig(**dataclasses.asdict(KINDS["mlp"])))
    finally:
        registry.unregister(ShiftedMLPConfig.kind)


@pytest.mark.parametrize("dense", ["gram", "materialise"])
def test_conv_layers_read_each_records_windows(dense):
    compare(KINDS["cnn"], dense=dense)


def test_unit_weights_losses_and_copies():
    """The slot weights are 1 / n_u on filled slots (0 for padding), a user's loss their
    weighted sum, and a dropped user's rows are replaced by the first kept user's."""
    units = Units.of(SLOTS, ROWS)
    assert units.records == K and units.count(ROWS) == len(SLOTS)
    expected = np.array([1 / 3] * 3 + [1 / 2, 0, 1 / 2] + [1, 0, 0] + [0] * 3, np.float32)
    np.testing.assert_allclose(np.asarray(units.row_weights()), expected, rtol=1e-7)
    losses = np.arange(ROWS, dtype=np.float32)
    losses[4] = np.nan  # an empty slot's loss adds nothing
    np.testing.assert_allclose(np.asarray(units.losses(losses)), [1.0, 4.0, 6.0, 0.0], rtol=1e-7)
    use = np.array([False, True, False, True])
    rows = np.asarray(units.keep_or_copy(np.arange(ROWS), use)).reshape(-1, K)
    np.testing.assert_array_equal(rows, [[3, 4, 5], [3, 4, 5], [3, 4, 5], [9, 10, 11]])
    with pytest.raises(ValueError, match="slots must have shape"):
        Units.of(SLOTS, ROWS + 1)
