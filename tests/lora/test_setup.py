"""LoRA: adapters on a frozen base, in both backends, trained, checkpointed and merged."""

import dataclasses
import shutil

import jax
import numpy as np
import pytest

import zoo
from tests.conftest import fast_jit, labels_for, loss_of, random_params, reduction_size
from tests.numerics import assert_bitwise_equal, assert_close
from zoo import lora, recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.configs import LoraConfig
from zoo.errors import ZooError
from zoo.lora import export as lora_export
from zoo.lora.merge import merged_weights
from zoo.losses import per_example_loss
from zoo.models import canonical, registry
from zoo.models.paths import flat_by_path
from zoo.train import checkpoint
from zoo.train.loop import train_recipe
from zoo.train.run import build_run

KINDS = {kind.name: kind.small for kind in registry.kinds()}
B = 4


def adapted(cfg, targets=("*",), rank=3):
    setup = lora.resolve(cfg, LoraConfig(rank=rank, targets=tuple(targets)))
    return lora.adapted_config(cfg, setup), setup


def trained_like(cfg, seed=0):
    """Random canonical params whose adapters are nonzero but small next to their weights, as
    after fine-tuning. (B at full fan-in scale doubles every adapted weight; random llama-xs
    logits then saturate and float32 gradients drift 2e-4 from float64 in both backends alike,
    while the two backends agree in float64 to 1e-14: ill-conditioning, not a difference.)"""
    params = random_params(cfg, seed)
    return jax.tree_util.tree_map_with_path(
        lambda path, v: v * np.float32(0.1) if "lora_b" in jax.tree_util.keystr(path) else v, params
    )


def flat(tree):
    return {k: np.asarray(v) for k, v in flat_by_path(tree).items()}


# --------------------------------------------------------------------------- the adapted model


@pytest.mark.numerics
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_adapters_give_the_same_logits_and_grads_in_both_backends(kind):
    cfg, setup = adapted(KINDS[kind])
    plan = lora.freeze_plan(cfg, setup)
    params = trained_like(cfg)  # adapters B nonzero too: every adapter leaf is exercised
    trainable, frozen = plan.split(params)
    x = np.asarray(cfg.example_input(jax.random.key(1), B))
    y = np.asarray(cfg.example_labels(jax.random.key(2), x))

    def loss_and_grad(backend):
        def loss(t):
            logits = zoo.apply_fn(cfg, backend)(plan.merge(t, frozen), x)
            return per_example_loss(logits, y).mean(), logits

        return jax.value_and_grad(loss, has_aux=True)(trainable)

    out = fast_jit(lambda: {b: loss_and_grad(b) for b in ("nnx", "eqx")})()
    (_, logits_nnx), grads_nnx = out["nnx"]
    (_, logits_eqx), grads_eqx = out["eqx"]
    n = reduction_size(cfg, B)
    assert_close(logits_eqx, logits_nnx, n=n, what="logits")
    assert_close(grads_eqx, grads_nnx, n=n, what="adapter grads")
    assert set(flat(grads_nnx)) == {p for t in setup.spec.targets for p in lora.adapter_paths(t)}


@pytest.mark.numerics
def test_fresh_adapters_add_nothing_and_merging_gives_the_adapted_logits():
    base_cfg = KINDS["transformer"]
    cfg, _ = adapted(base_cfg)
    base, fresh = canonical.init_params(base_cfg, 0), canonical.init_params(cfg, 0)
    # adapters draw from their own stream: the base leaves are bitwise those of the base config
    assert_bitwise_equal({k: v for k, v in flat(fresh).items() if k in flat(base)}, flat(base))
    assert not np.any(flat(fresh)["blocks.attn.q.lora_b.w"])  # B starts at zero
    assert np.std(flat(fresh)["blocks.attn.q.lora_a.w"]) > 0
    trained = trained_like(cfg, seed=3)
    x = np.asarray(cfg.example_input(jax.random.key(1), B))
    out = fast_jit(
        lambda: {
            "base": zoo.apply_fn(base_cfg, "nnx")(base, x),
            "fresh": zoo.apply_fn(cfg, "nnx")(fresh, x),
            "adapted": zoo.apply_fn(cfg, "eqx")(trained, x),
            "merged": zoo.apply_fn(base_cfg, "eqx")(merged_weights(trained, cfg.lora), x),
        }
    )()
    n = reduction_size(cfg, B)
    assert_close(out["fresh"], out["base"], n=n, what="fresh adapters")
    assert_close(out["merged"], out["adapted"], n=n, what="merged")
    assert not np.allclose(out["adapted"], out["base"], atol=1e-2)  # the trained adapters do something


# --------------------------------------------------------------------------- targets and the plan


def test_targets_resolve_against_dense_paths_with_layer_ranges():
    cfg = zoo.get_config("transformer-s")  # 4 layers
    _, setup = adapted(cfg, ["attn.q", "blocks[2:4].mlp.*", "head"], rank=8)
    assert setup.spec.targets == ("blocks.attn.q", "blocks.mlp.down", "blocks.mlp.up", "head")
    assert setup.rows == {
        "blocks.attn.q": (0, 1, 2, 3),
        "blocks.mlp.down": (2, 3),
        "blocks.mlp.up": (2, 3),
        "head": None,
    }
    lcfg = lora.adapted_config(cfg, setup)
    plan = lora.freeze_plan(lcfg, setup)
    shapes = canonical.canonical_shapes(lcfg)
    assert str(plan.trainable("blocks.mlp.up.lora_a.w")) == "layers 2:4 of 4"
    assert plan.trainable("blocks.attn.q.w").none and plan.trainable("head.lora_b.w").whole
    expected = sum(
        int(np.prod(s)) * (1 if p.startswith("head") or ".attn." in p else 0.5)
        for p, s in shapes.items()
        if lora.is_adapter_path(p)
    )
    assert plan.trainable_count == expected and plan.frozen_prefix == 0


def test_a_layer_range_on_every_target_freezes_the_prefix():
    cfg = zoo.get_config("transformer-s")
    lcfg, setup = adapted(cfg, ["blocks[2:].attn.*"], rank=8)
    assert lora.freeze_plan(lcfg, setup).frozen_prefix == 2  # layers 0, 1 run as a gradient-free scan


def test_rank_8_adapters_count_2_r_d_per_matrix_on_transformer_s():
    # rank r on a D x D projection adds r (D + D) scalars: at D = 128, 12.5% of the matrix. On
    # q and v that is 1.95% of transformer-s; on all four of attn.* it is 3.9% (no rank-8
    # choice of all four reaches 2% at this width).
    cfg = zoo.get_config("transformer-s")
    base = sum(int(np.prod(s)) for s in canonical.canonical_shapes(cfg).values())
    d, layers = cfg.d_model, cfg.num_layers
    for targets, count in ((["attn.q", "attn.v"], 2), (["attn.*"], 4)):
        lcfg, setup = adapted(cfg, targets, rank=8)
        plan = lora.freeze_plan(lcfg, setup)
        assert plan.trainable_count == count * layers * 8 * (d + d)
        assert plan.frozen_count == base
    assert 2 * layers * 8 * 2 * d <= 0.02 * base


def test_bad_targets_and_specs_are_one_clear_line():
    cfg = KINDS["transformer"]
    with pytest.raises(ZooError, match=r"'attn\.x' matches no dense layer.*blocks\.attn\.k, blocks\.attn\.o"):
        adapted(cfg, ["attn.x"])
    with pytest.raises(ZooError, match=r"LoRA target: .*'attn\[0\]': .*only allowed directly after 'blocks'"):
        adapted(cfg, ["attn[0]"])
    with pytest.raises(ZooError, match=r"layer 7 is out of range"):
        adapted(cfg, ["blocks[7].attn.q"])
    with pytest.raises(ZooError, match="names no rank"):
        lora.parse_flag("alpha=4,targets=attn.q")
    with pytest.raises(ZooError, match=r"'depth=2' is not KEY=VALUE"):
        lora.parse_flag("rank=4,depth=2")
    with pytest.raises(
        ZooError, match=r"'dropout=0\.1' is not KEY=VALUE with KEY one of rank, alpha, targets"
    ):
        lora.parse_flag("rank=4,targets=attn.q,dropout=0.1")
    with pytest.raises(ZooError, match="targets is empty"):
        LoraConfig(rank=4)
    assert lora.parse_flag("rank=8,alpha=16,targets=attn.q|attn.v") == {
        "lora.rank": 8,
        "lora.alpha": 16.0,
        "lora.targets": ["attn.q", "attn.v"],
    }


# --------------------------------------------------------------------------- a LoRA run

FAST = {"train.steps": 20, "train.eval_every": 20, "train.checkpoint_every": 20, "train.eval_batches": 2}


# Session scope: the worker that runs the "lora-run" group keeps them to the end. A module
# fixture is torn down whenever that worker runs another module's test in between, and was
# rebuilt (about 25 s a run).
@pytest.fixture(scope="session")
def base_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    train_recipe(
        settings.with_values(recipes.load_recipe("digits-transformer-pretrain"), FAST),
        out,
        show_progress=False,
    )
    return out


def lora_recipe(base, **values):
    return settings.with_values(
        recipes.load_recipe("digits-transformer-dp-lora"), {**FAST, "model.init_from": str(base), **values}
    )


@pytest.fixture(scope="session")
def lora_run(base_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("lora")
    return out, train_recipe(lora_recipe(base_run), out, show_progress=False)


@pytest.mark.xdist_group("lora-run")  # one worker builds the module's runs once
def test_dp_lora_run_moves_only_adapters_and_saves_only_them(base_run, lora_run):
    out, summary = lora_run
    base = flat(checkpoint.load_checkpoint(base_run).params)
    after = flat(checkpoint.load_checkpoint(out).params)
    assert_bitwise_equal({k: after[k] for k in base}, base)  # the base, bitwise unchanged
    assert np.any(after["blocks.attn.q.lora_b.w"]) and np.any(after["head.lora_b.w"])
    saved = flat(checkpoint._restore(out, 20, params=checkpoint.ocp.args.StandardRestore())["params"])
    assert set(saved) == {k for k in after if lora.is_adapter_path(k)}
    assert summary["lora"] == {
        "rank": 8,
        "alpha": 16.0,
        "targets": ["attn.*", "mlp.*", "head"],
        "adapter_params": summary["trainable_params"],
    }
    assert summary["compile_count"] == 1 and summary["epsilon"] <= 3.0


@pytest.mark.xdist_group("lora-run")
def test_no_optimizer_state_and_no_gradient_for_the_base(base_run):
    run = build_run(lora_recipe(base_run))
    state, frozen = run.engine.init_state(run.params, 0)
    assert all(lora.is_adapter_path(p) for p in flat(state.params))
    assert not any(lora.is_adapter_path(p) for p in flat(frozen))
    moments = sum(x.size for x in jax.tree_util.tree_leaves(state.opt_state) if x.ndim)
    assert moments == 2 * run.freeze.trainable_count  # adamw: two moments per adapter scalar


@pytest.mark.xdist_group("lora-run")  # one worker builds the module's runs once
def test_merged_export_gives_the_adapted_logits(lora_run, tmp_path):
    out, _ = lora_run
    assert main(["export", str(out), "--merge", "--out", str(tmp_path / "merged")]) == 0
    adapted_ckpt, merged = checkpoint.load_checkpoint(out), checkpoint.load_checkpoint(tmp_path / "merged")
    assert merged.model_config == dataclasses.replace(adapted_ckpt.model_config, lora=None)
    assert not any(lora.is_adapter_path(p) for p in flat(merged.params))
    x = np.asarray(merged.model_config.example_input(jax.random.key(0), 16))
    logits = fast_jit(
        lambda: (
            zoo.apply_fn(adapted_ckpt.model_config, "nnx")(adapted_ckpt.params, x),
            zoo.apply_fn(merged.model_config, "eqx")(merged.params, x),
        )
    )()
    assert_close(logits[1], logits[0], n=reduction_size(merged.model_config, 16), what="merged logits")
    with pytest.raises(ZooError, match="already holds checkpoints"):
        lora_export.export(out, tmp_path / "merged", merge=True, checkpoints=checkpoint)
    # without --merge: base and adapters in one checkpoint that no longer refers to the base
    lora_export.export(out, tmp_path / "copy", merge=False, checkpoints=checkpoint)
    copy = checkpoint.load_checkpoint(tmp_path / "copy")
    assert copy.model_config == adapted_ckpt.model_config
    assert_bitwise_equal(flat(copy.params), flat(adapted_ckpt.params))
    assert checkpoint.LORA_BASE not in checkpoint.restore_meta(tmp_path / "copy", copy.step)


@pytest.mark.xdist_group("lora-run")  # one worker builds the module's runs once
def test_resume_takes_the_base_from_the_reference_and_refuses_a_moved_base(base_run, lora_run, tmp_path):
    out, _ = lora_run
    copy = tmp_path / "lora"
    shutil.copytree(out, copy)
    with pytest.warns(RuntimeWarning, match="extending a DP run past the 20 steps"):
        summary = train_recipe(
            lora_recipe(base_run, **{"train.steps": 24}), copy, resume=True, show_progress=False
        )
    assert summary["resumed_from_step"] == 20 and summary["compile_count"] == 1
    moved = base_run.with_name(base_run.name + "-moved")
    base_run.rename(moved)
    try:
        with pytest.raises(ZooError, match=r"the base of the LoRA run .* cannot be used: it is not there"):
            checkpoint.load_checkpoint(copy)
    finally:
        moved.rename(base_run)


@pytest.mark.xdist_group("lora-run")  # base_run is built once, on that group's worker
def test_lora_needs_a_base_and_no_freeze_patterns(base_run):
    with pytest.raises(ZooError, match="needs|--init-from DIR"):
        build_run(lora_recipe(base_run, **{"model.init_from": None}))
    with pytest.raises(ZooError, match="drop --freeze"):
        build_run(lora_recipe(base_run, **{"freeze.patterns": ["embed"]}))


@pytest.mark.numerics
def test_remat_policies_keep_the_adapter_gradients():
    # The adapters' inner products (x A) carry no name: every policy recomputes or saves them
    # like any other unnamed value. A policy that recomputes all and one that offloads, 4 deep.
    cfg, _ = adapted(zoo.get_config(KINDS["transformer"], num_layers=4), ["attn.*", "mlp.up"])
    params = trained_like(cfg, seed=1)
    x = zoo.example_batch(cfg, 3, seed=2, seq_len=8)
    y = labels_for(cfg, x)
    policies = ("none", "full", "offload-minimal")
    out = fast_jit(
        lambda p: {pol: jax.value_and_grad(loss_of(cfg, "nnx", pol))(p, x, y) for pol in policies}
    )(params)
    for policy in policies[1:]:
        assert_close(out[policy], out["none"], n=reduction_size(cfg, 3), what=policy)
