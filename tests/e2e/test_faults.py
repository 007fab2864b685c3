"""Fault injection: each way a run could lie or lose work, and what zoo does instead.

Resume is a continuation or a refusal; a finished run is left alone; damaged checkpoints are
skipped with a warning that names them; bad input is one plain-text line; a kill at any point
of a checkpoint write resumes to bitwise the uninterrupted result.
"""

import json
import shutil
import warnings

import dp_accounting
import jax
import jax.numpy as jnp
import pytest
from dp_accounting.pld import PLDAccountant

import zoo
from benchmarks.train import faultkit
from tests.conftest import reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.commands.sample import check_sample_args
from zoo.errors import ZooError
from zoo.train import checkpoint
from zoo.train.loop import train_recipe
from zoo.train.run import build_run

QUICK = {"train.steps": 20, "train.eval_every": 10, "train.checkpoint_every": 10, "train.log_every": 5}
QUICK_FLAGS = [f"--set={k}={v}" for k, v in QUICK.items()]
DP = {"dp.epsilon": 8.0, "dp.noise_seed": 0}


def quick(name="digits-mlp", **values):
    return settings.with_values(recipes.load_recipe(name), {**QUICK, **values})


def snapshot(run_dir):
    """Every file of a run directory with its bytes and modification time."""
    return {
        p.relative_to(run_dir).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(run_dir.rglob("*"))
        if p.is_file()
    }


def cli(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.fixture(scope="session")  # kept by its xdist group's worker to the end
def finished(tmp_path_factory):
    """A finished 20-step digits-mlp run (checkpoints at 10 and 20) and its summary."""
    out = tmp_path_factory.mktemp("finished")
    return out, train_recipe(quick(), out, show_progress=False)


@pytest.fixture(scope="session")  # kept by its xdist group's worker to the end
def dp_runs(tmp_path_factory):
    """A DP run (eps 8), whole, and a copy as if killed after step 10 (no step-20 checkpoint)."""
    whole = tmp_path_factory.mktemp("dp") / "whole"
    summary = train_recipe(quick("digits-mlp-dp", **DP), whole, show_progress=False)
    killed = copy_run(whole, whole.parent / "killed")
    shutil.rmtree(killed / "checkpoints" / "20")
    return killed, summary, whole


@pytest.fixture
def dp_killed(dp_runs):
    return dp_runs[:2]


def copy_run(src, dst):
    shutil.copytree(src, dst)
    return dst


# --- resume: a continuation or a refusal -----------------------------------------------------


@pytest.mark.xdist_group("dp-run")
@pytest.mark.parametrize(
    "change,listed",
    [
        ({"dp.epsilon": 3.0}, "dp.epsilon: 8.0 -> 3.0"),
        ({"train.seed": 1}, "train.seed: 0 -> 1"),
        ({"optim.lr": 0.1}, "optim.lr: 0.2 -> 0.1"),
        ({"model.backend": "eqx"}, 'model.backend: "nnx" -> "eqx"'),
    ],
)
def test_resume_with_changed_math_is_refused_and_lists_the_change(dp_killed, tmp_path, change, listed):
    out = copy_run(dp_killed[0], tmp_path / "run")
    before = snapshot(out)
    with pytest.raises(ZooError, match="would change the run") as info:
        train_recipe(quick("digits-mlp-dp", **{**DP, **change}), out, resume=True, show_progress=False)
    assert listed in str(info.value) and "\n" not in str(info.value)
    assert snapshot(out) == before  # recipe.json, metrics and checkpoints untouched


@pytest.mark.xdist_group("finished-run")
def test_resume_into_another_recipes_run_dir_is_refused(finished, tmp_path, capsys):
    out = copy_run(finished[0], tmp_path / "run")
    code, _, err = cli(capsys, "train", "digits-mlp-dp", "--steps", "20", "--out", str(out), "--resume")
    assert code == 2
    line = one_line(err)
    assert "dp.enabled: false -> true" in line and 'name: "digits-mlp" -> "digits-mlp-dp"' in line


@pytest.mark.xdist_group("finished-run")
def test_resume_with_fewer_steps_is_refused(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    with pytest.raises(ZooError, match="train.steps=15 would shorten the run"):
        train_recipe(quick(**{"train.steps": 15}), out, resume=True, show_progress=False)


@pytest.mark.xdist_group("dp-run")
def test_extended_dp_run_keeps_its_noise_and_accounts_every_step(dp_killed, tmp_path):
    out, planned = copy_run(dp_killed[0], tmp_path / "run"), dp_killed[1]
    with pytest.warns(RuntimeWarning, match="extending a DP run past the 20 steps"):
        summary = train_recipe(
            quick("digits-mlp-dp", **DP, **{"train.steps": 30}), out, resume=True, show_progress=False
        )
    assert summary["steps"] == 30 and summary["planned_steps"] == 20
    assert summary["noise_multiplier"] == planned["noise_multiplier"]  # the sigma the first steps used
    # epsilon of 30 steps at that sigma, composed by dp_accounting directly: above the plan's.
    step = dp_accounting.PoissonSampledDpEvent(
        summary["sampling_prob"], dp_accounting.GaussianDpEvent(summary["noise_multiplier"])
    )
    accountant = PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(step, 30))
    assert summary["epsilon"] == pytest.approx(accountant.get_epsilon(summary["delta_accountant"]), rel=1e-6)
    assert summary["epsilon"] > planned["epsilon"]
    assert summary["changed_on_resume"] == ["train.steps: 20 -> 30"]


@pytest.mark.xdist_group("dp-run")
def test_killed_dp_run_resumes_to_the_same_params_and_epsilon(dp_runs, tmp_path):
    killed, planned, whole = dp_runs
    out = copy_run(killed, tmp_path / "run")
    summary = train_recipe(quick("digits-mlp-dp", **DP), out, resume=True, show_progress=False)
    assert summary["epsilon"] == planned["epsilon"] and summary["resumed_from_step"] == 10
    assert summary["compile_count"] == 1
    assert_bitwise_equal(checkpoint.load_checkpoint(out).params, checkpoint.load_checkpoint(whole).params)


@pytest.mark.xdist_group("finished-run")
def test_remat_may_change_on_resume_and_is_recorded(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    shutil.rmtree(out / "checkpoints" / "20")
    summary = train_recipe(quick(**{"train.remat": "full"}), out, resume=True, show_progress=False)
    assert summary["changed_on_resume"] == ['train.remat: "none" -> "full"']
    assert json.loads((out / "recipe.json").read_text())["train"]["remat"] == "full"


@pytest.mark.xdist_group("finished-run")
def test_resuming_a_finished_run_changes_no_file(finished, tmp_path, capsys):
    out = copy_run(finished[0], tmp_path / "run")
    before = snapshot(out)
    summary = train_recipe(quick(), out, resume=True, show_progress=False)
    assert summary == json.loads((out / "summary.json").read_text())
    code, stdout, _ = cli(
        capsys, "train", "digits-mlp", "--steps", "20", "--out", str(out), "--resume", "--json"
    )
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1]) == summary
    assert snapshot(out) == before


@pytest.mark.xdist_group("finished-run")
def test_finished_run_without_summary_gets_one_without_training(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    (out / "summary.json").unlink()
    summary = train_recipe(quick(), out, resume=True, show_progress=False)
    assert summary["eval_accuracy"] == finished[1]["eval_accuracy"]
    assert summary["train_loss"] == finished[1]["train_loss"] and summary["compile_count"] == 0


# --- checkpoints that verify -----------------------------------------------------------------


def _largest_file(step_dir):
    return max((p for p in step_dir.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage",
    [
        lambda step: _truncate(_largest_file(step / "params")),
        lambda step: _flip_byte(_largest_file(step / "state")),
        lambda step: _truncate(step / "params" / "_METADATA"),
        lambda step: _truncate(step / "_CHECKPOINT_METADATA"),
        lambda step: (step / checkpoint.MANIFEST).unlink(),
    ],
    ids=[
        "truncated-params",
        "flipped-byte",
        "truncated-params-metadata",
        "truncated-step-metadata",
        "no-manifest",
    ],
)
@pytest.mark.xdist_group("finished-run")
def test_damaged_latest_step_falls_back_with_a_warning(finished, tmp_path, damage):
    out = copy_run(finished[0], tmp_path / "run")
    damage(out / "checkpoints" / "20")
    with pytest.warns(RuntimeWarning, match=r"checkpoint step 20 in .* is damaged .*using step 10"):
        assert checkpoint.load_checkpoint(out).step == 10
    assert checkpoint.latest_step(out) == 10


@pytest.mark.xdist_group("finished-run")
def test_eval_of_a_damaged_run_warns_in_one_line(finished, tmp_path, capsys):
    out = copy_run(finished[0], tmp_path / "run")
    _truncate(_largest_file(out / "checkpoints" / "20" / "params"))
    code, stdout, err = cli(capsys, "eval", str(out), "--json")
    assert code == 0 and json.loads(stdout.strip().splitlines()[-1])["step"] == 10
    assert "step 20" in one_line(err) and "step 10" in err


@pytest.mark.xdist_group("finished-run")
def test_no_intact_checkpoint_is_one_line_error(finished, tmp_path, capsys):
    out = copy_run(finished[0], tmp_path / "run")
    for step in ("10", "20"):
        _truncate(_largest_file(out / "checkpoints" / step / "params"))
    code, _, err = cli(capsys, "eval", str(out))
    assert code == 2
    line = one_line(err)
    assert "no intact checkpoint" in line and "step 20:" in line and "step 10:" in line


@pytest.mark.xdist_group("finished-run")
def test_resume_skips_and_keeps_a_damaged_step_and_matches_uninterrupted(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    _flip_byte(_largest_file(out / "checkpoints" / "20" / "params"))
    with pytest.warns(RuntimeWarning, match=r"moved damaged checkpoint steps \[20\]"):
        summary = train_recipe(quick(), out, resume=True, show_progress=False)
    assert summary["resumed_from_step"] == 10
    assert (out / checkpoint.DAMAGED_DIR / "20").is_dir()  # nothing is deleted
    assert_bitwise_equal(
        checkpoint.load_checkpoint(out).params, checkpoint.load_checkpoint(finished[0]).params
    )


@pytest.mark.xdist_group("finished-run")
def test_refused_resume_moves_no_damaged_step(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    _flip_byte(_largest_file(out / "checkpoints" / "20" / "params"))
    before = snapshot(out)
    with pytest.warns(RuntimeWarning, match="damaged"), pytest.raises(ZooError, match="optim.lr"):
        train_recipe(quick(**{"optim.lr": 0.1}), out, resume=True, show_progress=False)
    assert snapshot(out) == before


@pytest.mark.xdist_group("finished-run")
def test_steps_without_manifests_are_not_intact(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    for step in ("10", "20"):
        (out / "checkpoints" / step / checkpoint.MANIFEST).unlink()
    with pytest.raises(ZooError, match="no intact checkpoint"):  # a run killed before its manifests
        checkpoint.load_checkpoint(out)
    assert checkpoint.latest_step(out) is None


@pytest.mark.xdist_group("finished-run")
def test_stale_summary_of_an_extended_run_is_recomputed(finished, tmp_path):
    out = copy_run(finished[0], tmp_path / "run")
    extended = train_recipe(quick(**{"train.steps": 30}), out, resume=True, show_progress=False)
    (out / "summary.json").write_text(json.dumps(finished[1]))  # killed before the new summary
    again = train_recipe(quick(**{"train.steps": 30}), out, resume=True, show_progress=False)
    assert again["steps"] == 30 and again["compile_count"] == 0
    assert again["eval_loss"] == extended["eval_loss"] and again["train_loss"] == extended["train_loss"]


def test_resume_on_other_data_is_refused():
    from zoo.train.resume import check_same_data

    meta = {"model": {"config": {"vocab_size": 40}}, "tokenizer": "a", "data_digest": "0123"}
    check_same_data(meta, dict(meta), "run")
    with pytest.raises(ZooError, match=r"training data differ.*0123 -> 4567"):
        check_same_data(meta, {**meta, "data_digest": "4567"}, "run")
    with pytest.raises(ZooError, match=r"model.vocab_size: 40 -> 41.*tokenizer"):
        check_same_data(meta, {**meta, "model": {"config": {"vocab_size": 41}}, "tokenizer": "b"}, "run")


# --- inputs checked at the edge, the same in both backends ------------------------------------


@pytest.mark.parametrize("backend", zoo.BACKENDS)
@pytest.mark.parametrize(
    "make,match",
    [
        (lambda cfg: jnp.full((1, 8), cfg.vocab_size, jnp.int32), "outside the vocabulary"),
        (lambda cfg: jnp.full((1, 8), -1, jnp.int32), "outside the vocabulary"),
        (lambda cfg: jnp.ones((1, cfg.max_len + 1), jnp.int32), "longer than the model's max_len"),
        (lambda cfg: jnp.ones((1, 8), jnp.float32), "must be integers"),
        (lambda cfg: jnp.ones((8,), jnp.int32), r"must be \[B, T\]"),
    ],
    ids=["id-too-large", "negative-id", "too-long", "float-ids", "rank-1"],
)
def test_bad_model_inputs_raise_in_both_backends(small_transformer, backend, make, match):
    model = zoo.load_model(small_transformer, backend=backend)
    with pytest.raises((ValueError, TypeError), match=match):
        model(make(small_transformer))


@pytest.mark.parametrize("backend", zoo.BACKENDS)
def test_checked_apply_catches_bad_ids_under_jit(small_transformer, backend):
    params = zoo.to_canonical(zoo.load_model(small_transformer, backend=backend))
    checked = zoo.apply_fn(small_transformer, backend, checked=True)
    good = zoo.example_batch(small_transformer, 2)
    plain = jax.jit(zoo.apply_fn(small_transformer, backend))(params, good)
    # Two programs (the checkified one has the check fused in): the suite's float rule.
    assert_close(checked(params, good), plain, n=reduction_size(small_transformer, 2))
    bad = good.at[1, 3].set(small_transformer.vocab_size + 2)
    with pytest.raises(Exception, match=f"token id {small_transformer.vocab_size + 2} is outside"):
        checked(params, bad)


def test_bad_mlp_features_raise_in_both_backends():
    for backend in zoo.BACKENDS:
        model = zoo.load_model("mlp-s", backend=backend)
        with pytest.raises(ValueError, match="d_in=64"):
            model(jnp.ones((2, 63)))


def test_explicit_max_len_is_kept_or_refused_never_replaced():
    lm = {"model.num_layers": 1, "model.d_model": 32, "model.d_ff": 64}
    with pytest.raises(ZooError, match=r"model.max_len=32 was set explicitly.*at least 64"):
        build_run(quick("python-docs-lm", **lm, **{"model.max_len": 32, "data.seq_len": 64}))
    assert (
        build_run(quick("python-docs-lm", **lm, **{"model.max_len": 96, "data.seq_len": 64})).cfg.max_len
        == 96
    )


# --- plain text for user text -----------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,shown",
    [
        (["--dataset", "csv:data/[/b].csv"], "csv:data/[/b].csv"),
        (["--set", "train.stepz=3"], "unknown key in [train] 'stepz'"),
        (["--freeze", "blocks[a:b]"], "blocks[a:b]"),
    ],
)
def test_user_text_in_errors_is_printed_as_text(capsys, tmp_path, flags, shown):
    code, _, err = cli(capsys, "train", "digits-mlp", "--steps", "1", "--out", str(tmp_path / "x"), *flags)
    assert code == 2 and shown in " ".join(err.split())


@pytest.mark.parametrize("name", recipes.builtin_names())
def test_recipes_show_writes_toml_that_round_trips(capsys, tmp_path, name):
    for flags in ([], ["--toml"]):
        code, out, _ = cli(capsys, "recipes", "show", name, *flags)
        path = tmp_path / f"{name}.toml"
        path.write_text(out)
        assert code == 0 and recipes.load_recipe(str(path)) == recipes.load_recipe(name)


def test_recipe_text_and_none_values_round_trip(tmp_path):
    odd = 'say "hi" [b]old[/b] \\ tab\tnew\nline \x7f é 😀'
    recipe = recipes.parse_recipe({**recipes.to_dict(quick()), "name": "odd [x]", "description": odd})
    path = tmp_path / "odd.toml"
    path.write_text(recipes.to_toml(recipe))
    assert recipes.load_recipe(str(path)) == recipe
    unclipped = settings.with_values(quick(), {"optim.grad_clip_norm": None})
    assert recipes.parse_recipe(recipes.to_dict(unclipped), unclipped.name) == unclipped
    with pytest.raises(ZooError, match="grad_clip_norm = None has no TOML form"):
        recipes.to_toml(unclipped)


# --- the smaller items --------------------------------------------------------------------------


def test_resume_needs_out(capsys):
    code, _, err = cli(capsys, "train", "digits-mlp", "--resume")
    assert code == 2 and "--resume needs --out" in one_line(err)


def test_out_naming_a_file_is_an_error(tmp_path, capsys):
    target = tmp_path / "file.txt"
    target.write_text("keep me")
    code, _, err = cli(capsys, "train", "digits-mlp", "--steps", "1", "--out", str(target))
    assert code == 2 and "is a file" in one_line(err) and target.read_text() == "keep me"


def test_freezing_everything_warns():
    with pytest.warns(UserWarning, match="freezes every parameter"):
        build_run(quick(**{"freeze.patterns": ["*"]}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        build_run(quick(**{"freeze.patterns": ["in_proj"]}))


@pytest.mark.parametrize(
    "prompt,length,temperature,match",
    [
        ("def ", 10, float("nan"), "--temperature"),
        ("def ", 10, float("inf"), "--temperature"),
        ("def ", 10, -1.0, "--temperature"),
        ("def ", 0, 0.8, "--max-new-tokens"),
        ("def ", -5, 0.8, "--max-new-tokens"),
        ("", 10, 0.8, "--prompt is empty"),
    ],
)
def test_sample_rejects_arguments_that_give_nothing_or_garbage(prompt, length, temperature, match):
    with pytest.raises(ZooError, match=match):
        check_sample_args(prompt, length, temperature)


def test_sample_cli_checks_arguments_first(capsys, tmp_path):
    code, _, err = cli(capsys, "sample", str(tmp_path), "--prompt", "x", "--temperature", "nan")
    assert code == 2 and "--temperature" in one_line(err)
    check_sample_args("x", 1, 0.0)  # greedy is valid


@pytest.mark.xdist_group("finished-run")
def test_classifier_metrics_carry_no_bits_per_char(finished):
    out, summary = finished
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if "eval_loss" in line]
    assert evals and all("eval_bits_per_char" not in line for line in evals)
    assert "eval_bits_per_char" not in summary and "eval_accuracy" in summary


def test_ctrl_c_prints_no_traceback_and_resume_logs_each_step_once(tmp_path):
    out = tmp_path / "run"
    flags = ["digits-mlp", *QUICK_FLAGS, "--no-progress", "--out", str(out)]
    interrupted = faultkit.victim("sigint-log", 15, 0.0, *flags)  # logged past the step-10 checkpoint
    assert interrupted.returncode == 130, interrupted.stderr
    assert "Traceback" not in interrupted.stderr and "--resume --out" in interrupted.stderr
    assert checkpoint.latest_step(out) == 10
    train_recipe(quick(), out, resume=True, show_progress=False)
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines if "loss" in line] == [5, 10, 15, 20]
    assert [line["step"] for line in lines if "eval_loss" in line] == [10, 20]


# --- a kill at a random point of a checkpoint write ---------------------------------------------


@pytest.fixture(scope="session")  # built at most once per xdist worker
def reference_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference") / "run"
    faultkit.run_reference(out)
    return out


@pytest.mark.slow
def test_kill_during_checkpoint_write_resumes_bitwise(reference_run, tmp_path):
    # Killed inside the step-30 save, after orbax renamed the step into place and before the
    # manifest landed: the one moment a complete-looking step is not yet a checkpoint.
    # benchmarks/train/faults.py kills at 20 random points of the write.
    trial = faultkit.one_trial(tmp_path, reference_run, 0.0, mode="kill-manifest")
    assert trial["left"].startswith("damaged: it has no zoo_manifest.json"), trial
    assert trial["bitwise"] and trial["resumed_from"] == 20, trial
