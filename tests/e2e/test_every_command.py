"""Every CLI verb on every registered kind, through ``zoo.cli.main`` as a user types it.

The cases come from the registry: each kind's smallest preset is trained a few steps by a
shipped recipe of its task (a plain recipe: no DP, no LoRA, no start point, its preset swapped
for the smallest; the smallest preset of a task some plain recipe trains), and each verb that applies to the task runs on it: ``train``, ``eval``,
``params``, ``sample`` (language models), ``residuals`` and ``bench finetune / remat / dp``.
A new kind joins with no test code; a verb that asks a kind by name fails here.

One trained run per kind, shared by the verbs that read it (a module-scoped fixture); the
tests of a kind share an ``xdist_group``, so the run is built once per worker. Then the
`zoo sample` cases of issue 33 on the language-model runs: exit code, one line, no traceback.
"""

from __future__ import annotations

import json
import math
import signal
from dataclasses import dataclass

import numpy as np
import pytest

from zoo import recipes
from zoo.cli import main
from zoo.models import registry
from zoo.models.canonical import canonical_shapes

# A kind's verbs compile some of its run's programs again (zoo eval the run's eval step): the
# run's persistent compilation cache (tests/conftest.py) reads them back.
STEPS = 2
BATCH = 4
SEQ = 16  # token positions of a language model's training examples and benches


def _param_count(cfg) -> int:
    return sum(math.prod(shape) for shape in canonical_shapes(cfg).values())


def _plain(recipe) -> bool:
    """Trains from scratch, without DP or adapters, on data zoo has (not a token store that
    `zoo tokenize` must write first, as the accelerator recipes gpt2-124m-tokens and
    llama-1b-tokens name)."""
    needs_a_store = recipe.data.dataset.startswith("tokens:")
    return not (recipe.dp.enabled or recipe.lora.enabled or recipe.model.init_from or needs_a_store)


@dataclass(frozen=True)
class Case:
    kind: str
    task: str
    preset: str  # the kind's smallest preset of a task some plain recipe trains it on
    recipe: str | None  # the first such recipe (None: there is none, and the kind's tests fail)


def _cases() -> list[Case]:
    plain = [r for r in recipes.list_recipes() if _plain(r)]
    cases = []
    for kind in registry.kinds():
        recipe_of = {}  # task -> the first plain recipe that trains this kind on it
        for r in plain:
            if registry.kind_of(r.model_config) is kind:
                recipe_of.setdefault(r.model_config.task, r.name)
        names = [n for n, cfg in kind.presets.items() if cfg.task in recipe_of] or list(kind.presets)
        preset = min(names, key=lambda n: (_param_count(kind.presets[n]), n))
        task = kind.presets[preset].task
        cases.append(Case(kind.name, task, preset, recipe_of.get(task)))
    return cases


CASES = _cases()
LM_CASES = [c for c in CASES if c.task == "lm"]


def _params(cases):
    return [
        pytest.param(c, id=c.kind, marks=pytest.mark.xdist_group(f"every-command-{c.kind}")) for c in cases
    ]


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _run(*argv) -> int:
    return main([str(a) for a in argv])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """``trained(case) -> run directory``: the case's run, trained on first use (``zoo train``
    with the kind's smallest preset, a few steps, tiny batches) and shared by every verb."""
    runs = {}

    def get(case: Case):
        if case.recipe is None:
            pytest.fail(f"no recipe in zoo/recipes/ trains a {case.kind} preset without DP or LoRA; add one")
        if case not in runs:
            out = tmp_path_factory.mktemp(case.kind) / "run"
            sets = [f"model.preset={case.preset}", "train.eval_batches=1", f"train.eval_every={STEPS}"]
            sets += [f"train.checkpoint_every={STEPS}"] + (
                [f"data.seq_len={SEQ}"] if case.task == "lm" else []
            )
            argv = ["train", case.recipe, "--steps", STEPS, "--batch-size", BATCH, "--out", out]
            runs[case] = (
                out,
                _run(*argv, *(a for s in sets for a in ("--set", s)), "--json", "--no-progress"),
            )
        out, code = runs[case]
        assert code == 0, f"zoo train {case.recipe} with {case.preset} failed"
        return out

    return get


def test_models_lists_every_preset_with_its_task(capsys):
    assert _run("models", "--json") == 0
    rows = {row["name"]: row for row in _last_json(capsys)}
    for kind in registry.kinds():
        for name, cfg in kind.presets.items():
            assert (rows[name]["kind"], rows[name]["task"]) == (kind.name, cfg.task)
            assert rows[name]["params"] == _param_count(cfg)


@pytest.mark.parametrize("case", _params(CASES))
def test_train(case, trained):
    from zoo.train import checkpoint

    ckpt = checkpoint.load_checkpoint(trained(case))
    assert ckpt.step == STEPS and ckpt.recipe.model.preset == case.preset
    assert registry.kind_of(ckpt.model_config).name == case.kind and ckpt.model_config.task == case.task


@pytest.mark.parametrize("case", _params(CASES))
def test_eval(case, trained, capsys):
    out = trained(case)
    capsys.readouterr()
    assert _run("eval", out, "--json") == 0
    metrics = _last_json(capsys)
    assert metrics["step"] == STEPS and math.isfinite(metrics["eval_loss"])
    assert ("eval_bits_per_char" in metrics) == (case.task == "lm")


@pytest.mark.parametrize("case", _params(CASES))
def test_params(case, trained, capsys):
    from zoo.train import checkpoint

    out = trained(case)
    capsys.readouterr()
    assert _run("params", out, "--json") == 0
    table = _last_json(capsys)
    total = _param_count(checkpoint.load_checkpoint(out).model_config)
    assert sum(row["count"] for row in table["rows"]) == table["trainable"] + table["frozen"] == total


def _seq(case: Case) -> list:
    return ["--seq", SEQ] if case.task == "lm" else []


@pytest.mark.parametrize("case", _params(CASES))
def test_residuals(case, capsys):
    assert _run("residuals", case.preset, "--remat", "full", "--batch", 2, *_seq(case), "--json") == 0
    report = _last_json(capsys)
    assert report["model"] == case.preset and report["total_device_bytes"] > 0


@pytest.mark.parametrize("case", _params(CASES))
def test_bench_finetune(case, capsys):
    argv = ["bench", "finetune", case.preset, "--batch", 2, *_seq(case), "--steps", 1, "--repeats", 1]
    assert _run(*argv, "--json") == 0
    result = _last_json(capsys)
    full, frozen = result["rows"]
    assert (full["run"], frozen["run"]) == ("full", "frozen")
    assert result["freeze"] == list(registry.get_config(case.preset).frozen_prefix())
    assert 0 < frozen["trainable_params"] < full["trainable_params"]


@pytest.mark.parametrize("case", _params(CASES))
def test_bench_remat(case, capsys):
    argv = ["bench", "remat", case.preset, "--policies", "none", "--batch", 2, *_seq(case), "--repeats", 1]
    assert _run(*argv, "--json", "--quiet") == 0
    assert [row["policy"] for row in _last_json(capsys)["rows"]] == ["none"]


@pytest.mark.parametrize("case", _params(CASES))
def test_bench_dp(case, capsys):
    argv = ["bench", "dp", case.preset, "--batch", BATCH, *_seq(case), "--methods", "ghost", "--no-sweep"]
    assert _run(*argv, "--rounds", 1, "--steps", 1, "--json", "--quiet") == 0
    assert [row["method"] for row in _last_json(capsys)["rows"]] == ["non-private", "ghost"]


# ----------------------------------------------------------------------------- zoo sample


def _vocabulary(out) -> str:
    from zoo.train import checkpoint

    tokenizer = checkpoint.load_checkpoint(out).tokenizer
    return tokenizer.decode(np.arange(1, tokenizer.vocab_size))


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("case", _params(LM_CASES))
def test_sample(case, trained, capsys):
    """Greedy: ``--json`` and the plain text agree. A prompt wider than the 80 columns rich
    wraps a pipe at comes back unbroken: the sample is printed as sampled."""
    out = trained(case)
    vocabulary = _vocabulary(out)
    prompt = (vocabulary[::-1] * 3)[:150]  # every character in the vocabulary, spaces included
    capsys.readouterr()
    assert _run("sample", out, "--prompt", prompt, "--max-new-tokens", 5, "--temperature", 0, "--json") == 0
    result = _last_json(capsys)
    assert result["prompt"] == prompt and len(result["sample"]) == 5
    assert _run("sample", out, "--prompt", prompt, "--max-new-tokens", 5, "--temperature", 0) == 0
    assert capsys.readouterr() == (prompt + result["sample"] + "\n", "")


@pytest.mark.parametrize("case", _params(LM_CASES))
def test_sample_warns_about_characters_outside_the_vocabulary(case, trained, capsys):
    out = trained(case)
    vocabulary = _vocabulary(out)
    strangers = [c for c in ("\u2603", "\U0001f600", "\u00e9", "\x07") if c not in vocabulary][:2]
    assert len(strangers) == 2
    prompt = vocabulary[:3] + strangers[0] + vocabulary[:2] + strangers[1] + strangers[0]
    capsys.readouterr()
    assert _run("sample", out, "--prompt", prompt, "--max-new-tokens", 2, "--json") == 0
    std = capsys.readouterr()
    line = _one_line(std.err)
    assert line.startswith("warning:") and "2 character(s) outside" in line
    assert all(repr(c) in line for c in strangers)
    assert json.loads(std.out.splitlines()[-1])["prompt"] == prompt  # echoed as given
    # A prompt inside the vocabulary gives no warning: test_sample checks that stderr is empty.


def test_sample_refuses_a_length_over_its_limit_at_once(tmp_path, capsys):
    """``--length 99999999999`` ran with no output until killed; now one line, before any
    checkpoint is read, well inside a time bound (SIGALRM fails the test if it is passed)."""
    from zoo.commands.sample import MAX_NEW_TOKENS

    def too_slow(signum, frame):
        raise TimeoutError("zoo sample --length 99999999999 did not answer within 30 s")

    previous = signal.signal(signal.SIGALRM, too_slow)
    signal.alarm(30)
    try:
        code = _run("sample", tmp_path, "--prompt", "def ", "--max-new-tokens", 99999999999)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert f"limit of {MAX_NEW_TOKENS:,} tokens" in _one_line(err)
