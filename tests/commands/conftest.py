"""Two short runs, a DP and a non-DP one, shared by the tests of ``zoo plot`` and ``zoo runs``."""

from __future__ import annotations

import json
import warnings

import pytest

from zoo import recipes
from zoo.commands import settings
from zoo.train.loop import train_recipe

TINY = {"train.log_every": 1, "train.eval_every": 2, "train.eval_batches": 2, "train.checkpoint_every": 4}


def series(run_dir, key) -> tuple[list[int], list[float]]:
    """Steps and values of ``key`` in ``metrics.jsonl``, read here without zoo's reader."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if key in r], [r[key] for r in records if key in r]


# Its tests (test_plot.py, test_runs.py) share an xdist group, so the two runs train once.
GROUP = pytest.mark.xdist_group("commands-runs")


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("plot-runs")
    for name, steps in (("digits-mlp", 6), ("digits-mlp-dp", 4)):
        recipe = settings.with_values(recipes.load_recipe(name), {**TINY, "train.steps": steps})
        with warnings.catch_warnings():  # the recipes' warmup is longer than these runs
            warnings.simplefilter("ignore")
            train_recipe(recipe, root / name, show_progress=False)
    return root
