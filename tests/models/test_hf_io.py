"""Hugging Face checkpoints: each fixture of ``tests/fixtures/hf`` (written by its
``make_fixtures.py`` with ``transformers``) imported into both backends gives transformers'
logits, loss and gradients; export gives the fixture's tensors and config back; bad input is
one line naming the file and the key."""

from __future__ import annotations

import dataclasses
import functools
import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from safetensors.numpy import load_file

import zoo
from tests.numerics import assert_bitwise_equal, assert_close
from zoo.cli import main
from zoo.errors import ZooError
from zoo.models import hf_io
from zoo.models.paths import flat_by_path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "hf"
NAMES = ("gpt2", "llama-kv1", "llama-kv2", "llama-kv4", "llama3-tied", "llama-bf16", "llama-sharded")

pytestmark = pytest.mark.xdist_group("hf")


@functools.cache
def fixture(name: str):
    """``(config, canonical params, reference)`` of one fixture, loaded once."""
    cfg, params = hf_io.load(FIXTURES / name)
    return cfg, params, load_file(str(FIXTURES / name / "reference.safetensors"))


def lm_loss(apply, params, ids):
    """transformers' causal-LM loss: the mean next-token cross-entropy."""
    logits = apply(params, ids)
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, :-1], ids[:, 1:]).mean(), logits


@functools.cache
def step_fn(cfg, backend: str):
    """One compiled loss-and-gradient step per config (the bf16 and sharded copies share
    theirs with the fixtures they copy)."""
    return jax.jit(jax.value_and_grad(functools.partial(lm_loss, zoo.apply_fn(cfg, backend)), has_aux=True))


@functools.cache
def computed(name: str, backend: str):
    cfg, params, ref = fixture(name)
    (loss, logits), grads = step_fn(cfg, backend)(params, jnp.asarray(ref["ids"]))
    return loss, logits, hf_io.hf_tensors(cfg, flat_by_path(grads))


@pytest.mark.numerics
@pytest.mark.parametrize("backend", zoo.BACKENDS)
@pytest.mark.parametrize("name", NAMES)
def test_fixture_gives_transformers_logits_loss_and_gradients(name, backend):
    cfg, _, ref = fixture(name)
    loss, logits, grads = computed(name, backend)
    batch, seq = ref["ids"].shape
    width = max(cfg.d_model, cfg.d_ff, cfg.num_heads * cfg.d_head)
    assert logits.shape == ref["logits"].shape
    assert_close(np.asarray(logits), ref["logits"], n=max(seq, width), what=f"{name} logits")
    assert_close(np.asarray(loss), ref["loss"], n=batch * seq * cfg.vocab_size, what=f"{name} loss")
    expected = {k[len("grad.") :]: v for k, v in ref.items() if k.startswith("grad.")}
    assert set(grads) == set(expected)
    assert_close(grads, expected, n=batch * seq * width, what=f"{name} gradients")


def test_the_rule_catches_a_rotary_layout_bug():
    """Interleaved pairs instead of rotate-half: the 520-token fixture sees it."""
    cfg, params, ref = fixture("llama3-tied")
    flat = flat_by_path(params)
    d = cfg.d_head
    perm = np.concatenate([np.arange(d)[0::2], np.arange(d)[1::2]])  # a wrong head layout
    heads = np.concatenate([perm + h * d for h in range(cfg.num_kv_heads)])
    flat["blocks.attn.k.w"] = flat["blocks.attn.k.w"][..., heads]
    logits = zoo.apply_fn(cfg, "nnx")(zoo.models.paths.nest_by_path(flat), jnp.asarray(ref["ids"]))
    with pytest.raises(AssertionError):
        assert_close(np.asarray(logits), ref["logits"], n=max(ref["ids"].shape[1], cfg.d_ff))


def _stored(src: Path) -> dict[str, np.ndarray]:
    if (src / hf_io.INDEX).exists():
        shards = set(json.loads((src / hf_io.INDEX).read_text())["weight_map"].values())
        return {k: v for shard in shards for k, v in load_file(str(src / shard)).items()}
    return load_file(str(src / hf_io.WEIGHTS)) if "bf16" not in src.name else None


@pytest.mark.parametrize("name", ["gpt2", "llama3-tied", "llama-sharded", "llama-kv4"])
def test_export_gives_the_fixtures_tensors_and_config(name, tmp_path):
    cfg, params, _ = fixture(name)
    hf_io.save(cfg, params, tmp_path / "out")
    exported = load_file(str(tmp_path / "out" / hf_io.WEIGHTS))
    assert_bitwise_equal(exported, _stored(FIXTURES / name))
    original = json.loads((FIXTURES / name / hf_io.CONFIG).read_text())
    written = json.loads((tmp_path / "out" / hf_io.CONFIG).read_text())
    fields = set(original) & set(written) - {"dtype", "torch_dtype", "transformers_version", "bos_token_id"}
    fields -= {"eos_token_id", "rope_scaling", "rope_theta"}  # transformers 5 writes rope_parameters
    assert {k: written[k] for k in fields} == {k: original[k] for k in fields}
    assert hf_io.read_config(tmp_path / "out")[0] == cfg
    # the weights are as readable as the config beside them (safetensors alone makes them 0600)
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "out").iterdir()}
    assert modes[hf_io.WEIGHTS] == modes[hf_io.CONFIG], modes


@pytest.mark.numerics
def test_import_writes_a_checkpoint_that_load_checkpoint_and_apply_fn_read(tmp_path):
    """The contract: zoo import SRC --out DIR; zoo.load_checkpoint(DIR); zoo.apply_fn(...)."""
    assert main(["import", str(FIXTURES / "gpt2"), "--out", str(tmp_path / "imp"), "--backend", "eqx"]) == 0
    ck = zoo.load_checkpoint(tmp_path / "imp")
    assert ck.backend == "eqx"
    _, params, ref = fixture("gpt2")
    assert_bitwise_equal(ck.params, jax.tree_util.tree_map(np.asarray, params))
    (_, logits), _ = step_fn(ck.model_config, ck.backend)(ck.params, jnp.asarray(ref["ids"]))
    assert_close(np.asarray(logits), ref["logits"], n=ck.model_config.d_ff, what="logits")
    assert main(["export", str(tmp_path / "imp"), "--format", "hf", "--out", str(tmp_path / "exp")]) == 0
    again, back = hf_io.load(tmp_path / "exp")
    assert again == ck.model_config
    assert_bitwise_equal(back, jax.tree_util.tree_map(np.asarray, ck.params))


def test_bfloat16_import_keeps_the_stored_values():
    cfg, params = hf_io.load(FIXTURES / "llama-bf16", "bfloat16")
    _, as_f32, _ = fixture("llama-bf16")
    assert {str(x.dtype) for x in flat_by_path(params).values()} == {"bfloat16"}
    assert_bitwise_equal(jax.tree_util.tree_map(lambda x: x.astype(np.float32), params), as_f32)


def _copy(name: str, tmp_path: Path) -> Path:
    out = tmp_path / name
    shutil.copytree(FIXTURES / name, out)
    return out


def _edit_config(src: Path, **fields) -> None:
    doc = json.loads((src / hf_io.CONFIG).read_text())
    (src / hf_io.CONFIG).write_text(json.dumps({**doc, **fields}))


def _bad_inputs(tmp_path: Path):
    missing = _copy("gpt2", tmp_path / "missing")
    (missing / hf_io.WEIGHTS).unlink()
    mistral = _copy("gpt2", tmp_path / "type")
    _edit_config(mistral, model_type="mistral")
    shape = _copy("gpt2", tmp_path / "shape")
    _edit_config(shape, vocab_size=65)
    truncated = _copy("gpt2", tmp_path / "truncated")
    with open(truncated / hf_io.WEIGHTS, "r+b") as f:
        f.truncate(50_000)
    shard = _copy("llama-sharded", tmp_path / "shard")
    (shard / "model-00002-of-00003.safetensors").unlink()
    yarn = _copy("llama-kv1", tmp_path / "yarn")
    _edit_config(yarn, rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4})
    window = _copy("llama-kv1", tmp_path / "window")
    _edit_config(window, sliding_window=128)
    act = _copy("gpt2", tmp_path / "act")
    _edit_config(act, activation_function="relu")
    return [
        (missing, ["model.safetensors", "missing"]),
        (mistral, ["config.json", "model_type", "'mistral'", "gpt2, llama"]),
        (shape, ["model.safetensors", "transformer.wte.weight", "(64, 32)", "(65, 32)"]),
        (truncated, ["model.safetensors", "not a readable safetensors file"]),
        (shard, ["model.safetensors.index.json", "model-00002-of-00003.safetensors"]),
        (yarn, ["config.json", "rope_scaling", "'yarn'", "default, llama3"]),
        (window, ["config.json", "sliding_window", "128", "None"]),
        (act, ["config.json", "activation_function", "'relu'", "gelu_new"]),
    ]


def test_bad_checkpoints_fail_in_one_line_naming_the_file_and_key(tmp_path, capsys):
    for src, words in _bad_inputs(tmp_path):
        assert main(["import", str(src), "--out", str(tmp_path / "never")]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert all(w in err for w in words), (words, err)
    assert not (tmp_path / "never").exists()


def test_hub_name_offline_names_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    from zoo.train.hf import resolve_source

    with pytest.raises(ZooError, match="no-such-org/no-such-model.*HF_HUB_OFFLINE") as info:
        resolve_source("no-such-org/no-such-model@main")
    assert "\n" not in str(info.value)


def _lora_checkpoint(tmp_path: Path):
    """The llama-kv2 fixture with trained-looking adapters, saved as a zoo checkpoint."""
    import dataclasses

    from zoo.lora.adapter import LoraSpec
    from zoo.models.canonical import init_adapters
    from zoo.recipes import parse_recipe, to_dict
    from zoo.train import checkpoint
    from zoo.train.hf import _recipe_dict

    cfg, params, _ = fixture("llama-kv2")
    cfg = dataclasses.replace(
        cfg, lora=LoraSpec(4, 8.0, ("blocks.attn.q", "blocks.attn.v", "blocks.mlp.down"))
    )
    adapters = flat_by_path(init_adapters(cfg, 3))
    key = jax.random.key(4)
    adapters = {
        p: x + 0.1 * jax.random.normal(jax.random.fold_in(key, i), x.shape)
        for i, (p, x) in enumerate(adapters.items())
    }
    full = zoo.models.paths.nest_by_path({**flat_by_path(params), **adapters})
    meta = {
        "recipe": to_dict(parse_recipe(_recipe_dict(cfg, "nnx", "test"))),
        "model": checkpoint.model_meta(cfg, "nnx"),
        "tokenizer": None,
    }
    checkpoint.save(tmp_path / "run", 0, None, full, meta)
    return cfg, full


@pytest.mark.numerics
def test_lora_exports_merged_and_as_peft_adapter_files(tmp_path):
    """PEFT's merge (W + lora_alpha/r * B A, on PyTorch's [out, in] weights) of the adapter
    export onto the base export equals the merged export."""
    from zoo.lora.merge import merged_weights

    cfg, full = _lora_checkpoint(tmp_path)
    run = str(tmp_path / "run")
    assert main(["export", run, "--format", "hf", "--out", str(tmp_path / "merged")]) == 0
    assert main(["export", run, "--format", "hf", "--adapter", "--out", str(tmp_path / "adapter")]) == 0
    doc = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (doc["peft_type"], doc["r"], doc["lora_alpha"]) == ("LORA", 4, 8.0)
    assert sorted(doc["target_modules"]) == ["down_proj", "q_proj", "v_proj"]
    modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "adapter").iterdir()}
    assert len(set(modes.values())) == 1, modes  # the weights as readable as the config beside them
    adapter = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert len(adapter) == 2 * 3 * cfg.num_layers
    base = _stored(FIXTURES / "llama-kv2")
    merged = dict(base)
    for key, a in adapter.items():
        if ".lora_A." in key:
            module = key[len("base_model.model.") : -len(".lora_A.weight")]
            b = adapter[key.replace("lora_A", "lora_B")]
            assert a.shape[0] == b.shape[1] == 4
            merged[f"{module}.weight"] = base[f"{module}.weight"] + (8.0 / 4) * (b @ a)
    exported = load_file(str(tmp_path / "merged" / hf_io.WEIGHTS))
    assert set(exported) == set(merged)
    assert_close(exported, merged, n=4, what="merged export vs PEFT's merge")
    ours = hf_io.hf_tensors(cfg, flat_by_path(merged_weights(full, cfg.lora)))
    assert_bitwise_equal(exported, {k: np.asarray(v) for k, v in ours.items()})


def test_import_carries_the_tokenizer_and_fine_tune_recipes_take_its_model(tmp_path):
    from zoo.data.hf_tokenizer import HFTokenizer
    from zoo.recipes import load_recipe

    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    ck = zoo.load_checkpoint(tmp_path / "imp")
    assert isinstance(ck.tokenizer, HFTokenizer) and ck.tokenizer.vocab_size == ck.model_config.vocab_size
    from tokenizers import Tokenizer

    reference = Tokenizer.from_file(str(FIXTURES / "llama3-tied" / "tokenizer.json"))
    text = "the lazy zoo jumps"
    assert ck.tokenizer.encode(text).tolist() == reference.encode(text, add_special_tokens=False).ids
    assert ck.tokenizer.decode(ck.tokenizer.encode(text)) == text
    import argparse

    from zoo.commands.train import resolve_recipe

    for name in ("hf-lm-lora", "hf-lm-dp-lora"):  # built in; --init-from brings the import's model
        assert load_recipe(name).model_config != ck.model_config
        sets = ["model.attention=chunked", "model.attention_chunk=8"]
        args = argparse.Namespace(recipe=name, init_from=str(tmp_path / "imp"), set=sets, backend="eqx")
        recipe = resolve_recipe(args)
        want = dataclasses.replace(ck.model_config, attention="chunked", attention_chunk=8)
        assert recipe.model_config == want and recipe.model.backend == "eqx"
        assert recipe.model.init_from == str(tmp_path / "imp") and recipe.lora.enabled
        assert recipe.dp.enabled == (name == "hf-lm-dp-lora")


def test_init_from_hf_imports_once_and_reuses(tmp_path, monkeypatch):
    """``--init-from hf:SRC``: the import is made once under $ZOO_HF_CACHE and reused."""
    import argparse

    from zoo.commands.train import resolve_recipe

    monkeypatch.setenv("ZOO_HF_CACHE", str(tmp_path / "cache"))
    args = argparse.Namespace(recipe="python-docs-llama", init_from=f"hf:{FIXTURES / 'llama-kv1'}", set=None)
    first = resolve_recipe(args).model.init_from
    manifest = next(Path(first).rglob("zoo_manifest.json")).stat().st_mtime_ns
    assert resolve_recipe(args).model.init_from == first
    assert next(Path(first).rglob("zoo_manifest.json")).stat().st_mtime_ns == manifest
    assert_bitwise_equal(
        zoo.load_checkpoint(first).params, jax.tree_util.tree_map(np.asarray, fixture("llama-kv1")[1])
    )


def test_sample_speaks_the_imported_tokenizer(tmp_path, capsys):
    """``zoo sample`` on an import: the prompt through its tokenizer.json, greedy tokens equal to
    the argmax of ``zoo.apply_fn``'s logits, decoded with the same tokenizer."""
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    assert (
        main(
            [
                "sample",
                str(tmp_path / "imp"),
                "--prompt",
                "the quick",
                "--max-new-tokens",
                "3",
                "--temperature",
                "0",
                "--json",
            ]
        )
        == 0
    )
    sample = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["sample"]
    ck = zoo.load_checkpoint(tmp_path / "imp")
    ids = list(ck.tokenizer.encode("the quick"))
    prompt_len = len(ids)
    apply = jax.jit(zoo.apply_fn(ck.model_config, "nnx"))
    for _ in range(3):
        ids.append(int(np.argmax(apply(ck.params, jnp.asarray([ids], jnp.int32))[0, -1])))
    assert sample == ck.tokenizer.decode(ids[prompt_len:])


def test_data_vocabulary_hf_tokenizes_text_with_tokenizer_json(tmp_path):
    from tokenizers import Tokenizer

    from zoo.configs import DataConfig
    from zoo.train.task import load_task

    text = "the quick brown fox jumps over the lazy zoo\n" * 20
    (tmp_path / "t.txt").write_text(text)
    config = DataConfig(
        dataset=f"text:{tmp_path / 't.txt'}", vocabulary=f"hf:{FIXTURES / 'llama3-tied'}", seq_len=8
    )
    task = load_task(config, task="lm", seed=0)
    ids = np.concatenate([np.asarray(task.data.x_train).ravel(), np.asarray(task.data.x_eval).ravel()])
    reference = Tokenizer.from_file(str(FIXTURES / "llama3-tied" / "tokenizer.json"))
    assert ids.tolist() == reference.encode(text, add_special_tokens=False).ids
    with pytest.raises(ZooError, match="bytes, char:FILE, hf:SRC, ids:N"):
        DataConfig(vocabulary="words")
