"""Issue 39, `zoo sample`: its generation flags on an imported checkpoint (greedy, top-k,
top-p, several samples in one batch, the streamed text equal to the JSON), its EOS, and the
arguments it refuses in one line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import zoo
from tests.e2e.clikit import refused
from tests.tiny import TINY_LM
from zoo.cli import main
from zoo.commands.sample import prompt_ids
from zoo.generate.stops import checkpoint_eos

FIXTURE = Path(__file__).parents[2] / "fixtures" / "hf" / "llama3-tied"  # it has a tokenizer.json
PROMPT = "the quick"


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "imp"
    assert main(["import", str(FIXTURE), "--out", str(out)]) == 0
    return out


def _json(capsys, *argv) -> dict:
    capsys.readouterr()
    assert main(["sample", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_greedy_streamed_text_equals_the_json_and_top_k_1(imported, capsys):
    greedy = _json(capsys, imported, "--prompt", PROMPT, "--max-new-tokens", 20, "--temperature", 0)
    assert greedy["samples"] == [greedy["sample"]] and greedy["sample"]
    assert (
        main(["sample", str(imported), "--prompt", PROMPT, "--max-new-tokens", "20", "--temperature", "0"])
        == 0
    )
    assert capsys.readouterr() == (PROMPT + greedy["sample"] + "\n", "")
    top1 = _json(capsys, imported, "--prompt", PROMPT, "--max-new-tokens", 20, "--top-k", 1, "--seed", 5)
    assert top1["sample"] == greedy["sample"]


def test_num_samples_is_one_batch_of_different_draws_and_a_seed_repeats_them(imported, capsys):
    flags = (imported, "--prompt", PROMPT, "--max-new-tokens", 12, "--num-samples", 4, "--top-p", 0.95)
    first = _json(capsys, *flags, "--seed", 1)
    assert len(first["samples"]) == 4 and len(set(first["samples"])) > 1
    assert _json(capsys, *flags, "--seed", 1) == first
    capsys.readouterr()
    assert main(["sample", *map(str, flags), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert out.count("--- sample ") == 4 and all(PROMPT + s in out for s in first["samples"])


def test_eos_comes_from_the_tokenizer_and_the_imported_config(imported):
    ckpt = zoo.load_checkpoint(imported)
    config_eos = json.loads((FIXTURE / "config.json").read_text())["eos_token_id"]
    tokenizer_eos = ckpt.tokenizer._tokenizer.token_to_id("<eos>")
    assert set(checkpoint_eos(ckpt)) == {config_eos, tokenizer_eos}


@pytest.mark.parametrize(
    "flags,fragments",
    [
        (["--max-new-tokens", "0"], ["--max-new-tokens must be a positive number of tokens"]),
        (["--top-k", "-1"], ["--top-k must be a whole number >= 0"]),
        (["--top-p", "0"], ["--top-p must be a number in (0, 1]"]),
        (["--top-p", "1.5"], ["--top-p", "got 1.5"]),
        (["--top-p", "nan"], ["--top-p"]),
        (["--num-samples", "0"], ["--num-samples must be a whole number in [1, 256]"]),
        (["--num-samples", "1000"], ["--num-samples", "one batch"]),
        (["--temperature", "-1"], ["--temperature must be a finite number >= 0"]),
    ],
)
def test_bad_generation_flags_are_refused_before_the_checkpoint_is_read(tmp_path, capsys, flags, fragments):
    refused(capsys, ["sample", str(tmp_path), "--prompt", "x", *flags], *fragments)


def test_new_tokens_that_leave_no_room_for_the_prompt_are_refused(imported, capsys):
    """The hint keeps the whole prompt: 1024 positions less the prompt's tokens."""
    n = len(zoo.load_checkpoint(imported).tokenizer.encode(PROMPT))
    assert n > 1
    refused(
        capsys,
        ["sample", str(imported), "--prompt", PROMPT, "--max-new-tokens", "1024"],
        "--max-new-tokens 1024 leaves no room for the prompt",
        "max_position_embeddings",
        f"at most {1024 - n} new tokens to keep the whole prompt ({n} tokens)",
    )


@pytest.fixture(scope="module")
def short(tmp_path_factory):
    """The fixture imported with 128 positions, as the python-docs-* recipes have (fewer than
    the default's 200 new tokens)."""
    source = tmp_path_factory.mktemp("short") / "hf"
    shutil.copytree(FIXTURE, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 128}))
    out = source.parent / "imp"
    assert main(["import", str(source), "--out", str(out)]) == 0
    return out


def test_the_default_new_tokens_fit_a_model_of_128_positions(short, capsys):
    assert "sample" in _json(capsys, short, "--prompt", PROMPT, "--temperature", 0)
    ckpt = zoo.load_checkpoint(short)
    ids, new = prompt_ids(ckpt, PROMPT, None)  # what the default asks for: the whole prompt kept
    assert len(ids) == len(ckpt.tokenizer.encode(PROMPT)) and len(ids) + new == 128


def test_the_old_length_alias_is_gone(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["sample", str(tmp_path), "--prompt", "x", "--length", "5"])
    assert exit_.value.code == 2 and "unrecognized arguments: --length 5" in capsys.readouterr().err


@pytest.mark.parametrize("seed", ["-1", "4294967296"])
def test_a_seed_outside_32_bits_is_refused_in_one_line(tmp_path, capsys, seed):
    refused(capsys, ["sample", str(tmp_path), "--prompt", "x", "--seed", seed], "--seed", "4294967295", seed)


def test_sample_says_when_the_prompt_is_cut_and_escapes_control_bytes(capsys, tmp_path):
    """Issue 41, item 25: a prompt longer than the context was cut without a word; control bytes raw."""
    from zoo.commands.sample import _printable

    assert main(["train", "python-docs-lm", "--out", str(tmp_path / "lm"), *TINY_LM]) == 0
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
