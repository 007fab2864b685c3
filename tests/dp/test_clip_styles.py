"""Clipping styles (zoo.dp.groups): all-layer, layer-wise and block-wise, by every method,
against per-example gradients from ``jax.vmap(jax.grad)`` clipped group by group in float64
numpy here (the groups written out again in this file, not read from zoo)."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, reduction_size
from tests.dp.ghost.test_api import batch, params_of
from tests.numerics import assert_close
from zoo.dp import ClipRequest, ghost
from zoo.dp.clipping import ClipModel, clipping_method
from zoo.dp.groups import ClipStyle, members
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.losses import per_example_loss
from zoo.models import registry
from zoo.scan import as_plan

pytestmark = pytest.mark.numerics

B = 6
SMALL = {kind.name: kind.small for kind in registry.kinds()}
CONFIGS = {
    "mlp": SMALL["mlp"],
    "transformer": SMALL["transformer"],
    "tied": dataclasses.replace(SMALL["transformer"], tie_head=True),
    "cnn": SMALL["cnn"],
}
# Block-wise groups of the transformer, with unequal thresholds: a group clipped against
# another's threshold shows.
BLOCKS = ("low = embed|pos|blocks[0]", "high = blocks[1]|ln_f", "head = head")
WEIGHTS = {"low": 1.0, "high": 2.0, "head": 0.5}


# --------------------------------------------------------------------------- the oracle


def _op(path):
    return path.rsplit(".", 1)[0]


def oracle_group(style, path, layer):
    """The group of a leaf (``layer``: its row in the stack, or None), written out here."""
    if style == "all-layer":
        return "all"
    if style == "layer-wise":
        return (_op(path), layer)
    if path.startswith(("embed", "pos")) or (path.startswith("blocks") and layer == 0):
        return "low"
    return "head" if path.startswith("head") else "high"


def oracle_thresholds(style, names, clip):
    if style != "block-wise":
        return {n: clip / np.sqrt(len(names)) for n in names}
    w = {n: WEIGHTS[n] for n in names}
    total = np.sqrt(sum(v * v for v in w.values()))
    return {n: clip * w[n] / total for n in names}


@functools.cache
def _per_example_grads(name):
    cfg = CONFIGS[name]
    apply = zoo.apply_fn(cfg, "nnx")

    def loss(p, xi, yi):
        return per_example_loss(apply(p, xi[None], "none"), yi[None])[0]

    return fast_jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))


def oracle(name, style, clip, mask):
    """``(clipped sum, global norms)`` in float64 from per-example gradients."""
    x, y = batch(CONFIGS[name])
    grads = _per_example_grads(name)(params_of(CONFIGS[name]), x, y)
    parts = {}  # (group) -> list of (path, row, [B, ...] float64)
    for path, g in zoo.models.paths.flat_by_path(grads).items():
        g = np.asarray(g, np.float64)
        if path.startswith("blocks."):
            for r in range(g.shape[1]):
                parts.setdefault(oracle_group(style, path, r), []).append((path, r, g[:, r]))
        else:
            parts.setdefault(oracle_group(style, path, None), []).append((path, None, g))
    limits = oracle_thresholds(style, list(parts), clip)
    out, total = {}, np.zeros(B)
    for group, leaves in parts.items():
        sq = sum(np.sum(g.reshape(B, -1) ** 2, axis=1) for _, _, g in leaves)
        total += sq
        norm = np.sqrt(sq)
        f = np.where(norm > limits[group], limits[group] / np.where(norm > 0, norm, 1), 1.0) * mask
        for path, r, g in leaves:
            s = np.tensordot(f, g, axes=1)
            if r is None:
                out[path] = s
            else:
                out.setdefault(path, np.zeros((2, *s.shape)))[r] = s
    return zoo.models.paths.nest_by_path(out), np.sqrt(total) * mask


# --------------------------------------------------------------------------- zoo's methods


def style_of(name, style):
    """The style; block-wise: the groups of BLOCKS that hold a parameter of the model (the tied
    transformer has no head leaf)."""
    if style != "block-wise":
        return ClipStyle(style)
    blocks = BLOCKS[:2] if name == "tied" else BLOCKS
    return ClipStyle("block-wise", blocks, tuple(WEIGHTS[b.split(" ")[0]] for b in blocks))


@functools.cache
def zoo_fn(name, style, method):
    cfg = CONFIGS[name]
    request_style = style_of(name, style)

    def run(params, x, y, clip, mask):
        request = ClipRequest(clip, example_mask=mask, style=request_style)
        if method == "vmap":
            apply = zoo.apply_fn(cfg, "nnx")

            def loss(p, fz, xi, yi):
                return per_example_loss(apply(p, xi[None], "none"), yi[None])[0]

            model = ClipModel(cfg, "nnx", as_plan("none"), None, loss)
            return clipping_method("vmap").clip(model, params, {}, {"x": x, "y": y}, request)[:2]
        return ghost.ghost_clipped_grad_sum(cfg, params, x, y, request, method=method)[:2]

    return fast_jit(run)


CASES = [
    *((n, s, m) for n in CONFIGS for s in ("all-layer", "layer-wise") for m in ("vmap", "bookkeeping")),
    *(("transformer", "block-wise", m) for m in ("vmap", "bookkeeping")),
    *(("tied", "block-wise", m) for m in ("vmap", "bookkeeping")),
    *((n, "all-layer", "backward") for n in CONFIGS),
]


@pytest.mark.parametrize("name, style, method", CASES)
def test_style_matches_per_example_gradients(name, style, method):
    cfg = CONFIGS[name]
    x, y = batch(cfg)
    mask = np.array([1, 1, 1, 0, 1, 1], np.float32)
    _, norms = oracle(name, style, np.inf, mask)
    clip = float(np.median(norms[mask > 0]))
    ours, our_norms = zoo_fn(name, style, method)(params_of(cfg), x, y, np.float32(clip), mask)
    ref, ref_norms = oracle(name, style, clip, mask)
    n = reduction_size(cfg, B)
    assert_close(our_norms, ref_norms, n=n, what="norms")
    assert_close(ours, ref, n=n, what=f"{style} clipped sum by {method}")


def test_layer_wise_is_clipped_per_layer_not_flat():
    """The comparison can tell the styles apart: layer-wise differs from all-layer."""
    cfg = CONFIGS["transformer"]
    x, y = batch(cfg)
    mask = np.ones(B, np.float32)
    flat, _ = oracle("transformer", "all-layer", 1.0, mask)
    layer, _ = oracle("transformer", "layer-wise", 1.0, mask)
    assert np.abs(flat["head"]["w"] - layer["head"]["w"]).max() > 1e-3
    ours, _ = zoo_fn("transformer", "layer-wise", "bookkeeping")(params_of(cfg), x, y, np.float32(1.0), mask)
    assert_close(ours, layer, n=reduction_size(cfg, B))


def test_layer_wise_groups_are_ops_per_layer():
    cfg = CONFIGS["transformer"]
    groups = ClipStyle("layer-wise").resolve(members(params_of(cfg)))
    assert "blocks[1].attn.q" in groups.names and "head" in groups.names and "ln_f" in groups.names
    assert groups.count == 4 + 2 * 8  # embed, pos, ln_f, head; 8 ops in each of 2 layers
    assert np.allclose(np.square(groups.shares).sum(), 1.0)
    assert groups.thresholds(2.0)["head"] == pytest.approx(2.0 / np.sqrt(20))


def test_layer_wise_freezes_rows_out_of_the_groups():
    cfg = CONFIGS["transformer"]
    plan = resolve_freeze(params_of(cfg), ["blocks[0]"])
    trainable, _ = plan.split(params_of(cfg))
    groups = ClipStyle("layer-wise").resolve(members(trainable, plan))
    assert not any(n.startswith("blocks[0]") for n in groups.names)
    assert groups.count == 4 + 8


def test_backward_method_refused_for_grouped_styles():
    cfg = CONFIGS["transformer"]
    x, y = batch(cfg)
    request = ClipRequest(1.0, style=ClipStyle("layer-wise"))
    with pytest.raises(ValueError, match="all-layer only"):
        ghost.ghost_clipped_grad_sum(cfg, params_of(cfg), x, y, request, method="backward")


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"style": "per-layer"}, "Valid: all-layer, block-wise, layer-wise"),
        ({"style": "layer-wise", "groups": ("a = head",)}, "block-wise settings"),
        ({"style": "block-wise"}, "needs dp.clip_groups"),
        ({"style": "block-wise", "groups": ("head",)}, "not 'name = pattern"),
        ({"style": "block-wise", "groups": ("a = head", "a = embed")}, "twice"),
        ({"style": "block-wise", "groups": ("a = head",), "weights": (1.0, 2.0)}, "one per group"),
        ({"style": "block-wise", "groups": ("a = head",), "weights": (-1.0,)}, "> 0"),
    ],
)
def test_style_refusals(settings, message):
    with pytest.raises(ZooError, match=message):
        ClipStyle(**settings)


@pytest.mark.parametrize(
    "groups, message",
    [
        (("a = embed|pos|blocks", "b = head"), r"ln_f\.b in no group"),
        (("a = embed|pos|blocks|ln_f|head", "b = head.*"), r"head\.b is in 'a' and 'b'.*'head', 'head\.\*'"),
        (("a = embed|pos|blocks[0]|ln_f|head", "b = blocks[0:2]"), r"layer 0\) is in 'a' and 'b'"),
    ],
)
def test_block_groups_must_cover_once(groups, message):
    with pytest.raises(ZooError, match=message):
        ClipStyle("block-wise", groups).resolve(members(params_of(CONFIGS["transformer"])))


@pytest.mark.parametrize("epsilon", [None, 2.0])
def test_epsilon_and_noise_do_not_depend_on_the_style(epsilon):
    """clip_norm is the sensitivity of every style: the calibrated noise multiplier, epsilon and
    the noise std (noise_multiplier * clip_norm) are the flat style's."""
    from zoo.configs import DPConfig
    from zoo.dp.plan import make_plan
    from zoo.parallel import layout_for

    layout = layout_for(registry.get_config("mlp-s"))
    base = DPConfig(enabled=True, epsilon=epsilon, noise_multiplier=None if epsilon else 1.1, clip_norm=0.7)
    styles = {
        "all-layer": base,
        "layer-wise": dataclasses.replace(base, clipping_style="layer-wise"),
        "block-wise": dataclasses.replace(
            base,
            clipping_style="block-wise",
            clip_groups=("a = in_proj", "b = blocks|head"),
            clip_group_weights=(1, 3),
        ),
    }
    plans = {
        name: make_plan(dp, 1000, 50, layout, seed=0, microbatch_size=None) for name, dp in styles.items()
    }
    for name, plan in plans.items():
        assert plan.clip_style.style == name
        assert plan.noise_multiplier == plans["all-layer"].noise_multiplier
        assert plan.epsilon == plans["all-layer"].epsilon
        assert plan.made.noise.clip_norm == 0.7  # the std is noise_multiplier * clip_norm
