"""``zoo.commands.train``: ``zoo eval`` of a DP run says what its epsilon protects; a flag wins
over a ``--set`` of the same recipe field."""

from __future__ import annotations

import json
import warnings

import pytest

from tests.tiny import FIXED_NOISE
from zoo import recipes
from zoo.cli import build_parser, main
from zoo.commands import settings
from zoo.commands.train import FLAG_FIELDS, SECTION_FLAGS, recipe_changes, resolve_recipe
from zoo.train.loop import train_recipe

TINY = {"train.steps": 2, "train.eval_batches": 1, "train.checkpoint_every": 2, "model.d_hidden": 8}
TINY |= FIXED_NOISE


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


def _train_actions() -> dict:
    """``zoo train``'s argparse actions by dest."""
    parser = build_parser("train")
    train = next(a for a in parser._actions if a.dest == "command").choices["train"]
    return {action.dest: action for action in train._actions}


def _both_orders(option: str, flag: str, assignment: str) -> list[list[str]]:
    flag_words, set_words = [option, flag], ["--set", assignment]
    return [
        ["train", "digits-mlp", *flag_words, *set_words],
        ["train", "digits-mlp", *set_words, *flag_words],
    ]


TYPED = {int: ("7", "3"), float: ("0.5", "0.25")}  # a flag's text, and another value for --set


@pytest.mark.parametrize("dest", sorted(FLAG_FIELDS))
def test_a_flag_wins_over_a_set_of_the_same_field(dest):
    """Issue 67, item 4: --set train.batch_size=32 --batch-size 64 trained at 32 (a --set won
    over a flag), against docs/recipes.md's "flags override fields". Every flag of the table,
    written before or after the --set."""
    action = _train_actions()[dest]
    section, field = FLAG_FIELDS[dest]
    if action.choices:
        flag, other = action.choices[-1], action.choices[0]
    else:
        flag, other = TYPED.get(action.type, ("from-flag", "from-set"))
    want = action.type(flag) if action.type else flag
    want = [want] if action.nargs is None and type(action).__name__ == "_AppendAction" else want
    for argv in _both_orders(action.option_strings[0], flag, f"{section}.{field}={other}"):
        assert recipe_changes(build_parser("train").parse_args(argv))[section][field] == want, argv


SECTION_EXAMPLES = {  # dest -> (the flag's text, a --set of one of its fields, (field, the flag's value))
    "lora": ("rank=8", "lora.rank=4", ("rank", 8)),
    "mesh": ("data=2", "mesh.data=4", ("data", 2)),
}


@pytest.mark.parametrize("dest", sorted(SECTION_FLAGS))
def test_a_section_flag_wins_over_a_set_of_one_of_its_fields(dest):
    assert set(SECTION_EXAMPLES) == set(SECTION_FLAGS), "give each flag of SECTION_FLAGS an example"
    flag, assignment, (field, want) = SECTION_EXAMPLES[dest]
    section = SECTION_FLAGS[dest][0]
    for argv in _both_orders(f"--{dest}", flag, assignment):
        assert recipe_changes(build_parser("train").parse_args(argv))[section][field] == want, argv


def test_the_recipe_trains_at_the_flags_batch_size():
    argv = ["train", "digits-mlp", "--set", "train.batch_size=32", "--batch-size", "64"]
    assert resolve_recipe(build_parser("train").parse_args(argv)).train.batch_size == 64
