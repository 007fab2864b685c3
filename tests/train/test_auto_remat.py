"""``--remat auto --memory-budget``: the fastest policy whose compiled step fits, cached."""

import json

import pytest

from zoo import recipes
from zoo.commands import settings
from zoo.errors import ZooError
from zoo.remat import choose_under_budget, footprint, nothing_fits, parse_bytes
from zoo.train import auto_remat
from zoo.train.loop import train_recipe
from zoo.train.run import build_run, train_batch


def test_parse_bytes():
    assert parse_bytes("256MiB") == 256 * 2**20
    assert parse_bytes("1.5GiB") == 3 * 2**29
    assert parse_bytes("300MB") == 300 * 10**6
    assert parse_bytes("4096") == parse_bytes(4096) == 4096
    for bad in ("lots", "12 parsecs", "0MiB", "-3MiB"):
        with pytest.raises(ZooError, match="memory budget"):
            parse_bytes(bad)


ROWS = [
    {"policy": "none", "temp_bytes": 900, "argument_bytes": 100, "step_ms": 1.0},
    {"policy": "full", "temp_bytes": 300, "argument_bytes": 100, "step_ms": 3.0},
    {"policy": "dots", "temp_bytes": 500, "argument_bytes": 100, "step_ms": 2.0},
]


def test_the_fastest_fitting_policy_is_chosen():
    assert choose_under_budget(ROWS, 1000)[0] == "none"
    chosen, rows = choose_under_budget(ROWS, 600)  # temp + arguments: none 1000 and dots 600
    assert chosen == "dots" and [r["fits"] for r in rows] == [False, True, True]
    assert choose_under_budget(ROWS, 399)[0] is None
    error = nothing_fits(ROWS, 399)
    assert "'full' at 400 bytes" in str(error) and "budget of 399 bytes" in str(error)
    assert footprint(ROWS[0]) == 1000


def quick(**values):
    return settings.with_values(
        recipes.load_recipe("digits-mlp"),
        {
            "train.steps": 3,
            "train.eval_every": 3,
            "train.checkpoint_every": 3,
            "train.eval_batches": 1,
            **values,
        },
    )


# Three candidates, not all ten: the search is the same loop over any list (and the CLI's
# figures in docs/remat.md come from the full one).
CANDIDATES = ["none", "full", "nested"]


@pytest.fixture
def few_policies(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(auto_remat, "policy_names", lambda: CANDIDATES)


def test_auto_trains_with_the_choice_and_a_second_run_reads_the_cache(tmp_path, monkeypatch, few_policies):
    recipe = quick(**{"train.remat": "auto", "train.memory_budget": "1GiB"})
    summary = train_recipe(recipe, tmp_path / "a", show_progress=False)
    doc = json.loads((tmp_path / "cache" / auto_remat.CACHE_FILE).read_text())
    (entry,) = doc.values()
    fastest = min((r for r in entry["rows"] if r["fits"]), key=lambda r: r["step_ms"])
    assert summary["remat"] == f"auto:{entry['chosen']}" == f"auto:{fastest['policy']}"
    assert summary["compile_count"] == 1  # the search compiles outside the training loop
    assert [r["policy"] for r in entry["rows"]] == CANDIDATES

    def no_search(*args, **kwargs):
        raise AssertionError("searched again despite the cache")

    monkeypatch.setattr(auto_remat, "measure", no_search)
    run = build_run(recipe)
    chosen, rows, cached = auto_remat.choose(run, train_batch(run, 0))
    assert cached and chosen == entry["chosen"] and rows == entry["rows"]


def test_auto_refuses_a_budget_nothing_fits(tmp_path, few_policies):
    with pytest.raises(
        ZooError, match=r"no policy fits the memory budget of 1,024 bytes.*smallest footprint is"
    ):
        train_recipe(
            quick(**{"train.remat": "auto", "train.memory_budget": "1KiB"}),
            tmp_path / "a",
            show_progress=False,
        )
    with pytest.raises(ZooError, match="--remat auto needs a budget"):
        quick(**{"train.remat": "auto"})


def test_an_unknown_remat_name_lists_auto_too():
    with pytest.raises(ZooError, match=r"unknown remat policy 'autox'.*; or auto \(with --memory-budget\)"):
        quick(**{"train.remat": "autox"})


def test_the_cache_key_holds_the_precision():
    """A bf16 run plans with bf16 steps: it does not read a float32 run's choice."""
    budget = {"train.remat": "auto", "train.memory_budget": "1GiB"}
    runs = {
        p: build_run(quick(**budget, **{"train.precision": p}), choose_remat=False)
        for p in ("float32", "bfloat16")
    }
    keys = {p: auto_remat._key(run, train_batch(run, 0), 2**30) for p, run in runs.items()}
    assert keys["float32"] != keys["bfloat16"]
    assert runs["bfloat16"].engine.precision.name == "bfloat16"
