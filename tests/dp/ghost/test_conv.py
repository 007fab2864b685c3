"""The conv norm rule (zoo.dp.ghost.conv) against the vmap path, in both of its forms.

The reference differentiates the real CNN (``zoo.apply_fn``, NNX and Equinox) example by
example; ghost clipping reads the conv's input windows and output gradients only.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, random_params, reduction_size
from tests.numerics import assert_close
from zoo.dp import ClipRequest, clipped_grad_sum, ghost
from zoo.dp.ghost import conv as ghost_conv
from zoo.jaxprs import iter_eqns
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


def _compare_mnist(params, x, y, clip, mask, what):
    n = reduction_size(MNIST, B) * MNIST.image_size**2
    ref, ref_norms = vmap_run(MNIST, "nnx")(params, x, y, clip, mask)
    ours, norms = ghost.ghost_clipped_grad_sum(
        MNIST, params, x, y, ClipRequest(clip, example_mask=mask), method="bookkeeping"
    )[:2]
    assert_close(norms, ref_norms, n=n, what=f"norms ({what})")
    assert_close(ours, ref, n=n, what=f"clipped sum ({what})")


@pytest.mark.parametrize("chunk_examples", [2, 3, B], ids=["divides", "remainder", "whole-batch"])
def test_windows_cut_in_chunks_of_examples(monkeypatch, chunk_examples):
    """The windows are cut a chunk of examples at a time (``lax.map``): a chunk that divides the
    batch, one that leaves a remainder, and the whole batch give the vmap path's norms and sum
    (cnn-mnist at B=5: conv1 materialises, conv2 takes the Gram form)."""
    monkeypatch.setattr(ghost_conv, "CHUNK_BYTES", chunk_examples * 196 * 64 * 4)
    params = random_params(MNIST, seed=6)
    x, y = data(MNIST, seed=7)
    mask = np.ones(B, np.float32)
    mask[4] = 0
    x[4] = np.nan  # a padding slot holding NaN adds nothing
    _compare_mnist(params, x, y, np.float32(0.3), mask, f"{chunk_examples} examples a chunk")


@functools.cache
def _per_example_kernel_grads(seed):
    """cnn-mnist's per-example kernel gradients (plain ``jax.grad`` of one example's loss),
    and the ghost probe pass's captures and output gradients on the same batch."""
    params = random_params(MNIST, seed=seed)
    x, y = (jnp.asarray(a) for a in data(MNIST, seed=seed + 1))
    apply = zoo.apply_fn(MNIST, "nnx")

    def one(xi, yi):
        grads = jax.grad(lambda p: per_example_loss(apply(p, xi[None]), yi[None])[0])(params)
        return {c: grads[c]["w"] for c in ("conv1", "conv2")}

    gp = ghost.prepare(MNIST, x)
    _, caps, deltas = fast_jit(lambda p: ghost.probe_pass(gp, p, x, y))(params)
    return fast_jit(jax.vmap(one))(x, y), caps, deltas


def _layer_norms(conv, form, seed=14):
    """``(ghost's squared kernel-gradient norms of one conv layer in one form, the reference)``."""
    grads, caps, deltas = _per_example_kernel_grads(seed)
    rule = fast_jit(lambda a, d: ghost_conv.Conv(a, d, ("w",), force=form).sq()["w"])
    expected = np.sum(np.square(np.asarray(grads[conv], np.float64)), axis=(1, 2, 3, 4))
    window = int(np.prod(grads[conv].shape[1:4]))
    positions = int(np.prod(deltas[conv].shape[1:3]))
    return rule(caps[conv], deltas[conv]), expected, positions * window


@pytest.mark.parametrize("conv", ["conv1", "conv2"])
@pytest.mark.parametrize("form", ["materialise", "gram"])
def test_each_form_gives_each_layers_norms(conv, form):
    """Layer by layer: both forms of the conv rule on cnn-mnist's two convs (stride 2, an 8x8
    window over one channel with padding 3; a 4x4 window over 16 channels, no padding) give
    the squared norms of the per-example kernel gradients of plain ``jax.grad``."""
    ours, expected, n = _layer_norms(conv, form)
    assert_close(ours, expected, n=n, what=f"{conv} squared norms ({form})")


ghost_conv_windows = ghost_conv.windows


@pytest.mark.parametrize("conv, form", [("conv1", "materialise"), ("conv2", "gram")])
def test_windows_off_by_one_row_are_caught(monkeypatch, conv, form):
    """Negative test: windows read one row lower than the conv reads them give layer norms the
    float rule rejects, in each form (the form each layer takes)."""
    monkeypatch.setattr(
        ghost_conv, "windows", lambda x, *geometry: ghost_conv_windows(jnp.roll(x, 1, axis=0), *geometry)
    )
    ours, expected, n = _layer_norms(conv, form)
    with pytest.raises(AssertionError, match="squared norms"):
        assert_close(ours, expected, n=n, what=f"{conv} squared norms ({form}, shifted windows)")


def test_a_gram_layer_sum_without_the_clip_factors_is_caught(monkeypatch):
    """Negative test: the Gram-form layer's book-kept sum (the conv's own weight gradient) taken
    without the clip factors gives a clipped sum the float rule rejects."""
    real = ghost_conv.kernel_grad
    monkeypatch.setattr(ghost_conv, "kernel_grad", lambda inp, d, shape: real(inp, d * 0 + 1, shape))
    params = random_params(MNIST, seed=10)
    x, y = data(MNIST, seed=11)
    with pytest.raises(AssertionError, match="clipped sum"):
        _compare_mnist(params, x, y, np.float32(0.01), np.ones(B, np.float32), "unweighted Gram sum")


def _convs(fn, *args) -> list[tuple[int, ...]]:
    """Output shapes of the convolutions in ``fn``'s jaxpr, at any depth."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [
        tuple(e.outvars[0].aval.shape) for e in iter_eqns(jaxpr) if e.primitive.name == "conv_general_dilated"
    ]


def test_bookkeeping_runs_one_forward_and_one_activation_backward():
    """Structural: book-keeping convolves each layer once forward, propagates the output
    gradient once backward (conv2's input gradient; conv1 reads the data) and takes no kernel
    gradient by convolution but the Gram-form layer's book-kept sum (conv2; conv1's sum comes
    from its per-example gradients). The second-backward method, for contrast, runs the
    forward twice and takes both kernel gradients."""
    params = random_params(MNIST, seed=12)
    x, y = (jnp.asarray(a) for a in data(MNIST, seed=13))
    kinds = {
        (8, 8, 1, 16): "conv1",  # kernel gradients
        (4, 4, 16, 32): "conv2",
        (B, 14, 14, 16): "forward",  # conv1's and conv2's outputs
        (B, 5, 5, 32): "forward",
        (B, 13, 13, 16): "input gradient",  # conv2's input (conv1's pooled output)
    }

    def count(method):
        shapes = _convs(
            lambda p: ghost.ghost_clipped_grad_sum(MNIST, p, x, y, ClipRequest(1.0), method=method)[0], params
        )
        return sorted(kinds[s] for s in shapes)

    assert count("bookkeeping") == ["conv2", "forward", "forward", "input gradient"]
    assert count("backward") == ["conv1", "conv2", *["forward"] * 4, *["input gradient"] * 2]
