"""DP-SGD through the training loop: one compile, honest epsilon, clear errors."""

import dataclasses
import itertools
import json
import re
import shutil

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dp_accounting.pld import PLDAccountant
from scipy import stats

from tests.conftest import reduction_size
from tests.numerics import assert_close
from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.data import load_dataset
from zoo.dp import privatize
from zoo.dp.noise import DEFAULT_NOISE_PRNG, noise_key
from zoo.train import checkpoint
from zoo.train.loop import train_recipe
from zoo.train.run import build_run, dp_train_key, train_batch
from zoo.train.state import TrainState, train_key

TARGET = 0.5  # a large noise multiplier keeps the PLD calibration quick


def quick_dp(**values):
    return settings.with_values(
        recipes.load_recipe("digits-mlp-dp"),
        {
            "train.steps": 4,
            "train.eval_every": 2,
            "train.log_every": 2,
            "train.checkpoint_every": 4,
            "dp.epsilon": TARGET,
            **values,
        },
    )


@pytest.fixture(scope="session")  # built at most once per xdist worker
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp-run")
    recipe = quick_dp()
    return recipe, train_recipe(recipe, out, show_progress=False), out


@pytest.mark.xdist_group("dp-train-run")  # dp_run is built once, on one worker
def test_dp_step_compiles_once_and_summary_reports_privacy(dp_run):
    recipe, summary, _ = dp_run
    assert summary["compile_count"] == 1  # Poisson batches are padded to one fixed shape
    for key in ("epsilon", "delta", "noise_multiplier", "sampling_prob", "clip_norm", "steps", "accountant"):
        assert key in summary, key
    assert summary["steps"] == 4 and summary["accountant"] == "pld"
    assert summary["noise_prng"] == "philox4x32"  # dp.noise_prng = "auto" names what drew on this CPU
    assert summary["delta_accountant"] == recipe.dp.delta and summary["clip_norm"] == recipe.dp.clip_norm
    # q is the expected batch over the number of TRAINING examples (eval rows are not sampled)
    data = load_dataset(
        "digits", task="classify", seed=recipe.train.seed, eval_fraction=recipe.data.eval_fraction
    )
    assert summary["sampling_prob"] == pytest.approx(recipe.dp.expected_batch_size / data.num_train)


@pytest.mark.xdist_group("dp-train-run")  # dp_run is built once, on one worker
def test_epsilon_recomputed_independently_and_within_target(dp_run):
    _, summary, _ = dp_run
    step = dp_accounting.PoissonSampledDpEvent(
        summary["sampling_prob"], dp_accounting.GaussianDpEvent(summary["noise_multiplier"])
    )
    accountant = PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, summary["steps"]))
    epsilon = accountant.get_epsilon(summary["delta_accountant"])
    assert epsilon == pytest.approx(summary["epsilon"], rel=1e-6)
    # The reported delta adds what truncating the draws to the padded batch costs (docs/dp.md).
    n = round(summary["expected_batch_size"] / summary["sampling_prob"])
    p_trunc = stats.binom.sf(summary["padded_batch_size"], n + 1, summary["sampling_prob"])
    extra = (1 + np.exp(summary["epsilon"])) * summary["steps"] * p_trunc
    assert summary["delta"] == pytest.approx(summary["delta_accountant"] + extra, rel=1e-9)
    assert extra <= 1e-3 * summary["delta_accountant"]
    assert summary["epsilon"] <= TARGET
    assert summary["epsilon"] >= 0.95 * TARGET  # calibrated to the budget, not over-noised


@pytest.mark.xdist_group("dp-train-run")  # dp_run is built once, on one worker
def test_epsilon_logged_at_evals_is_nondecreasing(dp_run):
    _, summary, out = dp_run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], r["epsilon"]) for r in records if "epsilon" in r]
    assert [s for s, _ in evals] == [2, 4]
    spent = [e for _, e in evals]
    assert all(0 < a <= b for a, b in itertools.pairwise(spent))
    assert spent[-1] == pytest.approx(summary["epsilon"])


@pytest.mark.xdist_group("dp-train-run")  # dp_run is built once, on one worker
def test_eval_reports_the_privacy_the_checkpoint_guarantees(dp_run, capsys):
    _, summary, out = dp_run
    assert main(["eval", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("epsilon", "delta", "delta_accountant", "delta_truncation"):
        assert report[key] == pytest.approx(summary[key], rel=1e-9, abs=1e-300), key


def test_microbatched_vmap_clipping_with_a_given_noise_multiplier(tmp_path):
    recipe = quick_dp(
        **{
            "train.steps": 3,
            "train.eval_every": 3,
            "dp.clipping": "vmap",
            "train.microbatch_size": 64,
            "dp.epsilon": None,
            "dp.noise_multiplier": 8.0,
        }
    )
    summary = train_recipe(recipe, tmp_path, show_progress=False)
    assert summary["compile_count"] == 1
    assert summary["padded_batch_size"] % 64 == 0  # the scan needs whole microbatches
    assert summary["noise_multiplier"] == 8.0 and 0 < summary["epsilon"] < 1.0


@pytest.mark.parametrize(
    "setting,needles",
    [
        ("dp.epsilon=-1", ["epsilon=-1"]),
        ("dp.delta=0.5", ["delta=0.5", "1/num_examples"]),
        ("dp.clip_norm=0", ["clip_norm=0"]),
        ("dp.expected_batch_size=100000", ["expected_batch_size", "100000"]),
        ("dp.sampler=shuffle", ["sampler='shuffle'", "poisson"]),
        ("dp.noise_prng=philox2x32", ["'philox2x32'", "auto, philox4x32, rbg, threefry2x32, threefry4x32"]),
    ],
)
def test_bad_dp_settings_give_clear_errors(setting, needles, tmp_path, capsys):
    out = tmp_path / "never"
    assert (
        main(["train", "digits-mlp-dp", "--steps", "2", "--out", str(out), "--no-progress", "--set", setting])
        == 2
    )
    err = re.sub(r"\s+", " ", capsys.readouterr().err)
    for needle in needles:
        assert needle in err, err
    assert not out.exists()  # rejected before anything is written


def test_microbatched_ghost_clipping_spends_the_same_epsilon(tmp_path):
    """Ghost clipping in microbatches of 64 (zoo.microbatch) through the loop: one compile,
    a padded batch of whole microbatches, and the summary's epsilon, delta, noise and q those of
    the run without microbatches."""
    summaries = {}
    for microbatch in (None, 64):
        recipe = quick_dp(**{"train.steps": 3, "train.eval_every": 3, "train.microbatch_size": microbatch})
        summaries[microbatch] = train_recipe(recipe, tmp_path / str(microbatch), show_progress=False)
    micro, whole = summaries[64], summaries[None]
    assert micro["compile_count"] == 1 and micro["padded_batch_size"] % 64 == 0
    for key in ("epsilon", "delta_accountant", "noise_multiplier", "sampling_prob", "expected_batch_size"):
        assert micro[key] == whole[key], key


def test_dp_step_draws_its_noise_with_the_configured_sampler():
    """The engine's DP gradient is privatize(clipped sum, step key) with dp.noise_prng."""
    noise = {}
    for prng in (DEFAULT_NOISE_PRNG, "threefry2x32"):
        run = build_run(quick_dp(**{"dp.epsilon": None, "dp.noise_multiplier": 2.0, "dp.noise_prng": prng}))
        assert run.engine.dp.performance.noise_prng == prng
        trainable, frozen = run.freeze.split(run.params)
        state = TrainState.create(trainable, run.engine.optimizer, seed=0)
        batch = jax.tree.map(jnp.asarray, train_batch(run, 0))
        _, grads, _ = run.engine._dp_grads(state, frozen, batch)
        grad_sum, _, _ = run.engine.clipped_sum(state, frozen, batch)
        dp = run.engine.dp
        expected = privatize(
            grad_sum,
            state.step_key(),
            noise_multiplier=2.0,
            l2_clip_norm=dp.clip_norm,
            expected_batch_size=dp.expected_batch_size,
            prng=prng,
        )
        assert_close(grads, expected, n=reduction_size(run.cfg, batch["x"].shape[0]))
        noise[prng] = np.concatenate(
            [
                np.ravel(g - s / dp.expected_batch_size)
                for g, s in zip(jax.tree.leaves(grads), jax.tree.leaves(grad_sum), strict=True)
            ]
        )
    a, b = noise.values()
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.05  # same step key, independent noise per sampler


def test_step_keys_and_noise_keys_are_not_the_init_keys():
    """init_params draws leaf i from fold_in(key(seed), i); no step key may be one of those
    keys, or the noise of that step could be read off the published initial weights."""
    run = build_run(quick_dp())
    seed = run.recipe.train.seed
    trainable, _ = run.freeze.split(run.params)
    state = TrainState.create(trainable, run.engine.optimizer, seed=seed)
    root = jax.random.key(seed)
    init_words = set()
    for i in range(64):
        leaf_key = jax.random.fold_in(root, i)
        init_words.update(np.asarray(jax.random.key_data(leaf_key)).tolist())
        init_words.update(np.asarray(jax.random.bits(leaf_key, (8,), jnp.uint32)).tolist())
    for step in range(64):
        at_step = dataclasses.replace(state, step=jnp.int32(step))
        for key in (at_step.step_key(), noise_key(at_step.step_key(), run.engine.dp.performance.noise_prng)):
            assert not init_words.intersection(np.asarray(jax.random.key_data(key)).ravel().tolist()), step


def test_dp_noise_keys_are_secret_unless_a_noise_seed_is_given():
    recipe = quick_dp()
    a, b = (np.asarray(jax.random.key_data(dp_train_key(recipe))) for _ in range(2))
    assert not np.array_equal(a, b)  # 64 fresh bits from the OS each run
    assert not np.array_equal(a, np.asarray(jax.random.key_data(train_key(recipe.train.seed))))
    pinned = quick_dp(**{"dp.noise_seed": 123})
    np.testing.assert_array_equal(
        jax.random.key_data(dp_train_key(pinned)), jax.random.key_data(train_key(123))
    )


def test_dp_run_with_a_secret_noise_key_resumes_to_identical_params(tmp_path):
    """The secret key lives in the checkpoint's state, so a resumed run keeps drawing the same noise."""
    recipe = quick_dp(**{"train.steps": 4, "train.eval_every": 4, "train.checkpoint_every": 2})
    train_recipe(recipe, tmp_path / "whole", show_progress=False)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / checkpoint.CHECKPOINT_DIR / "4")
    assert checkpoint.latest_step(tmp_path / "resumed") == 2
    train_recipe(recipe, tmp_path / "resumed", resume=True, show_progress=False)
    whole = checkpoint.load_checkpoint(tmp_path / "whole").params
    resumed = checkpoint.load_checkpoint(tmp_path / "resumed").params
    jax.tree_util.tree_map(np.testing.assert_array_equal, whole, resumed)


def batch_seeds(tmp_path, monkeypatch, runs=2, **values) -> list[int]:
    """The sampler seed each of ``runs`` trainings of the same recipe drew its batches with."""
    from zoo.train import loop

    seen, original = [], loop.local_batch

    def local_batch(run, step, rows):
        seen.append(run.dp.sampler.seed)
        return original(run, step, rows)

    monkeypatch.setattr(loop, "local_batch", local_batch)
    fast = {"dp.epsilon": None, "dp.noise_multiplier": 5.0}  # no calibration
    recipe = quick_dp(
        **{"train.steps": 1, "train.eval_every": 1, "train.checkpoint_every": 1, **fast, **values}
    )
    for i in range(runs):
        train_recipe(recipe, tmp_path / f"r{i}", show_progress=False)
    return seen


def check_batches_are_secret(tmp_path, monkeypatch) -> None:
    """Which records a step reads is as secret as its noise: not the public train.seed's draws,
    different for two runs of one recipe, and the noise seed's own when dp.noise_seed pins it."""
    from zoo.train.state import batch_seed

    secret = batch_seeds(tmp_path / "secret", monkeypatch)
    assert len(set(secret)) == 2 and quick_dp().train.seed not in secret, secret
    pinned = batch_seeds(tmp_path / "pinned", monkeypatch, **{"dp.noise_seed": 9})
    assert pinned == [batch_seed(jax.random.key_data(train_key(9)))] * 2, pinned


def test_dp_batches_are_drawn_from_the_secret_root_key(tmp_path, monkeypatch):
    check_batches_are_secret(tmp_path, monkeypatch)


def test_the_batch_check_still_catches_batches_drawn_from_train_seed(tmp_path, monkeypatch):
    from zoo.train import stages

    public = quick_dp().train.seed  # planted: the plan's sampler seeded from the public train.seed
    monkeypatch.setattr(stages, "batch_seed", lambda rng: public)
    with pytest.raises(AssertionError):
        check_batches_are_secret(tmp_path, monkeypatch)


@pytest.mark.xdist_group("dp-train-run")  # dp_run is built once, on one worker
def test_the_checkpoints_data_digest_is_keyed_with_the_runs_secret_under_dp(dp_run, tmp_path):
    """Every checkpoint carries a digest of the training data. An unkeyed one would tell two
    neighbouring datasets apart with certainty; a DP run's is keyed with its root key."""
    from zoo.train.resume import data_digest

    recipe, _, out = dp_run
    saved = checkpoint.restore_meta(out, checkpoint.latest_step(out))["data_digest"]
    task = build_run(recipe, choose_remat=False).task.data
    arrays = (task.x_train, task.y_train)
    assert saved != data_digest(arrays)  # not the plain sha256 anyone can recompute
    state = checkpoint.restore_state(out, checkpoint.latest_step(out), None)
    assert saved == data_digest(arrays, key=np.asarray(state["rng"]).tobytes())
    assert data_digest(arrays, key=b"another key") != saved
