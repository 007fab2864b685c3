"""Capabilities every registered model kind gets through the registry, tested for each kind's
small config: freezing by path and the residual inspector (what ``zoo bench remat`` reports);
and the lazy ``zoo.<subpackage>`` attributes."""

import json
import subprocess
import sys

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_close
from zoo.freeze import resolve_freeze
from zoo.models import registry
from zoo.remat import get_policy
from zoo.residuals import residual_report
from zoo.scan import StackPlan

KINDS = {kind.name: zoo.get_config(kind.small, num_layers=4) for kind in registry.kinds()}
BATCH = 3


@pytest.mark.numerics
@pytest.mark.parametrize("kind", list(KINDS))
def test_freezing_by_path_matches_the_full_gradient(kind):
    cfg = KINDS[kind]
    params = random_params(cfg, 2)
    x = zoo.example_batch(cfg, BATCH, seed=3)
    y = labels_for(cfg, x)
    first = min(p for p in params if p != "blocks")  # a top-level part of every kind
    plan = resolve_freeze(params, ["blocks[0:2]", first])
    assert plan.frozen_prefix == 2 and first not in plan.split(params)[0]
    trainable, frozen = plan.split(params)
    full = fast_jit(jax.grad(loss_of(cfg, "nnx")))(params, x, y)
    loss = loss_of(cfg, "nnx", StackPlan(get_policy("full"), frozen_prefix=plan.frozen_prefix))
    grads = fast_jit(jax.grad(lambda t, f: loss(plan.merge(t, f), x, y)))(trainable, frozen)
    expected, _ = plan.split(full)
    assert all(np.abs(g).max() > 0 for g in jax.tree_util.tree_leaves(expected))  # not vacuous
    assert_close(grads, expected, n=reduction_size(cfg, BATCH))
    merged = plan.merge(trainable, frozen)
    assert all(
        np.array_equal(a, b) for a, b in zip(jax.tree.leaves(merged), jax.tree.leaves(params), strict=True)
    )


@pytest.mark.parametrize("kind", list(KINDS))
def test_residual_inspector_sees_one_block_input_per_layer(kind):
    cfg = KINDS[kind]
    seq = 8 if cfg.max_len else None
    block_bytes = int(np.prod(cfg.block_input_shape(2, seq))) * 4
    for policy, where in (("full", "device"), ("offload-layer-input", "pinned_host")):
        reports = [residual_report(cfg, policy, backend=b, batch=2, seq=seq) for b in zoo.BACKENDS]
        for rep in reports:
            stack = {
                r["name"]: r for r in rep["residuals"] if r["scope"] == "stack" and r["kind"] == "activation"
            }
            assert set(stack) == {"layer_input"}, (policy, sorted(stack))
            row = stack["layer_input"]
            assert (row["bytes"], row["memory_kind"], row["count"]) == (4 * block_bytes, where, 4)
        assert reports[0]["stack_device_bytes"] == reports[1]["stack_device_bytes"]


def test_subpackages_are_attributes_of_zoo_and_load_only_when_touched():
    code = (
        "import sys, json, zoo; before = 'zoo.dp' in sys.modules; "
        "f = zoo.dp.clipped_grad_sum; t = zoo.train.loop.train if hasattr(zoo.train, 'loop') else zoo.train; "
        "print(json.dumps([before, 'zoo.dp' in sys.modules, callable(f), 'dp' in dir(zoo)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True, True, True]
