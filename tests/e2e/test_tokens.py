"""Training on token data read by index: ``zoo tokenize`` then ``tokens:DIR``, a raw ``bin:``,
resume onto the same windows, a store changed under a run, and DP over windows."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import dp_accounting
import numpy as np
import pytest

from tests.numerics import assert_bitwise_equal
from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.data import load_dataset
from zoo.data.errors import DatasetError
from zoo.data.public import check_public_domain
from zoo.data.tokenizer import CharTokenizer
from zoo.data.tokens import open_store
from zoo.errors import ZooError
from zoo.train.loop import train_recipe
from zoo.train.run import build_run, local_batch, train_batch
from zoo.train.task import fit_model_to_task, load_task

# The module's store and finished run are built once; runs that repeat a program read it back.
pytestmark = [pytest.mark.xdist_group("tokens")]

SEQ = 16
TINY = {
    "model.num_layers": 1,
    "model.d_model": 32,
    "model.d_ff": 64,
    "model.max_len": SEQ,
    "data.seq_len": SEQ,
    "train.steps": 4,
    "train.batch_size": 8,
    "train.log_every": 1,
    "train.eval_every": 4,
    "train.eval_batches": 2,
    "train.checkpoint_every": 2,
}


def write_corpus(root: Path, documents: int = 24) -> list[Path]:
    root.mkdir(parents=True)
    paths = []
    for i in range(documents):
        path = root / f"{i:03d}.txt"
        path.write_text("".join(f"line {j} of document {i}: the lazy zoo — ça va\n" for j in range(20)))
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tokens")
    write_corpus(root / "corpus")
    out = root / "store"
    code = main(
        ["tokenize", f"text:{root / 'corpus'}", "--out", str(out), "--vocabulary", "bytes", "--no-progress"]
    )
    assert code == 0
    return out


def recipe(name="python-docs-lm", **values):
    return settings.with_values(recipes.load_recipe(name), {**TINY, **values})


def losses(run_dir: Path) -> np.ndarray:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return np.asarray([line["loss"] for line in lines if "loss" in line])


def test_zoo_tokenize_then_zoo_train_on_the_store(store, tmp_path, capsys):
    meta = json.loads((store / "store.json").read_text())
    assert meta["vocabulary"] == "bytes" and meta["splits"]["eval"]["documents"] == 3  # every 10th of 24
    argv = ["train", "python-docs-lm", "--dataset", f"tokens:{store}", "--out", str(tmp_path / "r")]
    sets = [f"--set={k}={v}" for k, v in TINY.items()]
    assert main([*argv, *sets, "--json", "--no-progress"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["dataset"] == f"tokens:{store}" and summary["steps"] == 4 and summary["compile_count"] == 1
    assert math.isfinite(summary["eval_bits_per_char"])


def test_a_raw_bin_of_the_in_memory_ids_trains_bitwise_like_the_in_memory_run(tmp_path, capsys):
    paths = write_corpus(tmp_path / "corpus", documents=6)
    text = "text:" + ",".join(map(str, paths))
    ds = load_dataset(text, task="lm", tokenizer=CharTokenizer.utf8_bytes(), eval_fraction=0.2)
    np.concatenate([ds.x_train, ds.x_eval]).astype(np.uint16).tofile(tmp_path / "all.bin")
    both = {"data.vocabulary": "bytes", "data.eval_fraction": 0.2}
    memory = train_recipe(recipe(**both, **{"data.dataset": text}), tmp_path / "mem", show_progress=False)
    said = capsys.readouterr().err
    assert said.count("is read and tokenized in memory") == 1  # the one line text: says, once it trains
    disk = train_recipe(
        recipe(**both, **{"data.dataset": f"bin:{tmp_path / 'all.bin'}"}),
        tmp_path / "bin",
        show_progress=False,
    )
    # The same program on the same batches: the windows read from disk are the ones in memory.
    assert "tokenized in memory" not in capsys.readouterr().err
    assert_bitwise_equal(losses(tmp_path / "bin"), losses(tmp_path / "mem"))
    assert disk["eval_loss"] == memory["eval_loss"]


@pytest.fixture(scope="module")
def finished(store, tmp_path_factory):
    out = tmp_path_factory.mktemp("finished") / "run"
    train_recipe(recipe(**{"data.dataset": f"tokens:{store}"}), out, show_progress=False)
    return out


def test_resume_lands_on_the_same_windows(store, finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    shutil.rmtree(out / "checkpoints" / "4")  # killed after step 2
    lines = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join(lines[:2]) + "\n")
    train_recipe(recipe(**{"data.dataset": f"tokens:{store}"}), out, resume=True, show_progress=False)
    assert_bitwise_equal(losses(out), losses(finished))


def test_a_store_whose_checksum_changed_is_refused_on_resume(store, tmp_path):
    copy, out = tmp_path / "store", tmp_path / "run"
    shutil.copytree(store, copy)
    train_recipe(recipe(**{"data.dataset": f"tokens:{copy}", "train.steps": 2}), out, show_progress=False)
    longer = recipe(**{"data.dataset": f"tokens:{copy}"})
    data = bytearray((copy / "train.bin").read_bytes())
    data[100] ^= 1  # one id changed in place, same size
    (copy / "train.bin").write_bytes(bytes(data))
    with pytest.raises(ZooError, match=r"other data than its checkpoints saw: .*train.bin: its sha256 is"):
        train_recipe(longer, out, resume=True, show_progress=False)
    shutil.rmtree(copy)  # written again from other text: its recorded checksums differ
    write_corpus(tmp_path / "other", documents=12)
    main(
        [
            "tokenize",
            f"text:{tmp_path / 'other'}",
            "--out",
            str(copy),
            "--vocabulary",
            "bytes",
            "--no-progress",
        ]
    )
    with pytest.raises(ZooError, match=r"the training data differ \(sha256 \w+ -> \w+\)"):
        train_recipe(longer, out, resume=True, show_progress=False)


DP = {"dp.expected_batch_size": 64, "train.steps": 3, "dp.noise_seed": 0, "model.max_len": SEQ}


def test_dp_samples_windows_and_the_accountant_counts_them(store):
    run = build_run(recipe("python-docs-lm-dp", **DP, **{"data.dataset": f"tokens:{store}"}))
    tokens = run.task.data.x_train
    windows = (tokens.shape[0] - 1) // SEQ
    assert run.task.num_train == windows and run.dp.sampler.num_examples == windows
    q = 64 / windows
    assert run.dp.sampler.sampling_prob == pytest.approx(q, rel=1e-12)
    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(run.dp.noise_multiplier))
    accountant.compose(dp_accounting.SelfComposedDpEvent(event, 3))
    assert run.dp.epsilon_at(3) == pytest.approx(accountant.get_epsilon(run.dp.delta), rel=1e-9)
    seen = set()
    for step in range(3 * windows // 64):  # each window is drawn about 3 times
        indices, mask, _ = run.dp.sampler.batch_indices(step)
        batch = train_batch(run, step)
        real = indices[mask > 0]
        seen.update(real.tolist())
        for i, x, y in zip(real[:4], batch["x"], batch["y"], strict=False):  # window i: from i * seq_len
            assert x.tolist() == tokens[i * SEQ : i * SEQ + SEQ].tolist()
            assert y.tolist() == tokens[i * SEQ + 1 : i * SEQ + SEQ + 1].tolist()
    assert len(seen) > 0.9 * windows and max(seen) >= windows - 64  # the draws reach the last windows


def test_the_public_vocabulary_rule_holds_with_stores(store, tmp_path):
    plain = {
        "data.dataset": f"tokens:{store}",
        "dp.enabled": True,
        "dp.epsilon": 8.0,
        **DP,
    }  # no data.vocabulary
    run = build_run(recipe(**plain))
    assert run.recipe.data.vocabulary is None and run.task.data.store.vocabulary == "bytes"
    check_public_domain(run.recipe.data, "lm")  # as build_run does: read off the store's store.json
    text = dataclasses.replace(run.recipe.data, dataset="python-docs")
    with pytest.raises(ZooError, match="the vocabulary would be every character"):
        check_public_domain(text, "lm")  # the same run on text would be refused
    np.arange(500, dtype=np.uint16).tofile(tmp_path / "ids.bin")
    raw = {**plain, "data.dataset": f"bin:{tmp_path / 'ids.bin'}"}
    with pytest.raises(ZooError, match="the vocabulary would be every character"):
        build_run(recipe(**raw))  # under DP refused before the data loads
    with pytest.raises(DatasetError, match="without their vocabulary; declare it with data.vocabulary"):
        build_run(recipe(**{**raw, "dp.enabled": False}))
    (tmp_path / "chars.txt").write_text("abc")
    other = {"data.dataset": f"tokens:{store}", "data.vocabulary": f"char:{tmp_path / 'chars.txt'}"}
    with pytest.raises(DatasetError, match="written with the vocabulary 'bytes', which gives other ids"):
        build_run(recipe("python-docs-lm-dp", **DP, **other))


LM_RECIPES = [r.name for r in recipes.list_recipes() if r.model_config.task == "lm"]


@pytest.mark.parametrize("name", LM_RECIPES)
def test_every_lm_recipe_reads_a_store(store, name):
    """The data side of every shipped LM recipe (its [data] section, its model's context and
    vocabulary fit) on a store; the runs themselves are the kinds' (tests/e2e/test_every_command.py)."""
    shipped = recipes.load_recipe(name)
    data = dataclasses.replace(shipped.data, dataset=f"tokens:{store}")
    task = load_task(data, task="lm", seed=0, max_len=shipped.model_config.max_len)
    cfg = fit_model_to_task(shipped.model_config, task, shipped.model.preset, {})
    batch = task.train_batch(0, 4, seed=0)
    assert batch["x"].shape == (4, task.seq_len) and batch["x"].dtype == np.int32
    assert cfg.vocab_size == 257 and task.num_train == (task.data.num_train - 1) // task.seq_len


@pytest.mark.parametrize("dp", [False, True])
def test_a_process_share_of_a_batch_is_those_rows_of_the_whole(store, dp):
    name = "python-docs-lm-dp" if dp else "python-docs-lm"
    run = build_run(recipe(name, **DP, **{"data.dataset": f"tokens:{store}"}), choose_remat=False)
    for step in range(3):
        whole, count = local_batch(run, step, slice(None))
        part, same = local_batch(run, step, slice(8, 24))
        assert count == same == int(whole["mask"].sum()) and set(part) == set(whole)
        for key in whole:
            assert part[key].tolist() == whole[key][8:24].tolist(), key


def test_ids_past_the_vocabulary_stop_a_plain_run_and_follow_the_declared_rule_under_dp(
    store, tmp_path, capsys
):
    """train.bin changed to hold ids past the vocabulary, same size, store.json untouched: a
    plain run is refused in one line naming the file; a DP run reads them as 0 in every window
    and says nothing, so its exit status and printed lines are those of the clean store."""
    from tests.e2e.clikit import refused

    changed = tmp_path / "changed"
    shutil.copytree(store, changed)
    ids = np.fromfile(changed / "train.bin", np.uint16)
    ids[::5] = 300  # past the 257 ids of bytes, in every window
    ids.tofile(changed / "train.bin")
    one = {**TINY, "train.steps": 1, "train.eval_every": 1, "optim.warmup_steps": 0}
    sets = [f"--set={k}={v}" for k, v in one.items()]
    argv = ["train", "python-docs-lm", "--dataset", f"tokens:{changed}", "--no-progress", *sets]
    refused(
        capsys, [*argv, "--out", str(tmp_path / "plain")], "train.bin: id 300 at token", "past the vocabulary"
    )
    said = {}
    for name, data in (("clean", store), ("changed", changed)):
        dp = ["train", "python-docs-lm-dp", "--dataset", f"tokens:{data}", "--no-progress", *sets]
        dp += [f"--set={k}={v}" for k, v in DP.items() if k != "train.steps"]
        assert main([*dp, "--out", str(tmp_path / name)]) == 0
        said[name] = capsys.readouterr().err.replace(str(data), "DATA").replace(str(tmp_path / name), "OUT")
    assert said["changed"].splitlines()[0] == said["clean"].splitlines()[0]
    assert "past the vocabulary" not in said["changed"] and "<unk>" not in said["changed"]


def test_a_dp_run_names_its_privacy_unit_and_their_number(store, tmp_path, capsys):
    """summary.json and the printed table say what DP protects: a seq_len-token window, how
    many the train split holds (the sampler's N), and where group privacy is explained."""
    sets = [f"--set={k}={v}" for k, v in {**TINY, **DP, "train.steps": 1, "optim.warmup_steps": 0}.items()]
    argv = ["train", "python-docs-lm-dp", "--dataset", f"tokens:{store}", "--no-progress", *sets]
    assert main([*argv, "--out", str(tmp_path / "table")]) == 0
    table = capsys.readouterr().out
    assert main([*argv, "--out", str(tmp_path / "json"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    windows = (open_store(store).train.shape[0] - 1) // SEQ
    assert summary["privacy_unit"] == f"window of {SEQ} tokens" and summary["privacy_units"] == windows
    assert summary["privacy_units"] * summary["sampling_prob"] == pytest.approx(DP["dp.expected_batch_size"])
    assert "docs/dp.md#what-is-guaranteed" in summary["group_privacy"]
    for key in ("privacy_unit", f"window of {SEQ} tokens", "privacy_units", "group_privacy"):
        assert key in table, key
