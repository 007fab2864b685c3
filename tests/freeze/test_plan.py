"""Freezing by path pattern: matching, errors, exact split/merge, frozen prefix, gradients,
and the structural claim that a frozen prefix gets no backward pass."""

import collections
import re

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, loss_of, random_params, reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo.errors import ZooError
from zoo.freeze import FreezePlan, Trainable, parse_pattern, resolve_freeze
from zoo.jaxprs import iter_eqns
from zoo.models.canonical import canonical_shapes, init_params
from zoo.models.paths import flat_by_path
from zoo.remat import get_policy
from zoo.scan import StackPlan

XS = zoo.get_config("transformer-xs")  # 2 layers
MLP = zoo.get_config("mlp-s")  # 1 layer
SMALL4 = zoo.get_config("transformer-xs", num_layers=4, d_model=32, d_ff=64, max_len=8, vocab_size=40)

STACKED_XS = sorted(p for p in canonical_shapes(XS) if p.startswith("blocks."))


def frozen_view(plan: FreezePlan) -> dict:
    """{path: 'all' | frozen rows} for every leaf with something frozen."""
    out = {p: "all" for p in plan.frozen_leaves}
    out.update({p: r for p, r in plan.frozen_rows.items()})
    return out


def sizes(tree) -> int:
    return sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(tree))


def flat_paths(tree) -> set:
    return set(flat_by_path(tree))


def run_compiled(fn, *args):
    """``fn`` compiled with conftest.FAST_COMPILE, run on ``args``."""
    return fast_jit(fn)(*args)


@pytest.fixture(scope="module")
def reference():
    params = random_params(canonical_shapes(SMALL4), 1)
    rng = np.random.default_rng(2)
    x, y = (rng.integers(0, SMALL4.vocab_size, (3, SMALL4.max_len), dtype=np.int32) for _ in "xy")
    grads = run_compiled(jax.grad(loss_of(SMALL4, "nnx")), params, x, y)
    return params, x, y, grads


# ----------------------------------------------------------------------------- matching


@pytest.mark.parametrize(
    "patterns,expected",
    [
        (["embed"], {"embed.w": "all"}),
        (["head.*"], {"head.w": "all", "head.b": "all"}),
        (["blocks.attn.*"], {f"blocks.attn.{n}.w": (0, 1) for n in "qkvo"}),
        (["blocks.attn"], {f"blocks.attn.{n}.w": (0, 1) for n in "qkvo"}),
        (["blocks[0:1]"], {p: (0,) for p in STACKED_XS}),
        (["blocks[0:1].mlp.*"], {p: (0,) for p in STACKED_XS if p.startswith("blocks.mlp.")}),
        (["blocks[-1]"], {p: (1,) for p in STACKED_XS}),
        (
            ["blocks[:1].ln1", "blocks[1:].ln2.b"],
            {"blocks.ln1.b": (0,), "blocks.ln1.scale": (0,), "blocks.ln2.b": (1,)},
        ),
        (["pos", "ln_f.scale"], {"pos.w": "all", "ln_f.scale": "all"}),
    ],
)
def test_transformer_patterns(patterns, expected):
    plan = resolve_freeze(canonical_shapes(XS), patterns)
    assert frozen_view(plan) == expected


def test_prefix_matches_on_segment_boundaries_only():
    shapes = {"embed.w": (4, 2), "embedding.w": (4, 2), "blocks.x.w": (2, 3)}
    assert frozen_view(resolve_freeze(shapes, ["embed"])) == {"embed.w": "all"}


@pytest.mark.parametrize(
    "patterns,expected",
    [
        (["in_proj"], {"in_proj.w": "all", "in_proj.b": "all"}),
        (["head.*"], {"head.w": "all", "head.b": "all"}),
        (["blocks.dense.w"], {"blocks.dense.w": (0,)}),
        (["blocks[0:1]"], {"blocks.dense.w": (0,), "blocks.dense.b": (0,)}),
        (["blocks[-1]"], {"blocks.dense.w": (0,), "blocks.dense.b": (0,)}),
        (["*.b"], {"in_proj.b": "all", "head.b": "all", "blocks.dense.b": (0,)}),
    ],
)
def test_mlp_patterns(patterns, expected):
    plan = resolve_freeze(canonical_shapes(MLP), patterns)
    assert frozen_view(plan) == expected


def test_params_shapes_abstract_params_and_shape_dict_agree(reference):
    patterns = ["embed", "blocks[1].mlp.*"]
    from_shapes = resolve_freeze(canonical_shapes(SMALL4), patterns)
    from_params = resolve_freeze(reference[0], patterns)
    from_abstract = resolve_freeze(jax.eval_shape(lambda: init_params(SMALL4)), patterns, num_layers=4)
    assert frozen_view(from_shapes) == frozen_view(from_params) == frozen_view(from_abstract)
    assert from_shapes == from_params == from_abstract


def test_parse_pattern():
    assert parse_pattern("blocks[1:3].mlp.*").path == "blocks.mlp.*"
    assert parse_pattern("blocks[1:3].mlp.*").layers == slice(1, 3, None)
    assert parse_pattern("blocks[-1]").layers == -1
    assert parse_pattern("head.*").layers is None


# ----------------------------------------------------------------------------- errors


def test_no_match_lists_paths_and_close_matches():
    with pytest.raises(ZooError) as info:
        resolve_freeze(canonical_shapes(XS), ["embed", "embd"])
    message = str(info.value)
    assert "'embd'" in message and "Did you mean 'embed'" in message
    for path in canonical_shapes(XS):
        assert path in message


def test_no_match_inside_the_stack():
    with pytest.raises(ZooError, match=r"'blocks\[0\]\.mlpp'.*matches no parameter.*blocks\.mlp\.up\.w"):
        resolve_freeze(canonical_shapes(XS), ["blocks[0].mlpp"])


@pytest.mark.parametrize("pattern", ["blocks[2]", "blocks[-3]", "blocks[2:]", "blocks[5:9]", "blocks[1:1]"])
def test_range_selecting_no_layer(pattern):
    with pytest.raises(ZooError, match=re.escape(repr(pattern)) + ".*2 layers"):
        resolve_freeze(canonical_shapes(XS), [pattern])


@pytest.mark.parametrize("pattern", ["head[0]", "embed[0:1].w", "blocks.attn[0]", "*[0]"])
def test_range_on_non_stack_path(pattern):
    with pytest.raises(ZooError, match=re.escape(repr(pattern)) + ".*only allowed directly after 'blocks'"):
        resolve_freeze(canonical_shapes(XS), [pattern])


@pytest.mark.parametrize(
    "pattern",
    [
        "",
        "  ",
        "blocks[0",
        "blocks]0[",
        "blocks[0][1]",
        "blocks[a:b]",
        "blocks[]",
        "blocks[0]mlp",
        "embed..w",
        ".embed",
        "embed.",
        "emb ed",
        "blocks[::0]",
        "head/w",
    ],
)
def test_malformed(pattern):
    with pytest.raises(ZooError, match="malformed freeze pattern " + re.escape(repr(pattern))):
        resolve_freeze(canonical_shapes(XS), [pattern])


def test_num_layers_must_agree():
    with pytest.raises(ZooError, match="num_layers=3"):
        resolve_freeze(canonical_shapes(XS), ["embed"], num_layers=3)


# ----------------------------------------------------------------------------- split / merge


@pytest.fixture(scope="module")
def params_by_cfg():
    configs = {"xs": XS, "small4": SMALL4, "mlp": MLP}
    return {name: random_params(canonical_shapes(cfg), 3) for name, cfg in configs.items()}


@pytest.mark.parametrize(
    "cfg,patterns",
    [
        ("xs", ["embed", "pos", "blocks[0:1]"]),
        ("xs", ["blocks[0:1].mlp.*", "head.b"]),
        ("small4", ["blocks[::2]", "blocks[1].attn.q"]),  # non-contiguous rows
        ("small4", ["blocks.ln1", "blocks[1:3]"]),
        ("mlp", ["in_proj", "blocks"]),
        ("xs", []),
    ],
)
def test_split_merge_round_trip(params_by_cfg, cfg, patterns):
    params = params_by_cfg[cfg]
    plan = resolve_freeze(params, patterns)
    trainable, frozen = run_compiled(plan.split, params)

    for path in flat_paths(trainable):
        assert not plan.trainable(path).none
        assert path not in plan.frozen_leaves
    for path in flat_paths(frozen):
        assert path in plan.frozen_leaves or path in plan.frozen_rows
    assert sizes(trainable) == plan.trainable_count
    assert sizes(frozen) == plan.frozen_count
    assert plan.trainable_count + plan.frozen_count == sizes(params)

    merged = run_compiled(plan.merge, trainable, frozen)
    assert jax.tree_util.tree_structure(merged) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(merged), jax.tree_util.tree_leaves(params), strict=True):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))


def test_split_merge_eager_matches_jit(params_by_cfg):
    params = random_params({"blocks.x.w": (5, 2, 3), "blocks.x.b": (5, 3), "head.w": (3, 2)}, 5)
    plan = resolve_freeze(params, ["blocks[::2].x.w", "blocks[3].x", "head"])
    trainable, frozen = plan.split(params)
    assert_bitwise_equal((trainable, frozen), run_compiled(plan.split, params))
    assert_bitwise_equal(plan.merge(trainable, frozen), params)


def test_split_rows_content(params_by_cfg):
    params = params_by_cfg["small4"]
    plan = resolve_freeze(params, ["blocks[0]", "blocks[2].mlp.up"])
    trainable, frozen = plan.split(params)
    up = np.asarray(params["blocks"]["mlp"]["up"]["w"])
    np.testing.assert_array_equal(frozen["blocks"]["mlp"]["up"]["w"], up[[0, 2]])
    np.testing.assert_array_equal(trainable["blocks"]["mlp"]["up"]["w"], up[[1, 3]])
    ln1_b = np.asarray(params["blocks"]["ln1"]["b"])
    np.testing.assert_array_equal(trainable["blocks"]["ln1"]["b"], ln1_b[1:])
    assert "embed" not in frozen and "head" not in frozen  # empty subtrees omitted


def test_fully_frozen_leaves_absent_from_trainable(params_by_cfg):
    params = params_by_cfg["xs"]
    plan = resolve_freeze(params, ["embed", "blocks.attn", "head.*"])
    trainable, frozen = plan.split(params)
    assert "embed" not in trainable and "head" not in trainable
    assert "attn" not in trainable["blocks"]
    assert set(frozen) == {"embed", "head", "blocks"} and set(frozen["blocks"]) == {"attn"}


def test_trainable_is_a_typed_value_printed_as_a_table_cell():
    plan = resolve_freeze(canonical_shapes(SMALL4), ["embed", "blocks[1:3].mlp.*", "blocks.ln1"])
    assert plan.trainable("embed.w") == Trainable(whole=False)
    assert plan.trainable("head.w") == Trainable(whole=True)
    assert plan.trainable("blocks.attn.q.w") == Trainable(True, (0, 1, 2, 3), 4)
    assert plan.trainable("blocks.ln1.b") == Trainable(False, (), 4)
    partly = plan.trainable("blocks.mlp.up.w")
    assert partly == Trainable(False, (0, 3), 4) and partly.partial and not partly.none
    assert [str(plan.trainable(p)) for p in ("embed.w", "head.w", "blocks.attn.q.w", "blocks.ln1.b")] == [
        "no",
        "yes",
        "yes",
        "no",
    ]
    assert str(partly) == "layers 0:1,3:4 of 4"
    assert (
        str(resolve_freeze(canonical_shapes(SMALL4), ["blocks[:2]"]).trainable("blocks.mlp.up.w"))
        == "layers 2:4 of 4"
    )
    with pytest.raises(ZooError, match="Did you mean 'head.w'"):
        plan.trainable("head.ww")


def test_merge_rejects_trees_that_do_not_fit(params_by_cfg):
    params = params_by_cfg["xs"]
    plan = resolve_freeze(params, ["embed"])
    trainable, frozen = plan.split(params)
    with pytest.raises(ZooError, match="frozen tree.*missing.*embed.w"):
        plan.merge(trainable, {})


# ----------------------------------------------------------------------------- frozen prefix


@pytest.mark.parametrize(
    "patterns,prefix",
    [
        (["blocks[0:1]"], 1),
        (["blocks[0:1].mlp.*"], 0),
        (["embed", "pos"], 0),
        (["blocks[1]"], 0),
        (["blocks[:]"], 2),
        (["blocks[0:1].mlp.*", "blocks[0].attn", "blocks.ln1", "blocks[0].ln2"], 1),
        (["blocks[0:1]", "blocks[1].mlp.*"], 1),
    ],
)
def test_frozen_prefix(patterns, prefix):
    assert resolve_freeze(canonical_shapes(XS), patterns).frozen_prefix == prefix


def test_stack_plan():
    plan = resolve_freeze(canonical_shapes(SMALL4), ["blocks[:3]"])
    assert plan.stack_plan("full") == StackPlan(get_policy("full"), frozen_prefix=3)


# ----------------------------------------------------------------------------- gradients


FROZEN_PREFIX_2 = ["embed", "pos", "blocks[0:2]"]
PARTIAL_MLP = ["blocks[1:3].mlp.*"]


# Every (pattern, policy) and (backend, policy) pair occurs once and every (pattern, backend)
# pair at least once: all pairwise combinations, with 6 compiles instead of 12.
@pytest.mark.numerics
@pytest.mark.parametrize(
    "patterns,prefix,backend,policy",
    [
        (FROZEN_PREFIX_2, 2, "nnx", "none"),
        (FROZEN_PREFIX_2, 2, "eqx", "full"),
        (FROZEN_PREFIX_2, 2, "eqx", "minimal"),
        (PARTIAL_MLP, 0, "eqx", "none"),
        (PARTIAL_MLP, 0, "nnx", "full"),
        (PARTIAL_MLP, 0, "nnx", "minimal"),
    ],
)
def test_frozen_gradients_match_full_model(reference, patterns, prefix, backend, policy):
    params, x, y, full_grads = reference
    plan = resolve_freeze(params, patterns)
    assert plan.frozen_prefix == prefix
    trainable, frozen = plan.split(params)
    loss = loss_of(SMALL4, backend, StackPlan(get_policy(policy), frozen_prefix=plan.frozen_prefix))

    grads = run_compiled(jax.grad(lambda t, f: loss(plan.merge(t, f), x, y)), trainable, frozen)
    expected, _ = plan.split(full_grads)
    assert all(np.abs(g).max() > 1e-6 for g in jax.tree_util.tree_leaves(expected))  # not vacuous
    assert_close(grads, expected, n=reduction_size(SMALL4, 3))


@pytest.mark.numerics
def test_the_float_rule_still_catches_a_frozen_prefix_bug(reference):
    """Negative test for this family: a stack that stops the gradient one layer too deep
    (frozen_prefix 3 where the patterns freeze 2) fails the comparison above."""
    params, x, y, full_grads = reference
    plan = resolve_freeze(params, FROZEN_PREFIX_2)
    trainable, frozen = plan.split(params)
    loss = loss_of(SMALL4, "nnx", StackPlan(get_policy("none"), frozen_prefix=plan.frozen_prefix + 1))
    grads = run_compiled(jax.grad(lambda t, f: loss(plan.merge(t, f), x, y)), trainable, frozen)
    expected, _ = plan.split(full_grads)
    with pytest.raises(AssertionError):
        assert_close(grads, expected, n=reduction_size(SMALL4, 3))


# ----------------------------------------------------------------------------- no backward


def scan_lengths(jaxpr) -> collections.Counter:
    """Trip count -> number of `scan` equations, anywhere in the jaxpr."""
    return collections.Counter(
        eqn.params["length"] for eqn in iter_eqns(jaxpr) if eqn.primitive.name == "scan"
    )


@pytest.mark.parametrize("policy", ["none", "full"])
def test_frozen_prefix_has_no_backward_scan(reference, policy):
    """Prefix of 1 layer, trainable suffix of 3: the prefix scan (length 1) runs only
    forward, the suffix scan (length 3) forward and backward. If the prefix's input needs a
    gradient (embed trainable), its scan is differentiated too: the control case."""
    params, x, y, _ = reference

    def grad_scans(patterns):
        plan = resolve_freeze(params, patterns)
        assert plan.frozen_prefix == 1
        trainable, frozen = plan.split(params)
        loss = loss_of(SMALL4, "nnx", plan.stack_plan(policy))
        grad = jax.grad(lambda t: loss(plan.merge(t, frozen), x, y))
        return scan_lengths(jax.make_jaxpr(grad)(trainable).jaxpr)

    assert grad_scans(["embed", "pos", "blocks[0:1]"]) == {1: 1, 3: 2}
    assert grad_scans(["blocks[0:1]"]) == {1: 2, 3: 2}  # embed trainable: prefix needs backward

    # without a frozen prefix the whole stack is one scan of 4, run forward and backward
    plan = resolve_freeze(params, ["embed", "pos"])
    trainable, frozen = plan.split(params)
    loss = loss_of(SMALL4, "nnx", plan.stack_plan(policy))
    grad = jax.grad(lambda t: loss(plan.merge(t, frozen), x, y))
    assert scan_lengths(jax.make_jaxpr(grad)(trainable).jaxpr) == {4: 2}
