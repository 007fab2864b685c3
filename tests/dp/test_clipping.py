"""Tests for zoo.dp.clipped_grad_sum against jax_privacy and a float64 loop."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax_privacy import clipping as jp_clipping

from tests.numerics import assert_close, tolerance
from zoo.dp import ClipRequest, clipped_grad_sum

# `numerics` marks the tests that compare floats from two programs (not the bad-input checks).
B = 8


def normal(rng, *shape):
    return jnp.asarray(rng.standard_normal(shape), jnp.float32)


def mlp_params(rng):
    return {
        "l1": {"w": normal(rng, 5, 7), "b": 0.1 * normal(rng, 7)},
        "l2": {"w": normal(rng, 7, 3), "b": 0.1 * normal(rng, 3)},
    }


def mlp_loss(params, x, y):
    h = jnp.tanh(x @ params["l1"]["w"] + params["l1"]["b"])
    out = h @ params["l2"]["w"] + params["l2"]["b"]
    return 0.5 * jnp.sum((out - y) ** 2)


def mlp_batch(rng, b=B):
    # Spread the input scales so per-example norms vary a lot.
    scale = jnp.linspace(0.2, 3.0, b)[:, None]
    return scale * normal(rng, b, 5), normal(rng, b, 3)


def attn_params(rng):
    return {n: normal(rng, 4, 4) / 2 for n in "qkv"}


def attn_loss(params, x, y):
    # x: [T, d] one sequence; y: [d]
    q, k, v = x @ params["q"], x @ params["k"], x @ params["v"]
    att = jax.nn.softmax(q @ k.T / jnp.sqrt(q.shape[-1]), axis=-1)
    return jnp.sum((jnp.mean(att @ v, axis=0) - y) ** 2)


def attn_batch(rng, b=B):
    scale = jnp.linspace(0.3, 2.5, b)[:, None, None]
    return scale * normal(rng, b, 6, 4), normal(rng, b, 4)


CASES = {
    "mlp": (mlp_loss, mlp_params, mlp_batch),
    "attention": (attn_loss, attn_params, attn_batch),
}
# Reduction sizes for the float rule (tests/numerics.py): the examples summed, times the
# contractions behind one per-example gradient (mlp: 5 -> 7 -> 3; attention: T=6, d=4, T x T scores).
N = {"mlp": B * 5 * 7 * 3, "attention": B * 6 * 6 * 4}


def setup_case(name, seed=0):
    loss, make_params, make_batch = CASES[name]
    rng = np.random.default_rng(seed)
    return loss, make_params(rng), make_batch(rng)


_JITTED = {}


def cgs(loss, params, *batch, l2_clip_norm, example_mask=None, frozen=None, microbatch_size=None):
    """clipped_grad_sum under jax.jit (traced clip norm), cached per (loss, microbatch_size).

    Much faster than eager on CPU; eager is compared with jit in test_jit_equals_eager.
    """
    key = (loss, microbatch_size)
    if key not in _JITTED:

        def run(p, b, c, m, f):
            request = ClipRequest(c, microbatch_size, m)
            return clipped_grad_sum(loss, p, *b, request=request, frozen=f)[:2]

        _JITTED[key] = jax.jit(run)
    return _JITTED[key](params, batch, jnp.float32(l2_clip_norm), example_mask, frozen)


def median_norm(loss, params, batch):
    _, norms = cgs(loss, params, *batch, l2_clip_norm=float("inf"))
    return float(np.median(np.asarray(norms)))


def numpy_reference(loss, params, batch, clip, mask=None):
    """Per-example jax.grad in a Python loop, clipping and summing in float64."""
    b = batch[0].shape[0]
    grad = jax.jit(jax.grad(loss))
    total = jax.tree.map(lambda p: np.zeros(p.shape, np.float64), params)
    norms = np.zeros(b)
    for i in range(b):
        g = jax.tree.map(lambda t: np.asarray(t, np.float64), grad(params, *(x[i] for x in batch)))
        norms[i] = np.sqrt(sum(np.sum(t**2) for t in jax.tree.leaves(g)))
        factor = min(1.0, clip / norms[i]) if norms[i] > 0 else 1.0
        if mask is None or mask[i] > 0:
            total = jax.tree.map(lambda s, t, f=factor: s + f * t, total, g)
    return total, norms


@pytest.mark.numerics
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_jax_privacy(name):
    loss, params, batch = setup_case(name)
    clip = median_norm(loss, params, batch)
    ours, norms = cgs(loss, params, *batch, l2_clip_norm=clip)
    theirs_fn = jp_clipping.clipped_grad(
        loss,
        l2_clip_norm=clip,
        batch_argnums=(1, 2),
        keep_batch_dim=False,
        return_grad_norms=True,
    )
    theirs, aux = jax.jit(theirs_fn)(params, *batch)
    # Clipping must be active for some examples and inactive for others.
    assert np.any(np.asarray(norms) > clip) and np.any(np.asarray(norms) < clip)
    assert_close(ours, theirs, n=N[name])
    assert_close(norms, aux.grad_norms, n=N[name])
    assert norms.dtype == jnp.float32 and norms.shape == (B,)


@pytest.mark.numerics
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_float64_loop(name):
    loss, params, batch = setup_case(name, seed=1)
    clip = median_norm(loss, params, batch)
    ours, norms = cgs(loss, params, *batch, l2_clip_norm=clip)
    ref, ref_norms = numpy_reference(loss, params, batch, clip)
    assert_close(ours, ref, n=N[name])
    assert_close(norms, ref_norms, n=N[name])
    # Every clipped contribution has norm <= C, so the sum's norm is <= B*C.
    total = np.sqrt(sum(np.sum(np.asarray(t, np.float64) ** 2) for t in jax.tree.leaves(ours)))
    assert total <= B * clip + tolerance(B * clip, N[name])


@pytest.mark.numerics
def test_the_float_rule_still_catches_clipping_bugs():
    """Negative test for this family: each bug is caught at the tolerance used above."""
    loss, params, batch = setup_case("mlp", seed=1)
    clip = median_norm(loss, params, batch)
    ref, _ = numpy_reference(loss, params, batch, clip)
    loose, _ = cgs(loss, params, *batch, l2_clip_norm=1.01 * clip)
    with pytest.raises(AssertionError):
        assert_close(loose, ref, n=N["mlp"], what="clipped at 1.01 C")
    keep = np.array([1, 1, 0, 1, 1, 1, 0, 1], np.float32)
    ref_masked, _ = numpy_reference(loss, params, batch, clip, mask=keep)
    with pytest.raises(AssertionError):
        assert_close(
            cgs(loss, params, *batch, l2_clip_norm=clip)[0], ref_masked, n=N["mlp"], what="mask dropped"
        )
    ours, _ = cgs(loss, params, *batch, l2_clip_norm=clip, example_mask=jnp.asarray(keep))
    assert_close(ours, ref_masked, n=N["mlp"])  # the same comparison passes without the bug
    with pytest.raises(AssertionError):
        assert_close(jax.tree.map(lambda g: g / B, ours), ref_masked, n=N["mlp"], what="an extra 1/B")


@pytest.mark.numerics
def test_no_clipping_is_batch_times_mean_gradient():
    loss, params, batch = setup_case("mlp")
    ours, _ = cgs(loss, params, *batch, l2_clip_norm=float("inf"), example_mask=jnp.ones((B,)))

    def mean_loss(p):
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0, 0))(p, *batch))

    expected = jax.tree.map(lambda g: B * g, jax.jit(jax.grad(mean_loss))(params))
    assert_close(ours, expected, n=N["mlp"])


@pytest.mark.numerics
@pytest.mark.parametrize("k", [1, 2, 4])
def test_microbatching_equals_unchunked(k):
    loss, params, batch = setup_case("attention")
    clip = median_norm(loss, params, batch)
    mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)
    full, full_norms = cgs(loss, params, *batch, l2_clip_norm=clip, example_mask=mask)
    chunked, chunk_norms = cgs(loss, params, *batch, l2_clip_norm=clip, example_mask=mask, microbatch_size=k)
    assert_close(chunked, full, n=N["attention"])
    assert_close(chunk_norms, full_norms, n=N["attention"])


def test_microbatch_must_divide_batch():
    loss, params, (x, y) = setup_case("mlp")
    with pytest.raises(ValueError, match=r"(?s)\b6\b.*\b4\b"):
        clipped_grad_sum(loss, params, x[:6], y[:6], request=ClipRequest(1.0, microbatch_size=4))


@pytest.mark.numerics
def test_mask_equals_running_on_subset():
    loss, params, (x, y) = setup_case("mlp", seed=2)
    clip = median_norm(loss, params, (x, y))
    keep = np.array([1, 0, 1, 1, 0, 1, 0, 1], bool)
    # Garbage (NaN) in a masked slot must not leak into the sum.
    x = np.array(x)
    x[1] = np.nan
    y = np.asarray(y)
    masked, norms = cgs(loss, params, x, y, l2_clip_norm=clip, example_mask=jnp.asarray(keep, jnp.float32))
    subset, sub_norms = cgs(loss, params, x[keep], y[keep], l2_clip_norm=clip)
    assert_close(masked, subset, n=N["mlp"])
    assert_close(np.asarray(norms)[keep], sub_norms, n=N["mlp"])
    np.testing.assert_array_equal(np.asarray(norms)[~keep], 0.0)  # documented: masked norms are 0


@pytest.mark.numerics
def test_frozen_gets_no_gradient_and_matches_stop_gradient():
    rng = np.random.default_rng(3)
    params = mlp_params(rng)["l2"]
    frozen = {"embed": normal(rng, 5, 7), "bias": jnp.ones((7,))}

    def loss(p, fz, x, y):
        h = jnp.tanh(x @ fz["embed"] + fz["bias"])
        return 0.5 * jnp.sum((h @ p["w"] + p["b"] - y) ** 2)

    x, y = mlp_batch(rng)
    clip = 1.0
    grads, norms = cgs(loss, params, x, y, l2_clip_norm=clip, frozen=frozen)
    assert jax.tree.structure(grads) == jax.tree.structure(params)

    both = {"p": params, "f": frozen}

    def sg_loss(t, x, y):
        return loss(t["p"], jax.lax.stop_gradient(t["f"]), x, y)

    ref, ref_norms = cgs(sg_loss, both, x, y, l2_clip_norm=clip)
    assert np.any(np.asarray(norms) > clip)
    assert_close(grads, ref["p"], n=N["mlp"])
    assert_close(norms, ref_norms, n=N["mlp"])
    for leaf in jax.tree.leaves(ref["f"]):
        np.testing.assert_array_equal(np.asarray(leaf), 0.0)
    # Microbatched path with frozen agrees too.
    mb, _ = cgs(loss, params, x, y, l2_clip_norm=clip, frozen=frozen, microbatch_size=2)
    assert_close(mb, grads, n=N["mlp"])


def test_zero_gradient_has_no_nan():
    params = {"w": jnp.ones((3,))}

    def loss(p, x):
        return jnp.sum(x)  # independent of params

    grads, norms = cgs(loss, params, jnp.ones((4, 2)), l2_clip_norm=0.5)
    np.testing.assert_array_equal(np.asarray(norms), 0.0)
    np.testing.assert_array_equal(np.asarray(grads["w"]), 0.0)


def test_bad_clip_norm_rejected():
    loss, params, batch = setup_case("mlp")
    with pytest.raises(ValueError, match="-1.0"):
        clipped_grad_sum(loss, params, *batch, request=ClipRequest(-1.0))


@pytest.mark.numerics
def test_jit_equals_eager():
    loss, params, batch = setup_case("attention", seed=4)
    clip = median_norm(loss, params, batch)
    mask = jnp.array([1, 0, 1, 1, 1, 1, 1, 0], jnp.float32)
    eager = clipped_grad_sum(loss, params, *batch, request=ClipRequest(clip, 2, mask))

    @jax.jit
    def jitted(p, x, y, m, c):  # clip norm traced
        return clipped_grad_sum(loss, p, x, y, request=ClipRequest(c, 2, m))

    static = jax.jit(lambda p, x, y, m: clipped_grad_sum(loss, p, x, y, request=ClipRequest(clip, 2, m)))
    for out in (jitted(params, *batch, mask, jnp.float32(clip)), static(params, *batch, mask)):
        assert_close(out, eager, n=N["attention"])


@pytest.mark.numerics
@pytest.mark.parametrize("k", [None, 2])
def test_return_losses_are_the_per_example_losses(k):
    loss, params, (x, y) = setup_case("attention", seed=3)
    mask = jnp.array([1, 1, 0, 1, 1, 1, 0, 1], jnp.float32)
    fn = jax.jit(
        lambda p: clipped_grad_sum(
            loss, p, x, y, request=ClipRequest(0.5, microbatch_size=k, example_mask=mask)
        )
    )
    grad_sum, norms, losses = fn(params)
    plain_sum, plain_norms = cgs(loss, params, x, y, l2_clip_norm=0.5, example_mask=mask)
    expected = np.array([float(loss(params, x[i], y[i])) for i in range(B)]) * np.asarray(mask)
    assert_close(losses, expected, n=N["attention"])
    assert_close(grad_sum, plain_sum, n=N["attention"])
    assert_close(norms, plain_norms, n=N["attention"])
