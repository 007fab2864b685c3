"""The conv norm rule (zoo.dp.ghost.conv) against the vmap path, in both of its forms.

The reference differentiates the real CNN (``zoo.apply_fn``, NNX and Equinox) example by
example; ghost clipping reads the conv's input windows and output gradients only.
"""

import functools

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, random_params, reduction_size
from tests.numerics import assert_close
from zoo.dp import ClipRequest, clipped_grad_sum, ghost
from zoo.losses import per_example_loss
from zoo.models import registry

pytestmark = pytest.mark.numerics

B = 5
SMALL = registry.get_kind("cnn").small
MNIST = zoo.get_config("cnn-mnist", activation="tanh")


def data(cfg, seed=0):
    key = jax.random.key(seed)
    x = np.array(cfg.example_input(key, B))
    return x, np.array(cfg.example_labels(jax.random.fold_in(key, 1), x))


@functools.cache
def vmap_run(cfg, backend):
    apply = zoo.apply_fn(cfg, backend)

    def loss(p, fz, xi, yi):
        del fz
        return per_example_loss(apply(p, xi[None]), yi[None])[0]

    return fast_jit(
        lambda p, x, y, clip, mask: clipped_grad_sum(
            loss, p, x, y, request=ClipRequest(clip, example_mask=mask), frozen={}
        )[:2]
    )


@functools.cache
def ghost_run(cfg, method, dense):
    return fast_jit(
        lambda p, x, y, clip, mask: ghost.ghost_clipped_grad_sum(
            cfg, p, x, y, ClipRequest(clip, example_mask=mask), method=method, dense=dense
        )[:2]
    )


# The small CNN with each form forced; cnn-mnist with the automatic choice, which takes both
# (conv1 materialises, conv2 takes the Gram form).
@pytest.mark.parametrize(
    "cfg, dense",
    [(SMALL, "gram"), (SMALL, "materialise"), (MNIST, None)],
    ids=["small-gram", "small-materialise", "cnn-mnist-auto"],
)
def test_conv_norms_and_clipped_sum_match_vmap(cfg, dense):
    params = random_params(cfg, seed=1)
    x, y = data(cfg)
    mask = np.ones(B, np.float32)
    _, free = ghost_run(cfg, "bookkeeping", dense)(params, x, y, np.float32(np.inf), mask)
    clip = np.float32(np.median(np.asarray(free)))  # some examples clipped, some not
    n = reduction_size(cfg, B) * cfg.image_size**2  # a kernel gradient sums over positions too
    ref, ref_norms = vmap_run(cfg, "nnx")(params, x, y, clip, mask)
    assert np.any(np.asarray(ref_norms) > clip) and np.any(np.asarray(ref_norms) < clip)
    for method in ("bookkeeping", "backward"):
        ours, norms = ghost_run(cfg, method, dense)(params, x, y, clip, mask)
        assert_close(norms, ref_norms, n=n, what=f"norms ({method}, {dense})")
        assert_close(ours, ref, n=n, what=f"clipped sum ({method}, {dense})")


def test_masked_and_nan_examples_add_nothing_and_eqx_agrees():
    cfg = SMALL
    params = random_params(cfg, seed=2)
    x, y = data(cfg, seed=3)
    x[1] = np.nan
    mask = np.ones(B, np.float32)
    mask[[1, 3]] = 0
    clip = np.float32(0.5)
    n = reduction_size(cfg, B) * cfg.image_size**2
    ours, norms = ghost_run(cfg, "bookkeeping", None)(params, x, y, clip, mask)
    ref, ref_norms = vmap_run(cfg, "eqx")(params, x, y, clip, mask)
    assert np.all(np.isfinite(np.asarray(norms))) and float(norms[1]) == float(norms[3]) == 0.0
    assert_close(norms, ref_norms, n=n, what="norms")
    assert_close(ours, ref, n=n, what="clipped sum")


def test_a_flipped_kernel_is_caught():
    """Negative test: the reference run with conv2's kernel flipped in space (a converter's
    classic bug) gives norms the comparison rejects."""
    cfg = SMALL
    params = random_params(cfg, seed=4)
    x, y = data(cfg, seed=5)
    mask, clip = np.ones(B, np.float32), np.float32(np.inf)
    _, norms = ghost_run(cfg, "bookkeeping", None)(params, x, y, clip, mask)
    flipped = {**params, "conv2": {**params["conv2"], "w": params["conv2"]["w"][::-1, ::-1]}}
    _, ref_norms = vmap_run(cfg, "nnx")(flipped, x, y, clip, mask)
    with pytest.raises(AssertionError):
        assert_close(norms, ref_norms, n=reduction_size(cfg, B) * cfg.image_size**2, what="norms")


def test_each_conv_layer_takes_the_cheaper_form():
    """cnn-mnist: conv1 has 196 output positions and a 64 x 16 kernel (per-example gradient),
    conv2 25 positions and a 256 x 32 kernel (ghost norm)."""
    methods = ghost.layer_methods(zoo.get_config("cnn-mnist"), jax.ShapeDtypeStruct((2, 784), np.float32))
    assert methods == {"conv1": "materialise", "conv2": "gram"}
    assert ghost.conv_method(196, 64, 16) == "materialise" and ghost.conv_method(25, 256, 32) == "gram"
