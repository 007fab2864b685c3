"""``zoo import`` of a Hugging Face folder, issue 41's cases ("item N" is the issue's): what it
reads, refuses and prints, and the import before any training (no tokenizer of its own, a
changed ``hf:LOCAL_DIR``, a folder given to --init-from without ``hf:``)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from tests.e2e.clikit import refused
from tests.tiny import HF_FIXTURES as FIXTURES
from tests.tiny import TINY
from zoo.cli import main

pytestmark = pytest.mark.xdist_group("hf")


def test_import_out_empty_is_refused_not_the_current_directory(tmp_path, capsys, monkeypatch):
    """Item 18: ``--out ""`` wrote ``checkpoints/`` into the current directory."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["import", str(FIXTURES / "gpt2"), "--out", ""], "--out is empty")
    assert list(tmp_path.iterdir()) == []


def test_a_folder_with_only_pytorch_model_bin_names_it(capsys, tmp_path):
    """Item 21: "model.safetensors: missing" and nothing about the .bin."""
    import shutil

    (tmp_path / "src").mkdir()
    shutil.copy(FIXTURES / "gpt2" / "config.json", tmp_path / "src" / "config.json")
    (tmp_path / "src" / "pytorch_model.bin").write_bytes(b"PK\x03\x04 not read")
    argv = ["import", str(tmp_path / "src"), "--out", str(tmp_path / "imp")]
    refused(capsys, argv, "model.safetensors: missing", "pytorch_model.bin", "safe_serialization=True")


@pytest.mark.parametrize("same", [True, False])
def test_a_tied_llama_that_also_stores_lm_head(capsys, tmp_path, same):
    """Item 22: a tied Llama whose file also holds ``lm_head.weight`` (equal to the embedding)
    was refused; transformers loads it. A different one is refused, naming the tensor."""
    import shutil

    from safetensors.numpy import load_file, save_file

    import zoo

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama3-tied", src)
    tensors = load_file(str(src / "model.safetensors"))
    embed = tensors["model.embed_tokens.weight"]
    tensors["lm_head.weight"] = embed.copy() if same else embed + 1
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    argv = ["import", str(src), "--out", str(tmp_path / "imp")]
    if not same:
        refused(capsys, argv, "lm_head.weight differs from the embedding", "tie_word_embeddings: true")
        return
    assert main(argv) == 0
    params = zoo.load_checkpoint(tmp_path / "imp").params
    np.testing.assert_array_equal(np.asarray(params["embed"]["w"]), embed)


@pytest.mark.parametrize("missing", ["factor", "original_max_position_embeddings", "vocab_size"])
def test_an_hf_config_missing_a_field_is_one_line(tmp_path, capsys, missing):
    """Item 9: a ``llama3`` rope config without one of its fields (or the config without
    ``vocab_size``) ended in ``KeyError``."""
    import json
    import shutil

    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama3-tied", src)
    fields = json.loads((src / "config.json").read_text())
    rope = fields.get("rope_parameters") or fields.get("rope_scaling")
    if missing in rope:
        del rope[missing]
        words = ["rope_scaling of type 'llama3' lacks", missing]
    else:
        del fields[missing]
        words = [f"the field {missing!r} is missing"]
    (src / "config.json").write_text(json.dumps(fields))
    refused(capsys, ["import", str(src), "--out", str(tmp_path / "imp")], "config.json", *words)


def test_supported_lists_read_one_way(capsys, tmp_path):
    """Item 25: "supported: [False]" beside "supported: gpt2, llama"."""
    import json
    import shutil

    shutil.copytree(FIXTURES / "llama-kv1", tmp_path / "src")
    fields = json.loads((tmp_path / "src" / "config.json").read_text())
    (tmp_path / "src" / "config.json").write_text(json.dumps({**fields, "attention_bias": True}))
    line = refused(
        capsys, ["import", str(tmp_path / "src"), "--out", str(tmp_path / "i")], "supported: False"
    )
    assert "[" not in line.split("supported:")[1]


def test_import_prints_its_fine_tune_command_on_one_line(capsys, tmp_path):
    """Item 25: the suggested command broke inside the 80-column table when piped."""
    out = tmp_path / "a-rather-long-directory-name" / "for-the-import-of-a-checkpoint"
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"fine-tune: zoo train hf-lm-lora --init-from {out} --dataset text:PATH" in lines


@pytest.fixture
def untokenized(tmp_path, capsys):
    """``zoo import`` of a folder with config.json and model.safetensors only, and a text."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURES / "gpt2" / name, src / name)
    assert main(["import", str(src), "--out", str(tmp_path / "imp"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    (tmp_path / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    return tmp_path, result


def test_import_says_it_found_no_tokenizer(untokenized):
    _, result = untokenized
    assert result["tokenizer"].startswith("none")
    assert "data.vocabulary=hf:" in result["finetune"]


@pytest.mark.parametrize("recipe", ["hf-lm-dp-lora", "hf-lm-lora"])
def test_an_import_without_a_tokenizer_needs_a_declared_vocabulary(capsys, untokenized, recipe):
    """Item 1 (DP: the vocabulary would be read off the private text) and item 2 (the text's
    characters would become the first rows of the pretrained embedding)."""
    root, _ = untokenized
    argv = ["train", recipe, "--init-from", str(root / "imp"), "--dataset", f"text:{root / 't.txt'}"]
    refused(capsys, [*argv, "--out", str(root / "run"), *TINY], "carries no tokenizer", "data.vocabulary")
    assert not (root / "run").exists()


def test_hf_local_dir_imports_again_when_its_weights_change(tmp_path, monkeypatch, capsys):
    """Item 3: the cache is keyed on the folder's files, and a reuse says so."""
    import zoo
    from zoo.train.hf import import_cached

    monkeypatch.setenv("ZOO_HF_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "llama-kv1", src)
    first = import_cached(str(src))
    with pytest.warns(UserWarning, match="reusing its import"):
        assert import_cached(str(src)) == first
    shutil.copy(FIXTURES / "llama-kv2" / "model.safetensors", src / "model.safetensors")
    shutil.copy(FIXTURES / "llama-kv2" / "config.json", src / "config.json")
    second = import_cached(str(src))
    assert second != first
    assert zoo.load_checkpoint(second).model_config.num_kv_heads == 2
    assert zoo.load_checkpoint(first).model_config.num_kv_heads == 1


def test_init_from_an_hf_folder_without_the_prefix_names_hf_and_import(capsys, tmp_path):
    """Item 15: ``--init-from DIR`` of a Hugging Face folder, and ``zoo import hf:ORG/NAME``."""
    src = str(FIXTURES / "llama-kv1")
    argv = ["train", "python-docs-llama", "--init-from", src, "--out", str(tmp_path / "r"), "--steps=1"]
    refused(capsys, argv, "it is a Hugging Face folder", f"hf:{src}", f"zoo import {src} --out DIR")
    line = refused(
        capsys, ["import", "hf:ORG/NAME", "--out", str(tmp_path / "i")], "zoo import ORG/NAME --out DIR"
    )
    assert "HFValidationError" not in line
