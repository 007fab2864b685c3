"""Ghost clipping (zoo.dp.ghost) against the vmap path (zoo.dp.clipped_grad_sum).

The reference differentiates the real models (``zoo.apply_fn`` in both backends) example by
example; ghost clipping never sees them. Norms and clipped sums must agree under the suite's
float rule (tests/numerics.py).
"""

import dataclasses
import functools
import warnings
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import zoo
from tests.conftest import fast_jit, reduction_size
from tests.numerics import assert_close as assert_float_close
from zoo.dp import ClipRequest, clipped_grad_sum, ghost
from zoo.freeze import resolve_freeze
from zoo.losses import per_example_loss
from zoo.models import ops, registry
from zoo.models.canonical import canonical_shapes
from zoo.models.mlp import nnx as nnx_mlp
from zoo.models.mlp.config import MLPConfig
from zoo.remat import get_policy
from zoo.scan import StackPlan, scan_layers

pytestmark = pytest.mark.numerics  # every test here compares floats from two programs

B = 6
# Every program here is compiled once, with conftest.FAST_COMPILE.

# Every registered kind's small config (a new kind is tested here without code), plus the
# transformer's feature-rows classifier.
KINDS = {kind.name: kind.small for kind in registry.kinds()}
CONFIGS = {**KINDS, "digits": zoo.get_config("transformer-digits", d_model=32, d_ff=64)}


def reduction(cfg) -> int:
    return reduction_size(cfg, B)


# Inputs and params come from numpy: every eager jax op would be one more XLA compile, and
# those add up to many seconds on a busy CPU.


@functools.cache
def params_of(cfg):
    """Random canonical params, LayerNorm gains and all biases away from 1 and 0 so that
    every leaf's gradient is exercised."""
    rng = np.random.default_rng(0)
    out: dict = {}
    for path, shape in sorted(canonical_shapes(cfg).items()):
        leaf = path.rsplit(".", 1)[-1]
        if leaf == "scale":
            value = 1.0 + 0.2 * rng.standard_normal(shape)
        elif leaf == "b":
            value = 0.1 * rng.standard_normal(shape)
        elif path == "pos.w" or (path == "embed.w" and not getattr(cfg, "d_in", 1)):
            value = 0.3 * rng.standard_normal(shape)  # embedding tables
        elif path.endswith("lora_b.w"):
            # The adapter's update (alpha / rank) A B sized like one dense layer's weights, not
            # alpha / rank times that: at 5x the base layer, llama's attention logits saturate
            # and the float32 norms of *either* path miss float64's by 5.6x the float rule.
            value = rng.standard_normal(shape) * shape[-2] ** -0.5 * cfg.lora.rank / cfg.lora.alpha
        else:
            value = rng.standard_normal(shape) * shape[-2] ** -0.5  # dense [in, out]
        node = out
        *parents, last = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = value.astype(np.float32)
    return out


def jit(fn):
    return fast_jit(fn)


def batch(cfg, seed=0, b=B):
    key = jax.random.key(seed + 100)
    x = cfg.example_input(key, b)
    return np.array(x), np.array(cfg.example_labels(jax.random.fold_in(key, 1), x))  # writable copies


ONES = np.ones(B, np.float32)
CLIP = np.float32(1.0)


def vmap_fn(cfg, backend, plan=None, remat="none"):
    """Jitted vmap-path clipped sum on the real model (frozen tree merged by ``plan``)."""
    return _vmap_fn(cfg, backend, plan, remat)


@functools.cache  # one compiled program per distinct setting
def _vmap_fn(cfg, backend, plan, remat):
    apply = zoo.apply_fn(cfg, backend)

    def loss(p, fz, xi, yi):
        full = p if plan is None else plan.merge(p, fz)
        return per_example_loss(apply(full, xi[None], remat), yi[None])[0]

    def run(params, frozen, x, y, clip, mask):
        request = ClipRequest(clip, example_mask=mask)
        return clipped_grad_sum(loss, params, x, y, request=request, frozen={} if frozen is None else frozen)[
            :2
        ]

    return jit(run)


def ghost_fn(cfg, plan=None, remat="none", method="auto", dense=None):
    return _ghost_fn(cfg, plan, remat, ghost.choose_method(remat, method), dense)


@functools.cache
def _ghost_fn(cfg, plan, remat, method, dense):
    def run(params, frozen, x, y, clip, mask):
        return ghost.ghost_clipped_grad_sum(
            cfg,
            params,
            x,
            y,
            ClipRequest(clip, example_mask=mask),
            frozen=frozen,
            freeze_plan=plan,
            remat=remat,
            method=method,
            dense=dense,
        )[:2]

    return jit(run)


def assert_close(cfg, ours, ref, norms, ref_norms):
    assert_float_close(norms, ref_norms, n=reduction(cfg), what="norms")
    assert_float_close(ours, ref, n=reduction(cfg), what="clipped sum")


def setup(cfg, patterns=None, x=None, y=None):
    params = params_of(cfg)
    if x is None:
        x, y = batch(cfg)
    plan, frozen = None, None
    if patterns:
        plan = resolve_freeze(params, patterns)
        params, frozen = plan.split(params)
    return params, frozen, plan, x, y


def compare(cfg, *, backend="nnx", x=None, y=None, mask=None, patterns=None, ref_remat="none", **ghost_kw):
    """Ghost vs vmap path at a clip bound between the norms (some clipped, some not)."""
    params, frozen, plan, x, y = setup(cfg, patterns, x, y)
    mask = ONES if mask is None else mask
    run = ghost_fn(cfg, plan, **ghost_kw)
    _, unclipped = run(params, frozen, x, y, np.float32(np.inf), mask)
    kept = np.asarray(mask) > 0
    clip = np.float32(np.median(np.asarray(unclipped)[kept]))
    ours, norms = run(params, frozen, x, y, clip, mask)
    ref, ref_norms = vmap_fn(cfg, backend, plan, ref_remat)(params, frozen, x, y, clip, mask)
    ref_kept = np.asarray(ref_norms)[kept]
    assert np.any(ref_kept > clip) and np.any(ref_kept < clip), "clipping should be partly active"
    assert_close(cfg, ours, ref, norms, ref_norms)
    return ours, norms


# --------------------------------------------------------------------------- the ghost forward


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ghost_forward_logits_equal_the_models(name):
    cfg = CONFIGS[name]
    params = params_of(cfg)
    x, _ = batch(cfg, seed=2)
    logits = jit(
        lambda p, x: {
            "ghost": ghost.ghost_forward(cfg, p, x)[0],
            **{b: zoo.apply_fn(cfg, b)(p, x) for b in ("nnx", "eqx")},
        }
    )
    out = logits(params, x)
    for backend in ("nnx", "eqx"):
        assert_float_close(out["ghost"], out[backend], n=reduction(cfg), what=backend)


# --------------------------------------------------------------------------- exactness


# Ghost clipping runs the NNX model whatever ``backend`` says (it only picks the fallback's
# model); an Equinox reference re-checks backend parity through the DP path, once.
@pytest.mark.parametrize(
    "name, backend", [*((kind, "nnx") for kind in KINDS), ("transformer", "eqx"), ("digits", "nnx")]
)
def test_matches_vmap_path(name, backend):
    compare(CONFIGS[name], backend=backend)


@pytest.mark.parametrize("kind", list(KINDS))
def test_second_backward_method_matches_vmap_path(kind):
    compare(KINDS[kind], method="backward")


@pytest.mark.parametrize("remat, method", [("full", "auto"), ("minimal", "bookkeeping"), ("dots", "auto")])
def test_remat_policies(remat, method):
    # "auto" picks the second backward under a policy that keeps nothing of a block, and
    # book-keeping under one that keeps some (see test_choose_method).
    compare(CONFIGS["transformer"], remat=remat, method=method)


def test_nested_remat():
    compare(CONFIGS["mlp"], remat="nested", method="bookkeeping")


def test_choose_method():
    """Book-keeping unless the policy keeps nothing of a block on the device: its pieces (each
    op's kept arrays, in the compute dtype) then cost about what the policy's own saved
    activations do, where under ``full`` they would be many times the step's memory."""
    for policy in ("none", "dots", "minimal", "save-attn", "custom:attn_q=device"):
        assert ghost.choose_method(policy) == "bookkeeping", policy
    assert ghost.choose_method(StackPlan(get_policy("minimal"), 1)) == "bookkeeping"
    for policy in ("full", "full-lean", "nested", "recursive", "offload-layer-input", "offload-minimal"):
        assert ghost.choose_method(policy) == "backward", policy
    assert ghost.choose_method("full", "bookkeeping") == "bookkeeping"


@pytest.mark.parametrize("dense", ["gram", "materialise"])
def test_repeated_tokens_are_merged_before_the_norm(dense):
    # Forces every sequence dense op and the token table into one norm form.
    cfg = CONFIGS["transformer"]
    x, y = batch(cfg, seed=3)
    x = x % 3  # few distinct tokens everywhere; example 0: one token; example 1: two tokens
    x[0] = 7
    x[1] = np.where(np.arange(x.shape[1]) % 2 == 0, 5, 9)
    compare(cfg, x=x, y=y, dense=dense)


@pytest.mark.parametrize("method", ["bookkeeping", "backward"])
def test_padding_mask_with_garbage_in_masked_slots(method):
    cfg = CONFIGS["digits"]
    x, y = batch(cfg, seed=4)
    x[1] = np.nan  # a padding slot full of NaN must not reach the sum
    mask = np.array([1, 0, 1, 1, 0, 1], np.float32)
    _, norms = compare(cfg, x=x, y=y, mask=mask, method=method)
    np.testing.assert_array_equal(np.asarray(norms)[[1, 4]], 0.0)


@pytest.mark.parametrize("method", ["bookkeeping", "backward"])
def test_unmasked_non_finite_example_is_dropped_but_reported(method):
    cfg = CONFIGS["digits"]
    params = params_of(cfg)
    x, y = batch(cfg, seed=5)
    x[2, 3] = np.inf
    ours, norms = ghost_fn(cfg, method=method)(params, None, x, y, CLIP, ONES)
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, CLIP, ONES)
    assert not np.isfinite(np.asarray(norms)[2]) and np.isfinite(np.asarray(norms)[[0, 1, 3]]).all()
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in jax.tree.leaves(ours))
    assert_close(cfg, ours, ref, norms, ref_norms)


def test_padding_mask_mlp():
    compare(CONFIGS["mlp"], mask=np.array([0, 1, 1, 0, 1, 1], np.float32))


def test_the_float_rule_still_catches_ghost_bugs():
    """Negative test for this family: a clip bound at 1.01 C and a dropped mask are caught at the
    tolerance every comparison above uses."""
    cfg = CONFIGS["mlp"]
    params, _, _, x, y = setup(cfg)
    mask = np.array([0, 1, 1, 0, 1, 1], np.float32)
    run = ghost_fn(cfg)
    clip = np.float32(np.median(np.asarray(run(params, None, x, y, np.float32(np.inf), mask)[1])[mask > 0]))
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, clip, mask)
    ours, norms = run(params, None, x, y, clip, mask)
    assert_close(cfg, ours, ref, norms, ref_norms)  # passes without a bug
    with pytest.raises(AssertionError, match="clipped sum"):
        assert_close(cfg, run(params, None, x, y, np.float32(1.01) * clip, mask)[0], ref, norms, ref_norms)
    with pytest.raises(AssertionError, match="clipped sum"):
        assert_close(cfg, run(params, None, x, y, clip, ONES)[0], ref, norms, ref_norms)


def test_frozen_layers():
    cfg = CONFIGS["transformer"]
    ours, _ = compare(cfg, patterns=["embed", "blocks[0:1]"], method="bookkeeping")
    assert "embed" not in ours  # frozen leaves get no gradient at all
    assert ours["blocks"]["attn"]["q"]["w"].shape[0] == cfg.num_layers - 1


def test_frozen_rows_that_are_not_a_prefix_second_backward():
    # Layer 1 of the MLP, ln_f and the positions frozen: the norm skips exactly those.
    ours, _ = compare(
        CONFIGS["transformer"], patterns=["blocks[1].mlp", "ln_f", "pos"], remat="full", method="backward"
    )
    assert ours["blocks"]["mlp"]["up"]["w"].shape[0] == 1 and "ln_f" not in ours


@pytest.mark.parametrize("kind", list(KINDS))
def test_lora_adapters_on_a_frozen_base(kind):
    # DP-LoRA: each adapter half is a dense op, so its ghost norm is the dense rule's; the base
    # is frozen (only adapters, and in one layer only, are differentiated on the transformer).
    from zoo import lora
    from zoo.configs import LoraConfig

    base = KINDS[kind]
    targets = ("blocks[1].attn.*", "head") if kind == "transformer" else ("*",)
    setup = lora.resolve(base, LoraConfig(rank=3, targets=targets))
    cfg = lora.adapted_config(base, setup)
    plan = lora.freeze_plan(cfg, setup)
    params, frozen = plan.split(params_of(cfg))
    x, y = batch(cfg)
    run = ghost_fn(cfg, plan)
    _, unclipped = run(params, frozen, x, y, np.float32(np.inf), ONES)
    clip = np.float32(np.median(np.asarray(unclipped)))
    ours, norms = run(params, frozen, x, y, clip, ONES)
    ref, ref_norms = vmap_fn(cfg, "nnx", plan)(params, frozen, x, y, clip, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)
    assert all("lora_" in path for path in zoo.models.paths.flat_by_path(ours))


def test_stack_plan_frozen_prefix_gets_no_gradient():
    # StackPlan(frozen_prefix=1) stop-gradients layer 0, like freezing blocks[0:1].
    cfg = CONFIGS["mlp"]
    params, frozen, plan, x, y = setup(cfg, ["head.b"])
    stack = StackPlan(get_policy("none"), frozen_prefix=1)
    ours, norms = ghost_fn(cfg, plan, stack)(params, frozen, x, y, CLIP, ONES)
    np.testing.assert_array_equal(np.asarray(ours["blocks"]["dense"]["w"][0]), 0.0)
    ref_plan = resolve_freeze(params_of(cfg), ["head.b", "blocks[0:1]"])
    trainable, ref_frozen = ref_plan.split(params_of(cfg))
    ref, ref_norms = vmap_fn(cfg, "nnx", ref_plan)(trainable, ref_frozen, x, y, CLIP, ONES)
    ours["blocks"] = jax.tree.map(lambda a: np.asarray(a)[1:], ours["blocks"])
    assert_close(cfg, ours, ref, norms, ref_norms)


def test_disjoint_frozen_tree_without_a_plan():
    cfg = CONFIGS["mlp"]
    params, frozen, plan, x, y = setup(cfg, ["head"])
    ours = ghost_fn(cfg, None)(params, frozen, x, y, CLIP, ONES)
    ref = vmap_fn(cfg, "eqx", plan)(params, frozen, x, y, CLIP, ONES)
    assert_close(cfg, ours[0], ref[0], ours[1], ref[1])


def test_engine_style_call_returns_losses_too():
    # How zoo.train.engine calls it: a FreezePlan that may freeze nothing, a StackPlan.
    cfg = CONFIGS["mlp"]
    params = params_of(cfg)
    x, y = batch(cfg)
    plan = resolve_freeze(params, [])
    trainable, frozen = plan.split(params)
    run = jit(
        lambda t, f: ghost.ghost_clipped_grad_sum(
            cfg,
            t,
            x,
            y,
            ClipRequest(1.0, example_mask=ONES),
            frozen=f,
            freeze_plan=plan,
            remat=StackPlan(get_policy("none")),
        )
    )
    grads, norms, losses = run(trainable, frozen)
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, CLIP, ONES)
    assert_close(cfg, grads, ref, norms, ref_norms)
    expected = jit(lambda p: per_example_loss(zoo.apply_fn(cfg, "nnx")(p, x), y))(params)
    assert_float_close(losses, expected, n=reduction(cfg))


# --------------------------------------------------------------------------- support and errors


def test_supports_and_reason():
    for cfg in CONFIGS.values():
        assert ghost.supports(cfg) and ghost.unsupported_reason(cfg) is None
    assert not ghost.supports(object())
    assert "registered model config" in ghost.unsupported_reason(object())


class Shift(nnx.Module):
    def __init__(self, width: int):
        self.bias = nnx.Param(jnp.zeros((width,)))


class ShiftedMLP(nnx_mlp.MLP):
    """The zoo MLP plus a learned shift that the model adds by hand, outside the op set: no
    site claims ``shift.b``, so ghost clipping would give it a zero gradient."""

    def __init__(self, cfg, *, rngs):
        super().__init__(cfg, rngs=rngs)
        self.shift = Shift(cfg.d_hidden)

    def __call__(self, x, *, remat="none"):
        h = ops.ACTIVATIONS[self.cfg.activation](ops.dense(self.in_proj, x)) + self.shift.bias[...]
        return ops.dense(self.head, scan_layers(*self.stack(), h, remat))


@dataclasses.dataclass(frozen=True)
class ShiftedMLPConfig(MLPConfig):
    kind: ClassVar[str] = "shifted-mlp"


@pytest.fixture
def shifted_mlp():
    """A throwaway registered kind (NNX only: the test never builds the Equinox side)."""
    registry.register(ShiftedMLPConfig, nnx=ShiftedMLP, eqx=ShiftedMLP, presets={})
    yield ShiftedMLPConfig(**dataclasses.asdict(CONFIGS["mlp"]))
    registry.unregister(ShiftedMLPConfig.kind)


def test_a_parameter_no_op_claims_falls_back_to_vmap_with_a_warning(shifted_mlp):
    cfg = shifted_mlp
    params = params_of(cfg)
    x, y = batch(cfg)
    assert "['shift.b']" in ghost.unsupported_reason(cfg, x)
    with pytest.warns(UserWarning, match=r"\['shift\.b'\].*vmap path"):
        ours, norms = jit(
            lambda p: ghost.ghost_clipped_grad_sum(cfg, p, x, y, ClipRequest(1.0, example_mask=ONES))[:2]
        )(params)
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, CLIP, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)
    assert np.abs(np.asarray(ours["shift"]["b"])).max() > 0  # it trains
    # Frozen, the leaf needs no site: ghost clipping runs again.
    plan = resolve_freeze(params, ["shift.*"])
    assert ghost.supports(cfg, x, plan)
    trainable, frozen = plan.split(params)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ours, norms = jit(
            lambda p: ghost.ghost_clipped_grad_sum(
                cfg, p, x, y, ClipRequest(1.0, example_mask=ONES), frozen=frozen, freeze_plan=plan
            )[:2]
        )(trainable)
    ref, ref_norms = vmap_fn(cfg, "nnx", plan)(trainable, frozen, x, y, CLIP, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)


def test_bad_arguments():
    cfg = CONFIGS["mlp"]
    params = params_of(cfg)
    x, y = batch(cfg)
    with pytest.raises(ValueError, match="clip_norm must be > 0"):
        ghost.ghost_clipped_grad_sum(cfg, params, x, y, ClipRequest(0.0))
    with pytest.raises(ValueError, match="example_mask"):
        ghost.ghost_clipped_grad_sum(cfg, params, x, y, ClipRequest(1.0, example_mask=np.ones(3)))
    with pytest.raises(ValueError, match="method"):
        ghost.ghost_clipped_grad_sum(cfg, params, x, y, ClipRequest(1.0), method="twice")


def test_dense_method_rule():
    assert ghost.dense_method(64, 64, 64) == "materialise"
    assert ghost.dense_method(4, 512, 512) == "gram"
    assert ghost.dense_method(1024, 64, 256) == "materialise"


def test_an_op_on_a_transformed_weight_is_a_coverage_problem():
    """A weight read through a transform (a head tied to the embedding by a transpose) is not
    recognised by any site; its norm would be missed, so the call must fall back."""
    from zoo.dp.ghost.sites import coverage_problem, discover

    cfg = CONFIGS["mlp"]
    sites, unknown = discover(cfg, batch(cfg)[0])
    trainable = set(canonical_shapes(cfg))
    assert unknown == () and coverage_problem(sites, unknown, trainable) is None
    assert "dense op(s) read arrays that are not canonical leaves" in coverage_problem(
        sites, ("dense",), trainable
    )
    assert "['head.w']" in coverage_problem(
        [s for s in sites if s.path != "head"], (), trainable - {"head.b"}
    )


@pytest.mark.parametrize("method", ["bookkeeping", "backward"])
def test_numpy_params_outside_jit_are_recognised(method):
    """Sites are found by array identity; numpy leaves called eagerly (not tracers) must still be
    recognised, or a site would silently drop out of the norm."""
    cfg = CONFIGS["mlp"]
    params = params_of(cfg)  # numpy arrays
    x, y = batch(cfg)
    ours, norms, _ = ghost.ghost_clipped_grad_sum(
        cfg, params, x, y, ClipRequest(CLIP, example_mask=ONES), method=method
    )
    ref, ref_norms = vmap_fn(cfg, "nnx")(params, None, x, y, CLIP, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)
