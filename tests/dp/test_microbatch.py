"""Logical batches larger than the chip (zoo.microbatch, zoo.dp.clipping.accumulated_clip): the DP step in microbatches of
``train.microbatch_size`` equals the step over the whole batch, for every clipping method and with
records or users as the unit; its noise is drawn once, for the logical batch; and the setting
never changes epsilon."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, random_params
from tests.numerics import assert_close
from zoo.configs import DPConfig
from zoo.data.users import group_rows
from zoo.dp.plan import fixed_batch_plan, make_plan
from zoo.dp.users import group_users
from zoo.freeze import resolve_freeze
from zoo.jaxprs import iter_eqns
from zoo.microbatch import count as microbatch_count
from zoo.microbatch import valid_sizes as valid_microbatch_sizes
from zoo.models import registry
from zoo.parallel import layout_for
from zoo.precision import Precision
from zoo.train.engine import Engine, GradientSettings, make_engine
from zoo.train.start import config_start

MLP = zoo.get_config(registry.get_kind("mlp").small, num_layers=2)
TRANSFORMER = zoo.get_config(registry.get_kind("transformer").small, num_layers=2)
ROWS, K_SLOTS = 12, 3  # records of a batch; a user's record slots under dp.unit = "user"
# rows 1, 2 (user 0's last slots), 5, 9, 10, 11 (user 3, all padding) and 7 are masked
MASKED = [1, 2, 5, 7, 9, 10, 11]


def engine_for(cfg, clipping, microbatch, *, users=False, remat="none", precision="float32", cls=Engine):
    units = ROWS // K_SLOTS if users else ROWS
    user = {"unit": "user", "records_per_user": K_SLOTS} if users else {}
    plan = fixed_batch_plan(units, clip_norm=0.5, clipping=clipping, microbatch_size=microbatch, **user)
    params = random_params(cfg, 1)
    freeze = resolve_freeze(params, ())
    grad = GradientSettings("nnx", optax.sgd(0.1), remat=remat, precision=Precision(precision))
    engine = make_engine(config_start(cfg, params, freeze=freeze), grad, dp=plan)
    if cls is not Engine:  # a planted bug: the same engine, one method replaced
        engine = cls(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})
    state, frozen = engine.init_state(params, 0, jax.random.key(3))
    return engine, state, frozen


def batch_for(cfg) -> dict:
    x = zoo.example_batch(cfg, ROWS, seed=2, seq_len=8 if cfg.max_len else None)
    mask = np.ones(ROWS, np.float32)
    mask[MASKED] = 0.0
    return {"x": x, "y": labels_for(cfg, x), "mask": jnp.asarray(mask)}


def clipped(engine, state, frozen, batch, users):
    step_batch = group_users(batch, K_SLOTS) if users else batch
    return fast_jit(engine.clipped_sum)(state, frozen, step_batch)


CASES = {  # (config, clipping, users, remat, precision)
    "mlp-ghost-records": (MLP, "ghost", False, "none", "float32"),
    "mlp-vmap-records": (MLP, "vmap", False, "none", "float32"),
    "mlp-ghost-users": (MLP, "ghost", True, "none", "float32"),
    "mlp-vmap-users": (MLP, "vmap", True, "none", "float32"),
    "transformer-ghost-full-remat": (TRANSFORMER, "ghost", False, "full", "float32"),
    "transformer-ghost-bf16": (TRANSFORMER, "ghost", False, "none", "bfloat16"),
    "transformer-vmap-users-bf16": (TRANSFORMER, "vmap", True, "none", "bfloat16"),
}


@pytest.mark.numerics
@pytest.mark.parametrize("case", list(CASES))
def test_microbatches_add_up_to_the_whole_batch(case):
    """The clipped sum, the norms and the losses over k microbatches (2 examples each: 6 of
    records, 2 of users) equal one pass over the same padded batch, in the batch's order."""
    cfg, clipping, users, remat, precision = CASES[case]
    out = {}
    for microbatch in (None, 2):
        engine, state, frozen = engine_for(
            cfg, clipping, microbatch, users=users, remat=remat, precision=precision
        )
        out[microbatch] = jax.tree.map(np.asarray, clipped(engine, state, frozen, batch_for(cfg), users))
    (whole, whole_norms, whole_losses), (parts, norms, losses) = out[None], out[2]
    assert_close(parts, whole, n=ROWS, what=f"{case} clipped sum")
    assert_close(norms, whole_norms, n=ROWS, what=f"{case} norms")
    keep = whole_norms > 0  # a masked example's loss is unspecified (ghost)
    assert keep.sum() >= 2 and len(np.unique(whole_norms[keep])) == keep.sum()  # the order shows
    assert_close(losses[keep], whole_losses[keep], n=ROWS, what=f"{case} losses")


def released(engine, state, frozen, batch):
    """The noisy mean gradient the step releases (and the logged loss)."""
    loss, grads, _ = fast_jit(engine._dp_grads)(state, frozen, batch)
    return jax.tree.map(np.asarray, (loss, grads))


class NoisePerMicrobatch(Engine):
    """Planted: each microbatch's clipped sum gets its own Gaussian noise (a key of its own),
    and the step adds none after the sum; the step's variance grows with the microbatches."""

    def clipped_sum(self, state, frozen, batch):
        from zoo.dp import clipping as mb

        clip = zoo.dp.clipping_method(self.dp.performance.clipping).clip
        counter = iter(range(1_000))

        def noisy_clip(model, trainable, frozen_, part, request):
            summed, norms, losses = clip(model, trainable, frozen_, part, request)
            key = jax.random.fold_in(self.noise_key(state), next(counter))
            noise = zoo.dp.add_gaussian_noise(summed, key, noise_multiplier=1.0, l2_clip_norm=0.5)
            return noise, norms, losses

        request = zoo.dp.ClipRequest(self.dp.clip_norm, self.dp.performance.microbatch_size, batch["mask"])
        return mb.accumulated_clip(noisy_clip, self.clip_model, state.params, frozen, batch, request)

    def privatize(self, state, grad_sum):
        return jax.tree.map(lambda g: g / self.dp.expected_batch_size, grad_sum)


def noise_draws(engine, state, frozen, batch) -> tuple[int, int]:
    """``(normal draws in the step, draws inside a scan)``: ``random_bits`` equations."""
    jaxpr = jax.make_jaxpr(engine._dp_grads)(state, frozen, batch)
    total = sum(e.primitive.name == "random_bits" for e in iter_eqns(jaxpr))
    scans = [e for e in iter_eqns(jaxpr) if e.primitive.name == "scan"]
    inside = sum(e.primitive.name == "random_bits" for s in scans for e in iter_eqns(s.params["jaxpr"]))
    return total, inside


def check_noise_once(cls=Engine):
    """With one noise key, the microbatched step releases the unsplit step's noisy gradient, and
    its program draws as often as the unsplit one (once per leaf), none of it inside the scan."""
    batch = batch_for(MLP)
    out, draws = {}, {}
    for microbatch, engine_cls in ((None, Engine), (3, cls)):
        engine, state, frozen = engine_for(MLP, "ghost", microbatch, cls=engine_cls)
        out[microbatch] = released(engine, state, frozen, batch)
        draws[microbatch] = noise_draws(engine, state, frozen, batch)
    assert_close(out[3], out[None], n=ROWS, what="released noisy gradient")
    leaves = len(jax.tree.leaves(out[None][1]))  # a draw per leaf (and the noise key's bits)
    assert draws[3] == draws[None] and draws[None][0] >= leaves and draws[3][1] == 0, draws


@pytest.mark.numerics
def test_the_noise_is_drawn_once_per_logical_batch():
    check_noise_once()


def test_the_noise_check_catches_noise_drawn_per_microbatch():
    with pytest.raises(AssertionError):
        check_noise_once(NoisePerMicrobatch)


def test_a_microbatch_that_does_not_divide_the_padded_batch_is_refused_in_one_line():
    engine, state, frozen = engine_for(MLP, "ghost", 5)
    with pytest.raises(ValueError) as error:
        engine.clipped_sum(state, frozen, batch_for(MLP))
    message = str(error.value)
    assert "\n" not in message
    assert "train.microbatch_size" in message and "got 5" in message and "batch of 12 rows" in message
    assert message.endswith("valid microbatch sizes: 1, 2, 3, 4, 6, 12")
    assert valid_microbatch_sizes(12) == [1, 2, 3, 4, 6, 12]
    assert microbatch_count(12, None) == 1 and microbatch_count(12, 4) == 3


# -- a performance setting never changes epsilon ---------------------------------------------------
RECORDS = 600
USER_OF = np.repeat(np.arange(60), [1, 9, 2, 2, 14, 3, 1, 5, 7, 1] * 6)  # 270 records, 60 users
PLANS = {
    "records": DPConfig(enabled=True, epsilon=3.0, expected_batch_size=50),
    "users": DPConfig(enabled=True, epsilon=3.0, expected_batch_size=12, unit="user", records_per_user=3),
}


def plan_for(name: str, microbatch_size: int | None = None, **settings):
    dp = dataclasses.replace(PLANS[name], **settings)
    layout = layout_for(MLP)
    users = group_rows(USER_OF) if dp.unit == "user" else None
    return make_plan(dp, RECORDS, 40, layout, seed=3, users=users, microbatch_size=microbatch_size)


@pytest.mark.parametrize("name", list(PLANS))
def test_the_microbatch_size_and_the_clipping_method_never_change_epsilon(name):
    """The accountant's epsilon, the noise multiplier, q and the normaliser of a plan are the same
    with and without microbatches (and for either clipping method); only the padding rounds up."""
    base = plan_for(name)
    for settings in (
        {"microbatch_size": 4},
        {"microbatch_size": 7},
        {"clipping": "vmap", "microbatch_size": 8},
    ):
        plan = plan_for(name, **settings)
        assert (
            plan.sampler.padded_batch_size % (settings["microbatch_size"] * (plan.records_per_user or 1)) == 0
        )
        assert plan.noise_multiplier == base.noise_multiplier, settings
        assert plan.sampler.sampling_prob == base.sampler.sampling_prob, settings
        assert plan.expected_batch_size == base.expected_batch_size, settings
        assert plan.epsilon == base.epsilon, settings
        assert plan.epsilon_at(40) == base.epsilon_at(40), settings
        assert plan.privacy_at(40)["epsilon"] == base.privacy_at(40)["epsilon"], settings
