"""``zoo audit``: planted bugs are caught, a correct run stays under its claim, and the
mechanics (canaries sampled like examples, clipped by the step, projections) hold.

The buggy DP steps below exist only here: each one is an ``Engine`` with one piece of the
DP step broken, handed to the audit through ``tamper`` (no recipe or flag reaches it).
"""

import dataclasses
import json
import math

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant

from tests.numerics import assert_close
from zoo import recipes
from zoo.audit import run as audit_run
from zoo.audit.canaries import (
    RAW_NORM_MULTIPLE,
    WhiteBoxCanaries,
    draw_inclusion,
    example_canaries,
    gradient_canaries,
)
from zoo.audit.report import audit
from zoo.audit.run import Batches, plan_audit, train_with_canaries
from zoo.cli import main
from zoo.commands import settings
from zoo.dp import clipping
from zoo.dp.plan import make_plan
from zoo.train.engine import Engine
from zoo.train.run import build_run
from zoo.train.task import load_task

M = 1000  # at most ~4.6 can be shown with 1000 canaries at 95%: room above the claimed 3
STEPS = 60  # of digits-mlp-dp's 150: each included canary is still drawn ~22 times


def dp_recipe(**values):
    return settings.with_values(recipes.load_recipe("digits-mlp-dp"), {"train.steps": STEPS, **values})


def rebuilt(cls, engine):
    return cls(**{f.name: getattr(engine, f.name) for f in dataclasses.fields(engine)})


@dataclasses.dataclass(frozen=True)
class ReusedNoiseKey(Engine):
    """Draws every step's noise from the run's root key: the same noise each step."""

    def noise_key(self, state):
        return jax.random.wrap_key_data(state.rng)


@dataclasses.dataclass(frozen=True)
class NoNoise(Engine):
    """Divides the clipped sum by the expected batch and adds no noise at all."""

    def privatize(self, state, grad_sum):
        return jax.tree.map(lambda g: g / self.dp.expected_batch_size, grad_sum)


def tenth_of_the_noise(engine):
    """The claim is made for sigma, the noise drawn for sigma / 10."""
    dp = engine.dp.with_noise(engine.dp.noise_multiplier / 10)
    return dataclasses.replace(engine, dp=dp)


def no_clipping(monkeypatch):
    """The shared clip factor (zoo.dp.clipping.clip_factor, which both clipping paths and the
    canaries' clipping use) lets every gradient through at full size."""
    monkeypatch.setattr(clipping, "clip_factor", lambda norms, clip: jnp.ones_like(norms))


BUGS = {  # name -> (engine tamper, monkeypatch)
    "noise-divided-by-10": (tenth_of_the_noise, None),
    "clipping-skipped": (None, no_clipping),
    "same-noise-key-every-step": (lambda engine: rebuilt(ReusedNoiseKey, engine), None),
    "no-noise-at-all": (lambda engine: rebuilt(NoNoise, engine), None),
}


@pytest.mark.slow
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_whitebox_audit_catches_a_planted_bug(bug, tmp_path, monkeypatch):
    tamper, patch = BUGS[bug]
    if patch is not None:
        patch(monkeypatch)
    summary = audit(dp_recipe(), tmp_path, canaries=M, tamper=tamper, plot=False)
    print(f"{bug}: claimed {summary['epsilon_claimed']:.2f}, bounds {summary['bounds']}")  # docs/dp-audit.md
    assert 2.9 < summary["epsilon_claimed"] <= 3.0
    assert summary["epsilon_lower_bound"] > summary["epsilon_claimed"], summary
    assert summary["compile_count"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["whitebox"])  # black-box: benchmarks/dp/audit.py, docs/dp-audit.md
def test_a_correct_run_stays_below_its_claim(mode, tmp_path):
    summary = audit(dp_recipe(), tmp_path, canaries=M, mode=mode)
    assert summary["epsilon_lower_bound"] <= summary["epsilon_claimed"], summary
    assert (tmp_path / "audit.json").exists() and (tmp_path / "scores.png").stat().st_size > 10_000
    saved = np.load(tmp_path / "scores.npz")
    assert saved["included"].shape == (M,) and set(summary["bounds"]) == (
        {"sum", "spread"} if mode == "whitebox" else {"loss_drop"}
    )


@pytest.mark.slow
def test_without_noise_the_whitebox_audit_shows_epsilon_above_3(tmp_path, capsys):
    argv = [
        "digits-mlp-dp",
        "--canaries",
        str(M),
        "--no-noise",
        "--json",
        "--no-progress",
        "--out",
        str(tmp_path),
    ]
    code = main(["audit", *argv])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert code == 0
    for key in ("recipe", "mode", "canaries", "confidence", "epsilon_claimed", "epsilon_lower_bound"):
        assert key in out
    for key in ("delta", "steps", "method"):
        assert key in out
    assert out["epsilon_claimed"] == math.inf and out["noise_multiplier"] == 0.0
    assert out["epsilon_lower_bound"] >= 3.0, out


@pytest.mark.slow
def test_blackbox_audit_sees_a_model_trained_without_privacy(tmp_path):
    # digits-mlp is not DP: nothing bounds what a canary does to the model, and its
    # mislabelled out-of-distribution points are memorised enough to show.
    summary = audit(recipes.load_recipe("digits-mlp"), tmp_path, canaries=M, mode="blackbox", plot=False)
    assert summary["epsilon_claimed"] == math.inf
    assert summary["epsilon_lower_bound"] > 1.0, summary


def test_canaries_are_sampled_like_examples_and_counted_in_the_accounting():
    recipe = dp_recipe(**{"train.steps": 40})
    plan = plan_audit(recipe, 400, "whitebox")
    n_public = plan.num_real + 200
    q = recipe.dp.expected_batch_size / n_public
    assert plan.sampler.sampling_prob == pytest.approx(q, rel=1e-12)
    assert plan.sampler.num_examples == plan.num_real  # canaries have coins of their own
    # The claim is dp_accounting's epsilon for the audited run's q, sigma and steps.
    accountant = PLDAccountant()
    event = dp_accounting.PoissonSampledDpEvent(
        q, dp_accounting.GaussianDpEvent(plan.engine.dp.noise_multiplier)
    )
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, 40))
    assert plan.epsilon_claimed == pytest.approx(accountant.get_epsilon(recipe.dp.delta), rel=1e-9)
    assert plan.epsilon_claimed <= recipe.dp.epsilon
    # Excluded canaries are never drawn; included ones at rate q (binomial, 6 sigma).
    batches = Batches(plan)
    counts = sum(batches.at(step)[1] for step in range(40))
    assert not counts[~plan.included].any()
    drawn, trials = counts[plan.included].sum(), plan.included.sum() * 40
    assert abs(drawn - q * trials) < 6 * math.sqrt(trials * q * (1 - q))
    assert np.array_equal(plan.included, draw_inclusion(400, recipe.train.seed))


def projection_recipe():
    # A small expected batch keeps the real examples' sum (whose float32 rounding the
    # projections carry) near the size of one canary push; sigma is given, not calibrated.
    values = {"train.steps": 30, "dp.expected_batch_size": 64, "dp.epsilon": None, "dp.noise_multiplier": 1.5}
    return dp_recipe(**values)


def pushes(plan):
    """``[T, M]`` float64: what the canaries alone put along each direction, step by step."""
    sampled = np.stack([Batches(plan).at(step)[1] for step in range(plan.steps)]).astype(np.float64)
    recipe = plan.recipe
    canaries = gradient_canaries(
        plan.num_canaries, plan.run.freeze.trainable_count, recipe.dp.clip_norm, recipe.train.seed
    )
    assert canaries.raw_norm == RAW_NORM_MULTIPLE * recipe.dp.clip_norm  # the step clips it to C
    directions = np.asarray(canaries.directions, np.float64)
    return sampled, sampled @ (directions @ directions.T), directions.shape[1]  # C * u_j each


@pytest.mark.numerics
def test_noise_free_projections_are_the_clipped_canary_pushes():
    plan = plan_audit(projection_recipe(), 200, "whitebox", no_noise=True)
    trace = train_with_canaries(plan)
    sampled, expected, width = pushes(plan)
    assert_close(trace.projections, expected, n=width, what="noise-free projections")
    assert sampled.sum() > 50 and np.array_equal(trace.sampled, sampled.sum(axis=0))


def test_what_the_canaries_do_not_explain_is_noise_of_the_claimed_scale():
    plan = plan_audit(projection_recipe(), 200, "whitebox")
    noise = train_with_canaries(plan).projections - pushes(plan)[1]
    sigma = plan.engine.dp.noise_multiplier
    assert sigma == 1.5
    # N(0, sigma^2) along every unit direction: mean and standard deviation, 5 standard errors.
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(noise.size)
    assert abs(noise.std() / sigma - 1) < 5 / math.sqrt(2 * noise.size)


def test_blackbox_canaries_look_like_the_task_examples():
    recipe = recipes.load_recipe("python-docs-lm")
    task = load_task(recipe.data, task="lm", seed=0, max_len=64)
    lm = example_canaries(task, 8, seed=0)
    assert lm["x"].shape == (8, task.seq_len) and np.array_equal(lm["x"][:, 1:], lm["y"][:, :-1])
    assert lm["x"].min() >= 0 and lm["x"].max() < task.data.vocab_size
    digits = load_task(recipes.load_recipe("digits-mlp").data, task="classify", seed=0)
    rows = example_canaries(digits, 8, seed=0)
    assert rows["x"].shape == (8, digits.data.num_features) and rows["y"].max() < digits.data.num_classes
    assert rows["x"].min() >= digits.data.x_train.min() and rows["x"].max() <= digits.data.x_train.max()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--canaries", "1"], "--canaries must be an integer >= 2"),
        (["--confidence", "1.0"], "--confidence must be in (0, 1)"),
        (["--confidence", "0"], "--confidence must be in (0, 1)"),
        (["--mode", "grey"], "unknown mode 'grey'. Valid: blackbox, whitebox"),
        (["--unit", "person"], "unknown --unit 'person'. Valid: record, user"),
        (["--unit", "user"], "needs the column that names each record's user"),
        (["--unit", "user", "--set", "dp.enabled=false", "--mode", "blackbox"], "'digits-mlp-dp' is not DP"),
        (
            ["--dataset", "csv:/nonexistent/u.csv", "--set", "data.user_column=user"]
            + ["--set", "dp.unit=user", "--set", "dp.sampler=els"],
            "dp.sampler = 'els' has no audit yet",  # refused before the data is read
        ),
    ],
)
def test_bad_values_are_refused_in_one_line(argv, message, capsys):
    assert main(["audit", "digits-mlp-dp", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_canaries_that_all_fall_on_one_side_are_refused_before_training(capsys):
    assert draw_inclusion(2, 0).all()  # seed 0 puts both of two canaries in
    assert main(["audit", "digits-mlp-dp", "--canaries", "2", "--no-progress"]) == 2
    assert "all 2 canaries fell in" in capsys.readouterr().err


def test_non_finite_scores_are_refused_not_ranked():
    from zoo.audit.score import lower_bounds
    from zoo.errors import ZooError

    included = np.arange(100) % 2 == 0
    scores = {"sum": np.where(included, 1.0, np.nan)}
    with pytest.raises(ZooError, match="50 of 100 canary 'sum' scores are not finite"):
        lower_bounds(scores, included, 0.95, 1e-5)


def test_whitebox_audit_of_a_non_dp_recipe_is_refused(capsys):
    assert main(["audit", "digits-mlp", "--no-progress"]) == 2
    assert "is not DP" in capsys.readouterr().err
    assert main(["audit", "digits-mlp", "--mode", "blackbox", "--no-noise", "--no-progress"]) == 2


def pca_recipe(**values):
    """digits-mlp-dp with a DP-PCA projection, its noise seed pinned: two builds draw the same
    secret keys, so a difference between them is a difference in what they build."""
    pca = {"data.dp_pca": 16, "dp.pca_epsilon": 0.5, "dp.noise_seed": 7, "train.steps": 20}
    return dp_recipe(**{**pca, **values})


def update_of(optimizer, params):
    """One update of ``optimizer`` from its initial state, on gradients made of ones."""
    grads = jax.tree.map(jnp.ones_like, params)
    return optimizer.update(grads, optimizer.init(params), params)[0]


def check_audit_builds_the_training_run(recipe, num_canaries: int) -> None:
    """The audited run is `zoo train`'s build: the same arrays, the same projection (fitted with
    DP-PCA's noise and key, before any canary is mixed in), the plan make_plan makes for the
    training run's records plus the canaries, and the same engine settings."""
    trained = build_run(recipe, choose_remat=False)  # what `zoo train` builds
    audited = plan_audit(recipe, num_canaries, "whitebox")
    a, b = trained.task.data, audited.run.task.data
    for name in ("x_train", "y_train", "x_eval", "y_eval"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    assert trained.cfg.input_projection is not None and audited.run.cfg == trained.cfg
    jax.tree.map(np.testing.assert_array_equal, audited.run.params, trained.params)
    layout = trained.engine.layout
    expected = make_plan(
        recipe.dp,
        trained.task.num_train,
        recipe.train.steps,
        layout,
        seed=trained.dp.sampler.seed,
        microbatch_size=recipe.train.microbatch_size,
        canaries=num_canaries,
    )
    assert audited.engine.dp == expected.with_transform(WhiteBoxCanaries())  # the audit's, on the plan
    for name in ("cfg", "backend", "stack", "freeze", "precision"):
        assert getattr(audited.engine, name) == getattr(trained.engine, name), name
    assert audited.engine.layout.spec == layout.spec
    trainable = trained.freeze.split(trained.params)[0]
    jax.tree.map(
        np.testing.assert_array_equal,
        update_of(audited.engine.optimizer, trainable),
        update_of(trained.engine.optimizer, trainable),
    )


def test_the_audit_builds_the_run_zoo_train_builds():
    check_audit_builds_the_training_run(pca_recipe(), 100)


def test_the_audit_check_catches_a_projection_fitted_without_noise(monkeypatch):
    from zoo.train import projection

    recipe = pca_recipe()
    fit = projection.fit

    def noiseless(cfg, params, features, plan, root):  # planted: the old audit's plain PCA
        return fit(cfg, params, features, None, None)

    original = build_run

    def audited_build(*args, **kwargs):
        with monkeypatch.context() as patch:
            patch.setattr(projection, "fit", noiseless)
            return original(*args, **kwargs)

    monkeypatch.setattr(audit_run, "build_run", audited_build)
    with pytest.raises(AssertionError):
        check_audit_builds_the_training_run(recipe, 100)


# --- dp.unit = "user": each canary is a user holding dp.records_per_user records ----------

K = 3


def users_recipe(tmp_path, **values):
    """digits-mlp-dp's model on a CSV of 150 users with 1 to 9 records each, users declared by
    a column, under dp.unit = "user" with k = 3 (users above 3 records are subsampled)."""
    rng = np.random.default_rng(0)
    lines = ["user,a,b,label"]
    for user in range(150):
        for _ in range(1 + user % 9):
            a, b = rng.normal(size=2)
            lines.append(f"u{user},{a:.3f},{b:.3f},{int(a + b > 0)}")
    path = tmp_path / "users.csv"
    path.write_text("\n".join(lines) + "\n")
    sets = {
        "data.dataset": f"csv:{path}",
        "data.user_column": "user",
        "data.classes": [0, 1],
        "dp.unit": "user",
        "dp.clipping": "vmap",
        "dp.records_per_user": K,
        "dp.expected_batch_size": 16,
        "model.d_hidden": 8,
        "train.steps": 30,
    }
    return dp_recipe(**{**sets, **values})


def test_canary_users_are_drawn_as_users_and_fill_k_slots(tmp_path):
    """A black-box canary user is k canary records in one user's k consecutive slots, drawn at
    the users' rate q = E / (N_users + M/2); the real users keep the sampler's slot mask. A
    canary of one record (k = 1) or a q over records fails."""
    recipe = users_recipe(tmp_path)
    plan = plan_audit(recipe, 40, "blackbox")
    assert plan.records_per_canary == K
    n_users = plan.sampler.num_examples
    assert n_users < plan.num_real  # users, not records
    assert plan.sampler.sampling_prob == pytest.approx(recipe.dp.expected_batch_size / (n_users + 20))
    batches = Batches(plan)
    assert batches.examples["x"].shape[0] == 40 * K
    seen = 0
    for step in range(plan.steps):
        batch, sampled = batches.at(step)
        indices, mask, realised = plan.sampler.batch_indices(step)
        used = realised * K
        np.testing.assert_array_equal(batch["mask"][:used], mask[:used])
        drawn = np.flatnonzero(sampled)
        assert plan.included[drawn].all()
        for i, j in enumerate(drawn):  # canary user j fills the i-th slot row after the real users
            slots = slice(used + i * K, used + (i + 1) * K)
            np.testing.assert_array_equal(batch["x"][slots], batches.examples["x"][j * K : (j + 1) * K])
            np.testing.assert_array_equal(batch["mask"][slots], 1.0)
        assert not batch["mask"][used + drawn.size * K :].any()
        seen += drawn.size
    assert seen > 0


@pytest.mark.slow
def test_a_user_level_audit_without_noise_shows_the_leak_and_with_noise_stays_below(tmp_path, capsys):
    """``zoo audit --unit user``: canary users in the clipped sum, the bound on the user-level
    epsilon. Without noise the canaries stand out; with the recipe's noise the bound stays at
    or below the claimed user-level epsilon."""
    recipe = users_recipe(tmp_path, **{"dp.unit": "record"})  # --unit user sets it back
    path = recipe.data.dataset
    argv = ["audit", "digits-mlp-dp", "--dataset", path, "--unit", "user", "--canaries", "300"]
    argv += ["--steps", "100", "--json", "--no-progress", "--set", "data.user_column=user"]
    argv += ["--set", "data.classes=[0, 1]", "--set", f"dp.records_per_user={K}"]
    argv += ["--set", "dp.expected_batch_size=16", "--set", "model.d_hidden=8"]
    bounds = {}
    for noise in (False, True):
        out = tmp_path / f"noise-{noise}"
        assert main([*argv, "--out", str(out), *([] if noise else ["--no-noise"])]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["unit"] == "user" and summary["records_per_canary"] == K
        bounds[noise] = summary
    assert bounds[False]["epsilon_claimed"] == math.inf
    assert bounds[False]["epsilon_lower_bound"] > 2.0, bounds[False]
    assert bounds[True]["epsilon_lower_bound"] <= bounds[True]["epsilon_claimed"], bounds[True]
    print(
        "user-level audit:", {k: (v["epsilon_lower_bound"], v["epsilon_claimed"]) for k, v in bounds.items()}
    )


def test_an_audit_into_a_folder_a_live_run_holds_is_refused_in_one_line(tmp_path, capsys):
    from zoo.train import runlock

    out = tmp_path / "audit"
    with runlock.hold(out):  # another run (a zoo train, or an audit) holds the folder
        code = main(["audit", "digits-mlp-dp", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert "is in use by another zoo run" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()  # nothing written, and the folder the lock made is gone
