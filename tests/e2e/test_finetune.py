"""Fine-tuning from a checkpoint with frozen layers: frozen means frozen."""

import json
import shutil

import jax
import numpy as np
import pytest

from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.errors import ZooError
from zoo.train import checkpoint
from zoo.train.loop import train_recipe
from zoo.train.run import build_run

FAST = {"train.steps": 30, "train.eval_every": 30, "train.checkpoint_every": 30}


@pytest.fixture(scope="session")  # built at most once per xdist worker
def pretrained(tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrain")
    recipe = settings.with_values(recipes.load_recipe("digits-mlp-pretrain"), FAST)
    train_recipe(recipe, out, show_progress=False)
    return out


def finetune_recipe(source, patterns=("in_proj", "blocks[:-1]"), **values):
    return settings.with_values(
        recipes.load_recipe("digits-mlp-finetune"),
        {**FAST, "model.init_from": str(source), "freeze.patterns": list(patterns), **values},
    )


def _leaves(tree):
    return {
        jax.tree_util.keystr(p, simple=True, separator="."): np.asarray(x)
        for p, x in jax.tree_util.tree_leaves_with_path(tree)
    }


def test_frozen_weights_are_bitwise_unchanged_and_the_rest_moves(pretrained, tmp_path):
    before = _leaves(checkpoint.load_checkpoint(pretrained).params)
    summary = train_recipe(finetune_recipe(pretrained), tmp_path, show_progress=False)
    after = _leaves(checkpoint.load_checkpoint(tmp_path).params)
    np.testing.assert_array_equal(after["in_proj.w"], before["in_proj.w"])
    np.testing.assert_array_equal(after["blocks.dense.w"][0], before["blocks.dense.w"][0])
    assert not np.array_equal(after["blocks.dense.w"][1], before["blocks.dense.w"][1])
    assert not np.array_equal(after["head.w"], before["head.w"])
    assert summary["compile_count"] == 1


def test_no_optimizer_state_and_no_gradient_for_frozen(pretrained):
    run = build_run(finetune_recipe(pretrained))
    state, frozen = run.engine.init_state(run.params, 0)
    trainable_paths = set(_leaves(state.params))
    assert "in_proj.w" not in trainable_paths and "in_proj.w" in _leaves(frozen)
    # adamw keeps two moments per trainable scalar (plus scalar counters)
    moment_scalars = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state) if x.ndim)
    assert moment_scalars == 2 * run.freeze.trainable_count
    # the compiled step's outputs hold no frozen leaf: nothing is differentiated for them
    batch = jax.tree_util.tree_map(
        np.asarray,
        {"x": np.zeros((4, 64), np.float32), "y": np.zeros(4, np.int32), "mask": np.ones(4, np.float32)},
    )
    out_state, _ = jax.eval_shape(run.engine.train_step_fn, state, frozen, batch)
    assert set(_leaves(out_state.params)) == trainable_paths
    jaxpr = jax.make_jaxpr(run.engine.train_step_fn)(state, frozen, batch)
    frozen_invars = jaxpr.jaxpr.invars[len(jax.tree_util.tree_leaves(state)) :][
        : len(jax.tree_util.tree_leaves(frozen))
    ]
    # frozen inputs only feed the forward pass: none reaches an output unchanged or summed
    assert not set(map(id, frozen_invars)) & set(map(id, jaxpr.jaxpr.outvars))


def test_init_from_mismatch_is_a_clear_error(pretrained):
    bad = settings.with_values(finetune_recipe(pretrained), {"model.preset": "mlp-s"})
    with pytest.raises(ZooError, match=r"does not fit.*blocks.dense.w"):
        build_run(bad)


def test_pattern_matching_nothing_lists_paths(pretrained):
    with pytest.raises(ZooError, match=r"in_prj.*in_proj"):
        build_run(finetune_recipe(pretrained, patterns=("in_prj",)))


def test_load_checkpoint_from_python(pretrained):
    import zoo

    ckpt = zoo.load_checkpoint(pretrained)
    assert ckpt.recipe.name == "digits-mlp-pretrain"
    assert ckpt.recipe.data.classes == (0, 1, 2, 3, 4)
    assert ckpt.params["head"]["w"].shape == (256, 5)


def test_params_command_marks_frozen(pretrained, capsys):
    assert main(["params", "digits-mlp", "--freeze", "in_proj", "--freeze", "blocks[0]", "--json"]) == 0
    table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    marks = {r["path"]: r["trainable"] for r in table["rows"]}
    assert marks["in_proj.w"] == "no" and marks["head.w"] == "yes"
    assert table["frozen"] == 64 * 128 + 128 + 128 * 128 + 128


def test_bench_finetune_frozen_prefix_saves_memory_and_optimizer_state():
    from zoo.bench.finetune import bench_finetune

    result = bench_finetune(
        "transformer-xs", batch=4, seq=16, steps=2, repeats=1, lora="rank=4,targets=attn.*"
    )
    full, frozen, lora, dp_lora = result["rows"]
    assert [r["run"] for r in result["rows"]] == ["full", "frozen", "lora", "dp-lora"]
    assert frozen["temp_bytes"] < full["temp_bytes"]
    assert frozen["trainable_params"] < full["trainable_params"]
    # adamw state is two moments per trainable scalar, plus a few scalar counters
    for row in (frozen, lora, dp_lora):
        assert row["opt_state_ratio"] == pytest.approx(row["trainable_ratio"], rel=1e-2)
    assert lora["temp_bytes"] <= full["temp_bytes"]  # no weight gradients for the frozen base
    # 4 projections x 2 layers x rank 4 x (d_in + d_out)
    assert lora["trainable_params"] == dp_lora["trainable_params"] == 4 * 2 * 4 * (64 + 64)
    assert "vs_lora" in dp_lora


def test_resumed_fine_tune_takes_frozen_weights_from_its_own_checkpoint(pretrained, tmp_path):
    """A fine-tune resumes with the frozen weights it started from, even after its source run
    has moved on (trained further), and ends bitwise where an uninterrupted one does."""
    source = tmp_path / "source"
    shutil.copytree(pretrained, source)
    recipe = finetune_recipe(source, **{"train.checkpoint_every": 10})
    whole = train_recipe(recipe, tmp_path / "whole", show_progress=False)
    killed = tmp_path / "killed"
    train_recipe(recipe, killed, show_progress=False)
    shutil.rmtree(killed / "checkpoints" / "30")
    pretrain = settings.with_values(recipes.load_recipe("digits-mlp-pretrain"), {**FAST, "train.steps": 60})
    train_recipe(pretrain, source, resume=True, show_progress=False)  # the source's newest step moves on
    assert checkpoint.load_checkpoint(source).step == 60
    resumed = train_recipe(recipe, killed, resume=True, show_progress=False)
    assert resumed["compile_count"] == 1 and resumed["resumed_from_step"] == 20
    a = _leaves(checkpoint.load_checkpoint(tmp_path / "whole").params)
    b = _leaves(checkpoint.load_checkpoint(killed).params)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert whole["eval_loss"] == resumed["eval_loss"]


def test_the_start_point_is_model_init_from(tmp_path):
    """``model.init_from`` reads, round-trips and is overridden; ``[freeze] init_from`` is not
    a key (it was, before zoo's first release)."""
    path = tmp_path / "start.toml"
    path.write_text('[model]\npreset = "mlp-s"\ninit_from = "runs/x"\n\n[freeze]\npatterns = ["in_proj"]\n')
    recipe = recipes.load_recipe(str(path))
    assert recipe.model.init_from == "runs/x" and recipe.freeze.patterns == ("in_proj",)
    doc = recipes.to_dict(recipe)
    assert doc["model"]["init_from"] == "runs/x" and "init_from" not in doc["freeze"]
    assert recipes.parse_recipe(doc, "start") == recipe
    assert settings.with_values(recipe, {"model.init_from": None}).model.init_from is None
    assert settings.with_values(recipe, {"model.init_from": "runs/y"}).model.init_from == "runs/y"
    with pytest.raises(ZooError, match="model.init_from must be str"):
        settings.with_values(recipe, {"model.init_from": 3})
    with pytest.raises(ZooError, match=r"unknown key in \[freeze\] 'init_from'"):
        settings.with_values(recipe, {"freeze.init_from": "runs/x"})
