"""zoo.dp.ghost.method: ``method = "auto"`` under a remat policy that keeps nothing of a block
takes book-keeping where its pieces are no larger than the layers' inputs the policy keeps (a
LoRA fine-tune's adapters), the second backward where they are larger (every weight training),
and the clipped sum it then gives is the vmap path's."""

import jax
import numpy as np
import pytest

import zoo
from tests.dp.ghost.test_api import ONES, assert_close, batch, params_of, vmap_fn
from zoo import lora
from zoo.configs import LoraConfig
from zoo.dp import ClipRequest, ghost
from zoo.dp.ghost.method import carried_bytes, kept_bytes, resolve_method
from zoo.dp.ghost.stages import tap_pass

BASE = zoo.get_config("llama-xs")  # d_model 64 over 64 positions: past the Gram form's floor


def adapted(rank=1, targets=("attn.q",)):
    setup = lora.resolve(BASE, LoraConfig(rank=rank, targets=targets))
    cfg = lora.adapted_config(BASE, setup)
    return cfg, lora.freeze_plan(cfg, setup)


def plan_of(cfg, freeze, x, remat="full"):
    return ghost.prepare(cfg, x, freeze, remat)


def test_kept_bytes_are_what_the_book_keeping_pass_hands_out():
    """The count from the taps' plan against the pass's own outputs and captures (a full
    fine-tune: the token table's ids are captured too)."""
    for cfg, freeze in ((BASE, None), adapted()):
        params = params_of(cfg)
        x, y = batch(cfg, b=2)
        gp = plan_of(cfg, freeze, x)

        def handed_out(p, x, y, gp=gp):
            _, _, kept = tap_pass(gp, p, x, y, sums=True)
            return kept.out, kept.captures

        real = jax.eval_shape(handed_out, params, x, y)  # the pass's own trace, not its plan's
        assert kept_bytes(gp, params, x) == sum(a.size * a.dtype.itemsize for a in jax.tree.leaves(real))


def test_auto_keeps_small_adapters_under_a_policy_that_keeps_nothing():
    x, _ = batch(BASE, b=2)
    cfg, freeze = adapted()
    small, full_ft = plan_of(cfg, freeze, x), plan_of(BASE, None, x)
    shapes = {name: params_of(c) for name, c in (("lora", cfg), ("full", BASE))}
    # each layer's input: 2 examples x 64 positions x 64 wide, float32, 2 layers
    assert carried_bytes(small, x) == carried_bytes(full_ft, x) == 2 * 64 * 64 * 4 * 2
    assert (
        kept_bytes(small, shapes["lora"], x)
        <= carried_bytes(small, x)
        < kept_bytes(full_ft, shapes["full"], x)
    )
    assert resolve_method(small, shapes["lora"], x) == "bookkeeping"
    assert resolve_method(full_ft, shapes["full"], x) == "backward"
    # a forced method stands; a policy that keeps some takes book-keeping as before
    assert resolve_method(small, shapes["lora"], x, "backward") == "backward"
    assert resolve_method(plan_of(BASE, None, x, "dots"), shapes["full"], x) == "bookkeeping"
    # larger adapters on every op: their pieces outgrow the layers' inputs
    wide, wide_freeze = adapted(rank=16, targets=("*",))
    assert resolve_method(plan_of(wide, wide_freeze, x), params_of(wide), x) == "backward"


@pytest.mark.numerics
def test_auto_book_keeping_under_full_remat_matches_the_vmap_path():
    cfg, plan = adapted()
    params, frozen = plan.split(params_of(cfg))
    x, y = batch(cfg)
    assert resolve_method(plan_of(cfg, plan, x), plan.merge(params, frozen), x) == "bookkeeping"

    @jax.jit
    def run(params, frozen, x, y, clip):
        request = ClipRequest(clip, example_mask=ONES)
        return ghost.ghost_clipped_grad_sum(
            cfg, params, x, y, request, frozen=frozen, freeze_plan=plan, remat="full", method="auto"
        )[:2]

    _, unclipped = run(params, frozen, x, y, np.float32(np.inf))
    clip = np.float32(np.median(np.asarray(unclipped)))
    ours, norms = run(params, frozen, x, y, clip)
    ref, ref_norms = vmap_fn(cfg, "nnx", plan)(params, frozen, x, y, clip, ONES)
    assert_close(cfg, ours, ref, norms, ref_norms)
