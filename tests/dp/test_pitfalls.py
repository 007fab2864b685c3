"""One test per known DP-SGD implementation pitfall (jax_privacy's "sharp edges" list; Cebere et
al., "Privacy in Theory, Bugs in Practice", PoPETs 2026), each followed by a test that plants the
bug and shows the check still catches it. Tiny MLPs, a padded batch of 8: the whole file is cheap.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import zoo
from tests.conftest import FAST_COMPILE, random_params
from tests.numerics import assert_bitwise_equal, assert_close
from zoo import lora
from zoo.configs import DataConfig, LoraConfig, OptimConfig
from zoo.dp import accounting, clipping, ghost
from zoo.dp.mechanisms import Mechanism
from zoo.dp.mechanisms import accountant as account
from zoo.dp.noise import add_gaussian_noise, noise_key
from zoo.dp.plan import fixed_batch_plan
from zoo.dp.sampling import PoissonSampler
from zoo.errors import ZooError
from zoo.freeze import resolve_freeze
from zoo.jaxprs import scope_float_dtypes
from zoo.train import engine as engine_lib
from zoo.train.engine import Engine
from zoo.train.start import config_start
from zoo.train.state import make_optimizer

CFG = zoo.get_config("mlp-s", d_in=6, d_hidden=8, num_layers=1, num_classes=3)  # an mlp-xs
C, P, E = 1.0, 8, 4.0  # clip norm, padded batch, expected batch
SIGMA = 1.5
# One worker builds and compiles the shared engines once for every test here.
pytestmark = pytest.mark.xdist_group("pitfalls")
TOL = 1 + 1e-6  # clipped norms may exceed C by rounding only
# name -> (clipping, microbatch size, freeze patterns, LoRA targets)
METHODS = {
    "vmap": ("vmap", None, (), ()),
    "ghost": ("ghost", None, (), ()),
    "vmap-microbatched": ("vmap", 4, (), ()),
    "ghost-microbatched": ("ghost", 4, (), ()),
    "ghost-frozen": ("ghost", None, ("in_proj",), ()),
    "vmap-lora": ("vmap", None, (), ("in_proj", "head")),
    "ghost-lora": ("ghost", None, (), ("in_proj", "head")),
}


def make_engine(method="vmap", sigma=SIGMA, microbatch=None, engine_cls=Engine):
    kind, mb, freeze, targets = METHODS[method]
    cfg, params = CFG, random_params(CFG, 1)
    if targets:
        setup = lora.resolve(cfg, LoraConfig(rank=2, targets=targets))
        cfg = lora.adapted_config(cfg, setup)
        params = lora.initial_params(cfg, CFG, params, 0)
        params = jax.tree.map(lambda p: p + 0.1, params)  # adapters that are not zero
        plan = lora.freeze_plan(cfg, setup)
    else:
        plan = resolve_freeze(params, freeze)
    engine = engine_lib.make_engine(
        config_start(cfg, params, freeze=plan),
        engine_lib.GradientSettings(
            "nnx", make_optimizer(OptimConfig(name="sgd", lr=0.1, schedule="constant"), 10, clip=False)
        ),
        dp=fixed_batch_plan(
            E, noise_multiplier=sigma, clip_norm=C, microbatch_size=microbatch or mb, clipping=kind
        ),
    )
    if engine_cls is not Engine:  # a planted bug: the same engine, one method replaced
        engine = engine_cls(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})
    state, frozen = engine.init_state(params, 0, jax.random.key(7))
    return engine, state, frozen


def batch(real: int, seed: int = 0, scale=None) -> dict:
    """A padded batch of ``P`` rows whose first ``real`` rows are examples (mask 1)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((P, CFG.d_in)).astype(np.float32)
    if scale is not None:
        x *= np.asarray(scale, np.float32)[:, None]
    y = rng.integers(0, CFG.num_classes, P).astype(np.int32)
    mask = (np.arange(P) < real).astype(np.float32)
    x[real:], y[real:] = 0.0, 0
    return {"x": x, "y": y, "mask": mask}


def with_row(b: dict, i: int, x=None, y=None, keep=1.0) -> dict:
    out = {k: v.copy() for k, v in b.items()}
    if x is not None:
        out["x"][i] = x
    if y is not None:
        out["y"][i] = y
    out["mask"][i] = keep
    return out


def release_fn(engine):
    """One jitted program: the clipped sum, the release and the noise it carries."""

    def fn(state, frozen, b):
        clipped, norms, _ = engine.clipped_sum(state, frozen, b)
        _, release, _ = engine._dp_grads(state, frozen, b)
        noise = jax.tree.map(lambda r, s: r * E - s, release, clipped)
        return clipped, norms, release, noise

    jitted = jax.jit(fn, compiler_options=FAST_COMPILE)
    jitted.trace_program = fn  # what make_jaxpr reads (it cannot trace a jit with options)
    return jitted


_SHARED = {}


def shared(method: str):
    """``(engine, state, frozen, release program)`` of ``method``, built and compiled once for
    every test that checks an unpatched step (a planted bug needs a program of its own)."""
    if method not in _SHARED:
        engine, state, frozen = make_engine(method)
        _SHARED[method] = (engine, state, frozen, release_fn(engine))
    return _SHARED[method]


def jitted(fn):
    return jax.jit(fn, compiler_options=FAST_COMPILE)


def tree_norm(tree) -> float:
    return float(np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(tree))))


def tree_sub(a, b):
    return jax.tree.map(lambda u, v: np.asarray(u, np.float64) - np.asarray(v, np.float64), a, b)


# -- neighbour replay ------------------------------------------------------------------------
def check_neighbour_replay(engine, state, frozen, fn=None):
    fn = fn or release_fn(engine)
    base = batch(5)
    huge = np.full(CFG.d_in, 1e4, np.float32)
    neighbours = {
        "add": with_row(base, 5),  # a sixth example
        "add-huge": with_row(base, 5, x=huge),  # whose gradient is enormous
        "remove": with_row(base, 4, keep=0.0),
        "replace": with_row(base, 4, x=huge, y=(base["y"][4] + 1) % CFG.num_classes),
    }
    jaxprs = {str(jax.make_jaxpr(fn.trace_program)(state, frozen, b)) for b in (base, *neighbours.values())}
    assert len(jaxprs) == 1  # the same program, the same branches, for every neighbour
    clipped0, _, release0, noise0 = fn(state, frozen, base)
    for name, b in neighbours.items():
        clipped, _, release, noise = fn(state, frozen, b)
        assert jax.tree.map(jnp.shape, release) == jax.tree.map(jnp.shape, release0)
        bound = (2 if name == "replace" else 1) * C * TOL
        assert tree_norm(tree_sub(clipped, clipped0)) <= bound, name
        # Same key, same normaliser: the noise each release carries is the same noise.
        assert_close(noise, noise0, n=P, what=f"noise of the {name} neighbour")
    assert fn._cache_size() == 1


@pytest.mark.numerics
@pytest.mark.parametrize("method", METHODS)
def test_neighbour_replay_changes_only_the_clipped_sum_by_at_most_c(method):
    check_neighbour_replay(*shared(method))


class RealisedNormaliser(Engine):
    """Planted: divides by the realised batch size instead of the public expected one."""

    def _dp_grads(self, state, frozen, batch):
        loss, grads, report = super()._dp_grads(state, frozen, batch)
        scaled = jax.tree.map(lambda g: g * self.dp.expected_batch_size / batch["mask"].sum(), grads)
        return loss, scaled, report


def test_neighbour_replay_still_catches_a_realised_normaliser_and_skipped_clipping(monkeypatch):
    with pytest.raises(AssertionError):
        check_neighbour_replay(*make_engine("vmap", engine_cls=RealisedNormaliser))
    monkeypatch.setattr(clipping, "clip_factor", lambda norms, clip: jnp.ones_like(norms))
    for method in ("vmap", "ghost"):
        with pytest.raises(AssertionError):
            check_neighbour_replay(*make_engine(method))


# -- NaN and Inf records, garbage in padding ----------------------------------------------------
def check_bad_records_drop_out(engine, state, frozen, fn=None):
    fn = fn or release_fn(engine)
    base = batch(5)
    without = fn(state, frozen, base)
    for bad in (np.nan, np.inf):
        out = fn(state, frozen, with_row(base, 5, x=np.full(CFG.d_in, bad, np.float32)))
        for a, b in zip(out[2:], without[2:], strict=True):  # release and its noise
            assert all(np.isfinite(x).all() for x in jax.tree.leaves(a))
            assert_bitwise_equal(a, b)


def check_padding_garbage_is_ignored(engine, state, frozen, fn=None):
    fn = fn or release_fn(engine)
    clean = batch(5)
    dirty = {k: v.copy() for k, v in clean.items()}
    dirty["x"][5:] = np.nan
    dirty["y"][5:] = CFG.num_classes - 1
    for a, b in zip(fn(state, frozen, dirty), fn(state, frozen, clean), strict=True):
        assert_bitwise_equal(a, b)


@pytest.mark.parametrize("method", ["vmap", "ghost", "vmap-microbatched", "ghost-lora"])
def test_nan_and_inf_records_leave_the_release_finite_and_as_without_them(method):
    check_bad_records_drop_out(*shared(method))


@pytest.mark.parametrize("method", ["vmap", "ghost", "vmap-microbatched", "ghost-frozen"])
def test_nan_in_padding_rows_is_bitwise_the_clean_padding(method):
    check_padding_garbage_is_ignored(*shared(method))


def test_bad_records_and_padding_checks_still_catch_a_dropped_filter(monkeypatch):
    original = ghost.api.clip_factors

    def keep_everything(sq, keep, clip):  # planted: neither the mask nor finiteness filters
        norms, _, _ = original(sq, jnp.ones_like(keep), clip)
        return norms, clipping.clip_factor(norms, clip), jnp.ones_like(keep)

    monkeypatch.setattr(ghost.api, "clip_factors", keep_everything)
    with pytest.raises(AssertionError):
        check_bad_records_drop_out(*make_engine("ghost"))
    with pytest.raises(AssertionError):
        check_padding_garbage_is_ignored(*make_engine("ghost"))


# -- empty and all-padding batches ------------------------------------------------------------
def check_empty_batches_release_pure_noise(engine, state, frozen, fn=None):
    fn = fn or release_fn(engine)
    fn(state, frozen, batch(5))  # the one compile
    empty_draw = PoissonSampler(num_examples=20, sampling_prob=1e-4, padded_batch_size=P, seed=0)
    indices, mask, realised = empty_draw.batch_indices(0)
    assert realised == 0
    padding_only = batch(0)
    drawn = {"x": np.asarray(batch(P)["x"])[indices], "y": np.asarray(batch(P)["y"])[indices], "mask": mask}
    pure = jax.jit(engine.privatize)(state, jax.tree.map(jnp.zeros_like, state.params))
    for b in (padding_only, drawn):
        clipped, _, release, _ = fn(state, frozen, b)
        assert tree_norm(clipped) == 0.0
        assert_close(release, pure, n=1, what="the release of an empty batch")
    assert fn._cache_size() == 1


@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_empty_draw_and_all_padding_release_pure_noise_without_recompiling(method):
    check_empty_batches_release_pure_noise(*shared(method))


def test_empty_batch_check_still_catches_a_realised_normaliser():
    with pytest.raises(AssertionError):
        check_empty_batches_release_pure_noise(*make_engine("vmap", engine_cls=RealisedNormaliser))


# -- the sampler ------------------------------------------------------------------------------
def check_sampler(sampler, steps=400):
    n, q = sampler.num_examples, sampler.sampling_prob
    masks = np.zeros((steps, n), bool)
    for t in range(steps):
        indices, mask, _ = sampler.batch_indices(t)
        masks[t, indices[mask > 0]] = True
    sizes = masks.sum(axis=1)
    # Sizes against Binomial(n, q): chi-square over bins of about equal probability.
    edges = np.unique(stats.binom.ppf(np.linspace(0, 1, 9)[1:-1], n, q))
    bins = np.concatenate([[-1], edges, [n]])
    expected = np.diff(stats.binom.cdf(bins, n, q)) * steps
    observed = np.histogram(sizes, bins=bins + 0.5)[0]
    chi2 = np.sum((observed - expected) ** 2 / expected)
    assert stats.chi2.sf(chi2, len(expected) - 1) > 1e-4, chi2
    # Inclusion at step t and t+1 independent: a 2x2 table pooled over examples.
    a, b = masks[:-1].ravel(), masks[1:].ravel()
    table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]])
    assert stats.chi2_contingency(table)[1] > 1e-4, table
    return masks.mean()


def test_poisson_batches_are_binomial_and_independent_across_steps():
    check_sampler(PoissonSampler.for_expected_batch(60, 12, seed=3))


class FixedSize(PoissonSampler):
    def batch_indices(self, step):  # planted: a shuffler's fixed batch size
        rng = np.random.default_rng([self.seed, step])
        k = round(self.expected_batch_size)
        idx = np.zeros(self.padded_batch_size, np.int32)
        idx[:k] = np.sort(rng.choice(self.num_examples, k, replace=False))
        return idx, (np.arange(self.padded_batch_size) < k).astype(np.float32), k


class Repeats(PoissonSampler):
    def batch_indices(self, step):  # planted: the same draw every other step
        return super().batch_indices(step // 2)


def test_sampler_check_still_catches_fixed_sizes_and_repeated_draws():
    for cls in (FixedSize, Repeats):
        with pytest.raises(AssertionError):
            check_sampler(cls(num_examples=60, sampling_prob=0.2, padded_batch_size=30, seed=3))


def check_accountant_gets_the_samplers_q_and_t(run):
    rate = check_sampler(run.dp.sampler, steps=run.steps)
    q = run.dp.sampler.sampling_prob
    assert abs(rate - q) < 5 * math.sqrt(q * (1 - q) / (run.steps * run.dp.sampler.num_examples))
    assert run.steps == run.recipe.train.steps
    spent = accounting.epsilon_spent(
        noise_multiplier=run.dp.noise_multiplier, delta=run.recipe.dp.delta, sampling_prob=q, steps=run.steps
    )
    assert run.dp.epsilon == spent


@pytest.fixture(scope="module")
def digits_run():
    from zoo import recipes
    from zoo.commands import settings
    from zoo.train.run import build_run

    recipe = settings.with_values(
        recipes.load_recipe("digits-mlp-dp"),
        {"train.steps": 60, "dp.epsilon": None, "dp.noise_multiplier": 2.0, "model.d_hidden": 8},
    )
    return build_run(recipe)


def test_the_accountant_gets_the_samplers_own_q_and_steps(digits_run):
    check_accountant_gets_the_samplers_q_and_t(digits_run)


def test_accountant_check_still_catches_a_sampler_with_another_rate(digits_run):

    sampler = dataclasses.replace(
        digits_run.dp.sampler, sampling_prob=digits_run.dp.sampler.sampling_prob * 1.2
    )
    with pytest.raises(AssertionError):  # planted: the batches drawn at 1.2 q, accounted at q
        made = dataclasses.replace(digits_run.dp.made, sampler=sampler)
        check_accountant_gets_the_samplers_q_and_t(
            dataclasses.replace(
                digits_run,
                engine=dataclasses.replace(
                    digits_run.engine, dp=dataclasses.replace(digits_run.dp, made=made)
                ),
            )
        )


# -- microbatching ----------------------------------------------------------------------------
def check_microbatching(method, noisy):
    b = batch(7, scale=np.linspace(0.1, 5, P))
    sums = {}
    for k in (None, 2, 4):
        engine, state, frozen = make_engine(method, sigma=0.0, microbatch=k)
        sums[k] = jitted(engine.clipped_sum)(state, frozen, b)[0]
    for k in (2, 4):
        assert_close(sums[k], sums[None], n=P, what=f"clipped sum, microbatch {k}")
    engine, state, frozen, fn = noisy
    noise = (fn or release_fn(engine))(state, frozen, b)[3]
    z = np.concatenate([np.ravel(x) for x in jax.tree.leaves(noise)]) / (SIGMA * C)
    # Noise once per step with std sigma C: the sample variance against chi-square bounds.
    lo, hi = stats.chi2.ppf([1e-4, 1 - 1e-4], z.size) / z.size
    assert lo < np.mean(z**2) < hi, np.mean(z**2)


@pytest.mark.numerics
@pytest.mark.parametrize("method", ["vmap", "ghost"])
def test_microbatching_keeps_the_clipped_sum_and_adds_noise_once(method):
    check_microbatching(method, shared(f"{method}-microbatched"))


class NoiseTwice(Engine):
    def privatize(self, state, grad_sum):  # planted: noise added per microbatch (here, twice)
        once = super().privatize(state, grad_sum)
        again = super().privatize(dataclasses.replace(state, step=state.step + 10**6), grad_sum)
        return jax.tree.map(lambda a, b, s: a + b - s / self.dp.expected_batch_size, once, again, grad_sum)


def test_microbatch_check_still_catches_noise_added_twice():
    with pytest.raises(AssertionError):
        check_microbatching("vmap", (*make_engine("vmap-microbatched", engine_cls=NoiseTwice), None))


# -- per-example gradients --------------------------------------------------------------------
def check_per_example_norms(method):
    engine, state, frozen = make_engine(method, sigma=0.0)
    b = batch(P, scale=np.linspace(0.2, 3, P))
    _, norms, _ = jitted(engine.clipped_sum)(state, frozen, b)

    def one(trainable, x, y):
        return engine.example_losses(trainable, frozen, x[None], y[None])[0][0]

    grad = jitted(jax.grad(one))
    loop = [tree_norm(grad(state.params, b["x"][i], b["y"][i])) for i in range(P)]
    assert_close(
        np.asarray(norms), np.asarray(loop, np.float32), n=P * CFG.d_hidden, what="per-example norms"
    )


@pytest.mark.numerics
@pytest.mark.parametrize("method", ["vmap", "ghost", "ghost-frozen", "vmap-lora", "ghost-lora"])
def test_per_example_norms_equal_a_loop_of_jax_grad(method):
    check_per_example_norms(method)


def test_per_example_check_still_catches_a_wrong_norm(monkeypatch):
    original = ghost.api.clip_factors
    monkeypatch.setattr(ghost.api, "clip_factors", lambda sq, keep, clip: original(sq * 1.01, keep, clip))
    with pytest.raises(AssertionError):
        check_per_example_norms("ghost-lora")


# -- keys -------------------------------------------------------------------------------------
def check_keys(engine, state):
    zeros = {"w": jnp.zeros((4000,))}

    def noise(s):
        return np.asarray(
            add_gaussian_noise(zeros, engine.noise_key(s), noise_multiplier=1.0, l2_clip_norm=1.0)["w"]
        )

    a, b = noise(state), noise(dataclasses.replace(state, step=state.step + 1))
    assert abs(np.corrcoef(a, b)[0, 1]) < 5 / math.sqrt(a.size)
    # Two halves of one draw (what two devices of a data mesh hold) are independent too.
    assert abs(np.corrcoef(a[:2000], a[2000:])[0, 1]) < 5 / math.sqrt(2000)


def test_noise_at_consecutive_steps_is_independent():
    engine, state, _ = make_engine("vmap")
    check_keys(engine, state)


def test_keys_check_still_catches_a_step_key_that_ignores_the_step(monkeypatch):
    from zoo.train.state import TrainState

    engine, state, _ = make_engine("vmap")
    monkeypatch.setattr(TrainState, "step_key", lambda self: jax.random.wrap_key_data(self.rng))
    with pytest.raises(AssertionError):
        check_keys(engine, state)


def check_noise_key_is_secret(make_key):
    from zoo import recipes
    from zoo.train.state import TrainState, train_key

    recipe = recipes.load_recipe("digits-mlp-dp")
    seed = recipe.train.seed
    keys = [np.asarray(jax.random.key_data(make_key(recipe))) for _ in range(2)]
    assert not np.array_equal(keys[0], keys[1])  # fresh OS entropy every run
    weights = np.asarray(jax.random.key_data(train_key(seed)))
    init = np.asarray(jax.random.key_data(jax.random.key(seed)))
    for key in keys:
        assert not np.array_equal(key, weights) and not np.array_equal(key, init)
    state = TrainState.create({}, make_optimizer(OptimConfig(), 1), seed, make_key(recipe))
    for step in range(3):  # no step's noise key is the key of the initial weights
        k = noise_key(jax.random.fold_in(jax.random.wrap_key_data(state.rng), step))
        assert not np.array_equal(np.asarray(jax.random.key_data(k)), weights)


def test_noise_key_is_not_derivable_from_the_initial_weights():
    from zoo.train.run import dp_train_key

    check_noise_key_is_secret(dp_train_key)


def test_secret_key_check_still_catches_keys_from_the_seed():
    from zoo.train.state import train_key

    with pytest.raises(AssertionError):  # planted: the noise hangs off the weights' seed
        check_noise_key_is_secret(lambda recipe: train_key(recipe.train.seed))


# -- precision --------------------------------------------------------------------------------
def reduce_dtypes(fn, *args) -> set:
    closed = jax.make_jaxpr(fn)(*args)
    found = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name in ("scan", "erf_inv"):  # the microbatch sum; the noise
                found.update((eqn.primitive.name, str(v.aval.dtype)) for v in eqn.outvars)
            for value in eqn.params.values():
                for sub in value if isinstance(value, (tuple, list)) else (value,):
                    if hasattr(sub, "eqns"):
                        walk(sub)
                    elif hasattr(sub, "jaxpr") and hasattr(sub.jaxpr, "eqns"):
                        walk(sub.jaxpr)

    walk(closed.jaxpr)
    return found


def check_precision():
    params = {"w": jnp.ones((6, 3), jnp.bfloat16)}
    x = jnp.ones((P, 6), jnp.bfloat16)

    def loss(p, xi):
        return jnp.sum(jnp.tanh(xi @ p["w"]).astype(jnp.float32))

    def clipped(p):
        return clipping.clipped_grad_sum(loss, p, x, request=clipping.ClipRequest(C, microbatch_size=2))[0]

    summed = reduce_dtypes(clipped, params)
    assert summed == {("scan", "float32")}, summed
    # Within each microbatch too: the clipped sum and the running total are float32 (the scan's
    # carry alone would widen a sum already rounded to bf16).
    scopes = scope_float_dtypes(jax.make_jaxpr(clipped)(params), ("f32_clipped_sum", "f32_accumulate"))
    assert all(scopes.values()) and all(d <= {"float32"} for d in scopes.values()), scopes
    drawn = reduce_dtypes(
        lambda p: add_gaussian_noise(p, jax.random.key(0), noise_multiplier=1.0, l2_clip_norm=C), params
    )
    assert drawn == {("erf_inv", "float32")}, drawn
    # Clipped norms at most C (1 + 1e-6), huge gradients included, on both paths.
    for method in ("vmap", "ghost"):
        engine, state, frozen = make_engine(method)
        clipped_sum = jitted(engine.clipped_sum)
        for scale in (1e-2, 1.0, 1e4):
            b = with_row(batch(0), 0, x=np.full(CFG.d_in, scale, np.float32))
            assert tree_norm(clipped_sum(state, frozen, b)[0]) <= C * TOL, (method, scale)


def test_sums_and_noise_are_float32_and_clipped_norms_stay_within_c():
    check_precision()


def test_precision_check_still_catches_bf16_sums_and_a_loose_clip(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(clipping, "_acc_dtype", lambda dtype: dtype)
        with pytest.raises(AssertionError):
            check_precision()
    original = clipping.clip_factor
    monkeypatch.setattr(clipping, "clip_factor", lambda norms, clip: original(norms, clip * 1.001))
    with pytest.raises(AssertionError):
        check_precision()


# -- the accountant ---------------------------------------------------------------------------
def check_accountant():
    import dp_accounting
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    def eps(sigma=1.0, q=0.05, steps=50, acc="pld"):
        return accounting.epsilon_spent(
            noise_multiplier=sigma, delta=1e-5, sampling_prob=q, steps=steps, accountant=acc
        )

    for acc in ("rdp", "pld"):
        assert eps(steps=50, acc=acc) < eps(steps=100, acc=acc) < eps(steps=200, acc=acc), acc
        assert eps(q=0.02, acc=acc) < eps(q=0.05, acc=acc) < eps(q=0.1, acc=acc), acc
        assert eps(sigma=0.0, acc=acc) == math.inf
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.0)), 50
    )
    for acc, make in (("pld", PLDAccountant), ("rdp", RdpAccountant)):
        reference = make().compose(event).get_epsilon(1e-5)
        assert eps(acc=acc) == pytest.approx(reference, rel=1e-9), acc


def test_accountant_is_monotone_infinite_without_noise_and_agrees_with_dp_accounting():
    account.epsilon.cache_clear()
    check_accountant()


def test_accountant_check_still_catches_a_dropped_step(monkeypatch):
    original = Mechanism.dp_event
    monkeypatch.setattr(Mechanism, "dp_event", lambda self, steps: original(self, max(steps - 1, 1)))
    account.epsilon.cache_clear()
    try:
        with pytest.raises(AssertionError):
            check_accountant()
    finally:
        account.epsilon.cache_clear()


# -- truncation -------------------------------------------------------------------------------
def check_truncation_accounted(n=1437, expected=720, steps=150, sigma=3.5, delta=1e-5):  # eps 9.6
    q = expected / n
    epsilon = accounting.epsilon_spent(
        noise_multiplier=sigma, delta=delta, sampling_prob=q, steps=steps, accountant="rdp"
    )
    budget = accounting.truncation_budget(delta=delta, epsilon=epsilon, steps=steps)
    sampler = PoissonSampler.for_expected_batch(n, expected, 0, budget, neighbours=True)
    size = sampler.padded_batch_size
    got = accounting.guaranteed_privacy(
        sampler, noise_multiplier=sigma, delta=delta, steps=steps, accountant="rdp"
    )
    assert got["epsilon"] == epsilon
    # Independently: the larger neighbour has n + 1 examples; total variation over the steps.
    extra = (1 + math.exp(got["epsilon"])) * steps * stats.binom.sf(size, n + 1, q)
    assert got["delta"] == pytest.approx(delta + extra, rel=1e-9, abs=1e-300)
    assert extra <= 1e-3 * delta
    return size


def test_truncation_is_in_the_reported_delta_and_at_most_a_thousandth_of_it():
    check_truncation_accounted()


def test_truncation_check_still_catches_unaccounted_or_loose_padding(monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(accounting, "truncation_delta", lambda **kw: 0.0)  # planted: not accounted
        with pytest.raises(AssertionError):
            check_truncation_accounted()
    monkeypatch.setattr(accounting, "truncation_budget", lambda **kw: 1e-9)  # planted: the old padding
    with pytest.raises(AssertionError):
        check_truncation_accounted()


# -- domain inference -------------------------------------------------------------------------
def neighbour_configs(tmp_path, data: DataConfig, preset: str, rows: list[str], extra: str) -> list:
    from zoo.train.task import fit_model_to_task, load_task

    kind = zoo.get_config(preset).task
    scheme = "text" if kind == "lm" else "csv"
    configs = []
    for i, lines in enumerate((rows, [*rows, extra])):
        path = tmp_path / f"{kind}{i}.{scheme}"
        path.write_text("\n".join(lines) + "\n")
        task = load_task(dataclasses.replace(data, dataset=f"{scheme}:{path}"), task=kind, seed=0)
        configs.append(fit_model_to_task(zoo.get_config(preset), task, preset, {}))
    return configs


def check_domain(tmp_path, classes, vocabulary):
    rows = ["a,b,label", *(f"{i % 5},{i % 3},{i % 2}" for i in range(40))]
    a, b = neighbour_configs(
        tmp_path, DataConfig(classes=classes, eval_fraction=0.25), "mlp-s", rows, "1,1,7"
    )
    assert a == b, "a record with a new label changed the model"
    text = [("the quick brown fox " * 3) for _ in range(20)]
    data = DataConfig(vocabulary=vocabulary, seq_len=8, eval_fraction=0.25)
    a, b = neighbour_configs(tmp_path, data, "transformer-xs", text, "caf\u00e9 \u2603")
    assert a == b, "a record with a new character changed the model"


def test_a_neighbour_with_a_new_label_or_character_keeps_the_model_config(tmp_path):
    check_domain(tmp_path, classes=(0, 1), vocabulary="bytes")


def test_domain_check_still_catches_classes_and_vocabulary_read_from_the_data(tmp_path):
    with pytest.raises(AssertionError, match="label"):
        check_domain(tmp_path, classes=None, vocabulary="bytes")
    with pytest.raises(AssertionError, match="character"):
        check_domain(tmp_path, classes=(0, 1), vocabulary=None)


def test_a_dp_run_refuses_a_vocabulary_or_classes_from_its_data():
    from zoo.data.public import check_public_domain

    with pytest.raises(ZooError, match="data.classes"):
        check_public_domain(DataConfig(), "classify")
    with pytest.raises(ZooError, match="data.vocabulary"):
        check_public_domain(DataConfig(dataset="python-docs"), "lm")
    check_public_domain(DataConfig(classes=(0, 1)), "classify")
    check_public_domain(DataConfig(vocabulary="bytes"), "lm")
    check_public_domain(DataConfig(), "lm", checkpoint="runs/public-lm")


# -- the audit's own pitfall ------------------------------------------------------------------
M = 400


def audit_with_noise(tmp_path, monkeypatch, inclusion=None) -> tuple[float, np.ndarray]:
    """A black-box audit of a run with all-but-infinite noise: ``(lower bound, loss-drop scores)``.
    ``inclusion`` replaces the audit's coin flips."""
    from zoo import recipes
    from zoo.audit import run as audit_run
    from zoo.audit.report import audit
    from zoo.commands import settings

    if inclusion is not None:
        monkeypatch.setattr(audit_run, "draw_inclusion", lambda m, seed: inclusion)
    recipe = settings.with_values(
        recipes.load_recipe("digits-mlp-dp"),
        # dp.noise_seed: the two audits of a test draw the same noise (the root is secret otherwise)
        {
            "train.steps": 3,
            "dp.epsilon": None,
            "dp.noise_multiplier": 1e6,
            "model.d_hidden": 8,
            "dp.noise_seed": 0,
        },
    )
    summary = audit(recipe, tmp_path, canaries=M, mode="blackbox", plot=False)
    saved = np.load(tmp_path / "scores.npz")
    scores = [saved[k] for k in saved.files if k.startswith("score_")]
    return summary["epsilon_lower_bound"], scores[0]


def test_canaries_from_one_distribution_give_a_bound_of_about_zero_under_huge_noise(tmp_path, monkeypatch):
    bound, _ = audit_with_noise(tmp_path, monkeypatch)
    assert bound < 0.3, bound


def test_audit_check_still_catches_in_and_out_canaries_from_different_distributions(tmp_path, monkeypatch):
    # Planted: the included canaries are those a run scores high anyway (here: the ones whose
    # score under pure noise is above the median), i.e. in- and out-canaries differ before any
    # training. The noise drowns every canary, yet the bound is far above 0.
    _, scores = audit_with_noise(tmp_path / "fair", monkeypatch)
    biased, _ = audit_with_noise(tmp_path / "biased", monkeypatch, inclusion=scores > np.median(scores))
    assert biased > 1.0, biased


def test_the_byte_level_vocabulary_is_fixed_lossless_and_saved_with_the_run():
    from zoo.data import CharTokenizer

    tok = CharTokenizer.utf8_bytes()
    text = "caf\u00e9 \u201cx\u201d \u2603\n"
    ids = tok.encode(text)
    assert tok.vocab_size == 257 and ids.min() >= 1 and len(ids) == len(text.encode())
    assert tok.decode(ids) == text and tok == CharTokenizer.utf8_bytes()
    assert CharTokenizer.from_json(tok.to_json()) == tok
    fitted = CharTokenizer.fit("ab")  # checkpoints written before keep their JSON and load as before
    assert "byte_level" not in fitted.to_json() and CharTokenizer.from_json(fitted.to_json()) == fitted
