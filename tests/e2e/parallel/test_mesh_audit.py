"""``zoo audit`` on a mesh certifies the pipeline ``zoo train`` runs there: one plan function
(:func:`zoo.dp.plan.make_plan`), the same padding multiple, truncation budget and DP settings;
the canaries are extra records and nothing else (benchmarks/dp/audit_plan.py prints the table)."""

import jax
import pytest

from zoo import recipes
from zoo.audit.canaries import WhiteBoxCanaries
from zoo.audit.run import MODES, plan_audit
from zoo.commands import settings
from zoo.dp.accounting import truncation_budget
from zoo.dp.clipping import KEEP_SUM
from zoo.dp.plan import make_plan
from zoo.train.run import build_run
from zoo.train.state import batch_seed, train_key

M = 400
# The plan's pieces that must agree: the clip norm, the performance settings (clipping method,
# microbatch size, noise PRNG, batch ways: the padding multiple), the accountant and delta.
SAME = ("clip_norm", "performance", "delta")


@pytest.mark.parametrize("mode", MODES)
def test_the_audit_pads_and_splits_like_training_on_a_mesh(mode):
    ways = jax.device_count()
    if ways < 2:
        pytest.skip("needs XLA_FLAGS=--xla_force_host_platform_device_count=8")
    values = {"mesh.data": ways, "train.steps": 40, "dp.clipping": "vmap", "train.microbatch_size": 3}
    values["dp.noise_seed"] = 3  # the root key, which seeds both samplers, pinned
    recipe = settings.with_values(recipes.load_recipe("digits-mlp-dp"), values)
    run = build_run(recipe, choose_remat=False)
    audit = plan_audit(recipe, M, mode)
    train, audited = run.dp, audit.engine.dp
    assert audit.engine.layout.spec == run.engine.layout.spec
    assert train.performance.pad_multiple == 3 * ways  # lcm(microbatch, the mesh's batch ways)
    for field in SAME:
        assert getattr(audited, field) == getattr(train, field), field
    assert audited.accounting.accountant == train.accounting.accountant
    assert audited.expected_batch_size == pytest.approx(train.expected_batch_size, rel=1e-12)
    for plan in (train, audited):
        assert plan.sampler.padded_batch_size % plan.performance.pad_multiple == 0
        assert plan.accounting.truncation_prob == truncation_budget(
            delta=plan.delta, epsilon=plan.epsilon, steps=40
        )
    # The audit's plan is training's plan function with the canaries counted as records.
    again = make_plan(
        recipe.dp,
        run.task.num_train,
        40,
        run.engine.layout,
        seed=batch_seed(jax.random.key_data(train_key(3))),
        microbatch_size=recipe.train.microbatch_size,
        canaries=M,
        canary_rows=mode == "blackbox",
    )
    transform = WhiteBoxCanaries() if mode == "whitebox" else KEEP_SUM  # the audit's, on its plan
    assert audited == again.with_transform(transform)
    assert audited.sampler.num_examples == train.sampler.num_examples == run.task.num_train
