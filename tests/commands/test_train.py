"""``zoo.commands.train``: ``zoo eval`` of a DP run says what its epsilon protects."""

from __future__ import annotations

import json
import warnings

from zoo import recipes
from zoo.cli import main
from zoo.commands import settings
from zoo.train.loop import train_recipe

TINY = {"train.steps": 2, "train.eval_batches": 1, "train.checkpoint_every": 2, "model.d_hidden": 8}
TINY |= {"dp.epsilon": None, "dp.noise_multiplier": 2.0, "dp.accountant": "rdp"}


def test_eval_of_a_user_level_run_names_the_unit_its_epsilon_protects(tmp_path, capsys):
    recipe = settings.with_values(recipes.load_recipe("skewed-users-mlp-dp"), TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        summary = train_recipe(recipe, tmp_path / "run", show_progress=False)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run"), "--json"]) == 0
    said = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert said["privacy_unit"] == "user" and said["records_per_user"] == 4
    assert said["privacy_units"] == summary["privacy_units"] and said["user_sampling"] == "ULS"
