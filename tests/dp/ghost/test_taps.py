"""Norms taken inside the scanned backward pass (zoo.dp.ghost.taps) and the clipped sums made
from what the taps kept, against per-example gradients of plain ``jax.vmap(jax.grad)`` on the
real models: each layer's norms of each site, the total norms and the clipped sums, for the
transformer, Llama and a tied head, under the remat policies and in bf16. With planted bugs
(a layer's norms dropped, an output gradient paired with the wrong example's input, the clip
factor of the wrong example) that the same comparisons catch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, reduction_size
from tests.dp.ghost.test_api import B, batch, params_of
from tests.numerics import assert_close, assert_close_bf16
from zoo.dp import ClipRequest, ghost
from zoo.dp.ghost import products, stages, taps
from zoo.losses import per_example_loss
from zoo.models.paths import flat_by_path

pytestmark = pytest.mark.numerics

SMALL = {"d_model": 32, "d_ff": 64, "max_len": 16, "vocab_size": 40, "num_layers": 4}
CONFIGS = {  # four layers: nested remat runs two groups of two
    "transformer": zoo.get_config("transformer-xs", **SMALL),
    "llama": zoo.get_config("llama-xs", **SMALL),
    "tied": zoo.get_config("transformer-xs", **SMALL, attn_bias=True, tie_head=True),
}
REMATS = ("none", "dots", "full", "nested")


@functools.cache
def reference(name: str):
    """Per-example gradients of the real model (``jax.vmap(jax.grad)`` of one example's loss,
    float32), on the test's params and batch."""
    cfg = CONFIGS[name]
    apply = zoo.apply_fn(cfg, "nnx")
    params = params_of(cfg)
    x, y = batch(cfg)

    def loss(p, xi, yi):
        return per_example_loss(apply(p, xi[None]), yi[None])[0]

    grads = fast_jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))(params, x, y)
    return {k: np.asarray(v, np.float64) for k, v in flat_by_path(grads).items()}


def clipped(grads: dict, clip: float):
    """``(norms [B], sum_i f_i g_i)`` of per-example gradients, in float64."""
    sq = sum(np.sum(np.square(g).reshape(B, -1), axis=1) for g in grads.values())
    norms = np.sqrt(sq)
    factor = np.minimum(1.0, clip / np.maximum(norms, 1e-30))
    return norms, {k: np.tensordot(factor, g, axes=1) for k, g in grads.items()}


def site_norms(name: str, remat: str, dense=None, precision=None):
    """Each active site's per-layer squared norms ``{key: [L, B, leaves]}`` as the taps hand
    them out of one book-keeping pass (the site's rows: ``{leaf: canonical path}``)."""
    cfg = CONFIGS[name]
    x, y = batch(cfg)
    gp = stages.prepare(cfg, x, None, remat, precision)
    run = fast_jit(lambda p: stages.tap_pass(gp, p, x, y, dense, sums=True)[2].out)
    out = run(params_of(cfg))
    return gp, {site.key: (site, np.asarray(out[site.key]["sq"], np.float64)) for site in gp.active}


def ghost_run(name, remat, method="bookkeeping", dense=None, precision=None):
    cfg = CONFIGS[name]
    x, y = batch(cfg)

    def run(params, x, y, clip):
        request = ClipRequest(clip)
        kw = dict(remat=remat, method=method, dense=dense, precision=precision)
        return ghost.ghost_clipped_grad_sum(cfg, params, x, y, request, **kw)[:2]

    grads, norms = fast_jit(run)(params_of(cfg), x, y, np.float32(CLIP[name]))
    return {k: np.asarray(v, np.float64) for k, v in flat_by_path(grads).items()}, np.asarray(norms)


# A clip bound between the examples' norms (some clipped, some not), from the reference.
CLIP = {name: None for name in CONFIGS}


def clip_of(name: str) -> float:
    if CLIP[name] is None:
        norms, _ = clipped(reference(name), np.inf)
        CLIP[name] = float(np.median(norms))
    return CLIP[name]


def n_of(name: str) -> int:
    return reduction_size(CONFIGS[name], B)


def check_sites(name, remat, dense=None, found=None):
    """Every untied site's per-layer norms (``found``: :func:`site_norms`'s, computed here when
    not given) against the reference's per-example gradients, as one tree (a leaf whose gradient
    is zero, such as a key bias, is held to the scale of all)."""
    ref = reference(name)
    found = site_norms(name, remat, dense)[1] if found is None else found
    ours, expected = {}, {}
    for site, got in found.values():
        if site.kind in ("gather", "unembed") and name == "tied":
            continue  # one table read by two ops: its norm is the pair's (check_step)
        for j, leaf in enumerate(site.leaves):
            g = ref[f"{site.path}.{leaf}"]  # [B, L, ...] stacked, [B, ...] otherwise
            sq = np.sum(np.square(g).reshape(*g.shape[: 2 if site.stacked else 1], -1), axis=-1)
            expected[f"{site.key}.{leaf}"] = sq.T if site.stacked else sq  # [L, B] as the scan hands them out
            ours[f"{site.key}.{leaf}"] = got[..., j]
    assert len(ours) >= 4
    assert_close(ours, expected, n=n_of(name), what="each site's squared norms")


def check_step(name, remat, method="bookkeeping", dense=None, ran=None):
    """The step's norms and clipped sum (``ran``: :func:`ghost_run`'s, run here when not given)
    against the reference's, at a clip bound some examples exceed and some do not."""
    clip = clip_of(name)
    ref_norms, ref_sum = clipped(reference(name), clip)
    assert np.any(ref_norms > clip) and np.any(ref_norms < clip)
    grads, norms = ghost_run(name, remat, method, dense) if ran is None else ran
    assert_close(norms, ref_norms, n=n_of(name), what="norms")
    assert_close(grads, ref_sum, n=n_of(name), what="clipped sum")


def check_sites_and_step(name, remat, dense=None):
    """:func:`check_sites` and :func:`check_step` (book-keeping) read from one compiled program
    that returns both the taps' per-site norms and the ghost step's result: one compile a cell,
    not two (the step runs the same tap pass; XLA may share it)."""
    cfg = CONFIGS[name]
    x, y = batch(cfg)
    gp = stages.prepare(cfg, x, None, remat, None)

    def run(params, x, y, clip):  # the batch an argument, as in ghost_run
        sites = stages.tap_pass(gp, params, x, y, dense, sums=True)[2].out
        request = ClipRequest(clip)
        step = ghost.ghost_clipped_grad_sum(
            cfg, params, x, y, request, remat=remat, method="bookkeeping", dense=dense
        )
        return {site.key: sites[site.key]["sq"] for site in gp.active}, step[:2]

    sq, (grads, norms) = fast_jit(run)(params_of(cfg), x, y, np.float32(clip_of(name)))
    found = {site.key: (site, np.asarray(sq[site.key], np.float64)) for site in gp.active}
    check_sites(name, remat, dense, found=found)
    grads = {k: np.asarray(v, np.float64) for k, v in flat_by_path(grads).items()}
    check_step(name, remat, dense=dense, ran=(grads, np.asarray(norms)))


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("remat", REMATS)
def test_each_layers_norms_are_taken_in_the_scan_and_sum_from_the_kept_pieces(name, remat):
    """The taps' per-layer, per-site squared norms are those of the per-example gradients, and
    the step's norms and clipped sum (made from what the taps kept) are the reference's."""
    check_sites_and_step(name, remat)


@pytest.mark.parametrize("name", ["transformer", "tied"])
def test_the_materialised_form_in_the_scan(name):
    """Per-example gradients formed in the backward pass, reduced to norms there and summed
    after: each layer's norms and the step (a tied head's too)."""
    check_sites_and_step(name, "dots", "materialise")


def test_a_materialised_op_takes_its_examples_in_chunks(monkeypatch):
    """A wide op forms its float32 per-example gradients a chunk of examples at a time (here one
    example a chunk): the same norms and sums."""
    monkeypatch.setattr(products, "MATERIALISE_CHUNK_BYTES", 1)
    assert products.examples_per_chunk(B, 10) == 1 and products.examples_per_chunk(8, 1 << 20) == 1
    check_sites_and_step("tied", "dots", "materialise")


@pytest.mark.parametrize("name", ["transformer", "tied"])
def test_auto_under_each_policy(name):
    for remat in ("dots", "full"):  # book-keeping, and the second backward
        check_step(name, remat, method="auto")


@pytest.mark.parametrize(
    "name, remat, dense", [("transformer", "dots", None), ("tied", "dots", "materialise")]
)
def test_bf16_steps_under_the_bf16_rule(name, remat, dense):
    """A bf16 step's norms and clipped sum (bf16 pieces, float32 norms and accumulation) are the
    float32 reference's under the bf16 rule."""
    clip = clip_of(name)
    ref_norms, ref_sum = clipped(reference(name), clip)
    grads, norms = ghost_run(name, remat, dense=dense, precision="bfloat16")
    assert_close_bf16(norms, ref_norms, n=n_of(name), what="norms")
    assert_close_bf16(grads, ref_sum, n=n_of(name), what="clipped sum")


def test_the_pieces_leave_the_pass_in_the_compute_dtype():
    """Under bf16 the kept pieces are bf16 (never float32 copies of every layer's), and the norms
    they hand out float32."""
    cfg = CONFIGS["transformer"]
    x, y = batch(cfg)
    for dense in ("gram", "materialise"):
        gp = stages.prepare(cfg, x, None, "dots", "bfloat16")
        out = jax.eval_shape(
            lambda p, gp=gp, dense=dense: stages.tap_pass(gp, p, x, y, dense, sums=True)[2].out,
            params_of(cfg),
        )
        for site in gp.active:
            got = out[site.key]
            assert got["sq"].dtype == jnp.float32
            if site.kind == "dense" and site.stacked:
                kept = {k: v.dtype for k, v in got["kept"].items()}
                wide = {"gb", "sq"}  # a bias's per-example gradient [B, d_out], the norms [B]
                assert {kept[k] for k in kept.keys() - wide} == {jnp.dtype(jnp.bfloat16)}, (
                    site.key,
                    dense,
                    kept,
                )
                assert all(kept[k] == jnp.float32 for k in kept.keys() & wide), (site.key, dense, kept)


# ------------------------------------------------------------------------------ planted bugs


def test_a_layers_norms_dropped_are_caught(monkeypatch):
    """Planted: the last layer's norms left out of the total."""
    real = stages.squared_norms

    def drop_last_layer(gp, out, units):
        out = {
            k: {**v, "sq": v["sq"].at[-1].set(0.0) if v["sq"].ndim == 3 else v["sq"]} for k, v in out.items()
        }
        return real(gp, out, units)

    monkeypatch.setattr(stages, "squared_norms", drop_last_layer)
    with pytest.raises(AssertionError, match="norms"):
        check_step("transformer", "dots")


def test_an_output_gradient_paired_with_the_wrong_example_is_caught(monkeypatch):
    """Planted: inside the backward pass each op's output gradient meets the next example's
    input, so every layer's norms (and the pieces kept) are wrong."""
    real = taps.tap_outputs
    monkeypatch.setattr(
        taps, "tap_outputs", lambda spec, inputs, dz: real(spec, inputs, jnp.roll(dz, 1, axis=0))
    )
    with pytest.raises(AssertionError, match="squared norms"):
        check_sites("llama", "dots")


def test_the_clip_factor_of_the_wrong_example_is_caught(monkeypatch):
    """Planted: the kept pieces summed with the clip factors rolled by one example."""
    real = stages.kept_sum
    monkeypatch.setattr(
        stages, "kept_sum", lambda gp, full, kept, w, use: real(gp, full, kept, jnp.roll(w, 1), use)
    )
    monkeypatch.setattr(ghost.api, "kept_sum", stages.kept_sum)
    with pytest.raises(AssertionError, match="clipped sum"):
        check_step("tied", "none")
