"""dp.unit = "user" from the command line (zoo.dp.users, zoo.dp.els_sampler, zoo.data.users): a DP run on
a CSV with a user column, or a language model on text:DIR with each file one user, protects
users, by ULS (the default) or ELS (dp.sampler = "els").
Removing one user with all of its records leaves every shape, message, summary field and exit
status equal (only the weights, the eval figures and the DP figures that follow the public
number of users may differ); settings that cannot give users are refused in one line, before
any data is read."""

from __future__ import annotations

import dataclasses
import json
import shutil

import numpy as np
import pytest

from tests.e2e.clikit import refused
from tests.e2e.test_dp_neighbours import MLP, outcome
from tests.tiny import TINY_DP
from zoo.data.users import held_out
from zoo.dp import plan as dp_plan
from zoo.train import stages

# The two runs of a pair compile the same programs (the spec is public), and so do most pairs
# and test_dp_neighbours' runs of the same MLP on its worker: the second reads them back.
pytestmark = [pytest.mark.xdist_group("dp-neighbours")]

K = 3


def _largest_training_user(records_of: list[int]) -> int:
    """A user in the training split (the eval split holds out 20% of the users, by their
    names: zoo.data.users), made the one with the most records."""
    names = [f"person-{u}" for u in range(len(records_of))]
    return next(u for u, held in enumerate(held_out(names, 0.2, 0)) if not held)


RECORDS_OF = [1, 2, 1, 1, 3, 2, 1, 4, 2, 1] * 4  # 40 users, skewed
LARGEST = _largest_training_user(RECORDS_OF)
RECORDS_OF[LARGEST] = 7  # above k = 3: subsampled, silently
USERS = ["--set", "data.user_column=user", "--set", "data.classes=[0, 1, 2]", "--set", "dp.unit=user"]
USERS += ["--set", "dp.clipping=vmap", "--set", f"dp.records_per_user={K}"]
USERS += ["--set", "dp.expected_batch_size=8", "--set", "dp.delta=1e-3"]
# ELS clips each record, so ghost clipping serves it; its mixture of Gaussians needs pld
ELS = ("--set", "dp.sampler=els", "--set", "dp.accountant=pld", "--set", "dp.clipping=ghost")


def users_table(skip: int | None = None) -> str:
    """``user,a,b,label`` rows, user ``u`` with ``RECORDS_OF[u]`` records; ``skip``: a user left out."""
    rng = np.random.default_rng(0)
    lines = ["user,a,b,label"]
    for user, count in enumerate(RECORDS_OF):
        for _ in range(count):
            a, b = rng.normal(size=2)
            if user != skip:
                lines.append(f"person-{user},{a:.3f},{b:.3f},{(user + int(a > 0)) % 3}")
    return "\n".join(lines) + "\n"


def neighbour_users(capsys, tmp_path, sampler: tuple[str, ...] = ()) -> tuple[dict, dict]:
    seen = []
    for i, text in enumerate((users_table(), users_table(skip=LARGEST))):
        path = tmp_path / "data.csv"  # the same path for both: the spec is public
        path.write_text(text)
        argv = [*MLP, *USERS, *sampler, "--dataset", f"csv:{path}"]
        seen.append(outcome(capsys, tmp_path, f"run{i}", argv))
    return seen[0], seen[1]


@pytest.mark.parametrize(("sampler", "algorithm"), [((), "ULS"), (ELS, "ELS")], ids=["uls", "els"])
def test_removing_a_user_with_all_its_records_changes_nothing_released(capsys, tmp_path, sampler, algorithm):
    a, b = neighbour_users(capsys, tmp_path, sampler)
    assert a["code"] == 0, a["printed"][-3:]
    assert a == b
    assert a["summary"]["privacy_unit"] == "user" and a["summary"]["records_per_user"] == K
    assert a["summary"]["user_sampling"] == algorithm


def test_a_cap_read_off_the_largest_user_tells_the_neighbours_apart(capsys, tmp_path, monkeypatch):
    """Planted: k taken from how many records the largest user has (not dp.records_per_user)
    shows in the released summary, and the comparison above catches it."""
    made = dp_plan.make_plan

    def cap_from_the_data(dp, *args, users=None, **kwargs):
        largest = int(np.diff(users[0]).max())
        return made(dataclasses.replace(dp, records_per_user=largest), *args, users=users, **kwargs)

    monkeypatch.setattr(stages, "make_plan", cap_from_the_data)
    a, b = neighbour_users(capsys, tmp_path)
    assert a["code"] == b["code"] == 0
    assert a != b


@pytest.mark.parametrize(
    ("sets", "fragments"),
    [
        (["--set", "dp.unit=user"], ("dp.unit = 'user' needs", "data.user_column")),
        (["--set", "dp.unit=users"], ("dp.unit", "'users'", "record, user")),
        (["--set", "dp.records_per_user=0"], ("dp.records_per_user", "0")),
        (["--set", "data.user_column=user", "--set", "dp.enabled=false"], ("only under DP",)),
        (["--set", "dp.sampler=els"], ("dp.sampler = 'els' draws the units user", "poisson")),
        (
            "--set data.user_column=user --set dp.unit=user --set dp.sampler=els --set dp.accountant=rdp".split(),
            ("dp.accountant = 'rdp' cannot account dp.sampler = 'els'", "pld"),
        ),
    ],
)
def test_settings_that_cannot_give_users_are_refused_before_the_data_is_read(capsys, sets, fragments):
    """The CSV does not exist: each refusal comes from the settings, not from reading it."""
    argv = ["train", "digits-mlp-dp", "--steps", "1", "--dataset", "csv:/nonexistent/users.csv", *sets]
    refused(capsys, argv, *fragments)


@pytest.mark.parametrize("unit", ["user", "record"])
def test_a_form_without_users_is_refused_naming_the_forms_with_them(capsys, unit):
    """A user column is never ignored: where it cannot be read, it is refused under either unit,
    for a classifier and a language model alike, and text files take users by file only."""
    sets = ["--set", "data.user_column=user", "--set", f"dp.unit={unit}", "--set", "dp.clipping=vmap"]
    with_users = ("csv:PATH", "text:PATH[,PATH...] (data.user_column = 'file')")
    digits = ["train", "digits-mlp-dp", "--steps", "1", *sets]
    refused(capsys, digits, "'digits' cannot give users", *with_users)
    lm = ["train", "python-docs-lm-dp", "--steps", "1", *sets]
    refused(capsys, lm, "'python-docs' cannot give users", *with_users)
    text = [*lm, "--dataset", "text:/nonexistent/corpus"]
    refused(capsys, text, "data.user_column = 'user'", "names its users by data.user_column = 'file' only")


# -- a language model on text:DIR, each file one user --------------------------------------------
FILES = 12
LM = ["train", "python-docs-lm-dp", *TINY_DP, "--set", "data.user_column=file", "--set", "dp.unit=user"]
LM += ["--set", "dp.clipping=vmap", "--set", f"dp.records_per_user={K}", "--set", "dp.expected_batch_size=4"]
LM += ["--set", "data.eval_fraction=0.25", "--set", "data.seq_len=8", "--set", "model.max_len=8"]
LM += ["--set", "model.d_model=16", "--set", "model.num_layers=1", "--set", "model.d_ff=16", "--steps", "1"]


def write_corpus(root) -> list:
    """``FILES`` text files of different lengths (4 to 32 windows of 8 tokens each): 3 users
    held out for eval and the rest kept. A file's user is its name inside the folder, so the
    split is the same wherever the folder lies; the names are picked from 60 by
    :func:`held_out` itself, so that the corpus holds 3 held-out users whatever the hash."""
    root.mkdir(parents=True)
    pool = [root / f"{user:02d}.txt" for user in range(60)]
    held = held_out([path.name for path in pool], 0.25, 0)
    kept, out = np.flatnonzero(~held)[: FILES - 3], np.flatnonzero(held)[:3]
    assert len(kept) == FILES - 3 and len(out) == 3, "60 names hold 3 held-out and 9 kept users"
    paths = [pool[i] for i in sorted([*kept, *out])]
    for user, path in enumerate(paths):
        path.write_text("".join(f"note {line} of person {user}\n" for line in range(2 + user)))
    return paths


def test_removing_a_file_from_an_lm_run_over_users_changes_nothing_released(capsys, tmp_path):
    """Each file of text:DIR is one user: the summary counts the training files as users, and a
    run without the largest training file releases the same (only the weights, the eval figures
    and the DP figures that follow the public number of users may differ)."""
    paths = write_corpus(tmp_path / "corpus")
    train = np.flatnonzero(~held_out([p.name for p in paths], 0.25, 0))  # by name (zoo.data.users)
    argv = [*LM, "--dataset", f"text:{tmp_path / 'corpus'}"]
    first = outcome(capsys, tmp_path, "run0", argv)
    paths[int(train.max())].unlink()  # the longest file among the training users
    second = outcome(capsys, tmp_path, "run1", argv)
    assert first["code"] == 0, first["printed"][-3:]
    assert first == second
    summaries = [json.loads((tmp_path / run / "summary.json").read_text()) for run in ("run0", "run1")]
    assert [s["privacy_unit"] for s in summaries] == ["user", "user"]
    assert [s["privacy_units"] for s in summaries] == [len(train), len(train) - 1]
    assert summaries[0]["records_per_user"] == K


def test_a_corpus_moved_to_another_folder_gives_the_same_users_split_and_epsilon(capsys, tmp_path):
    """Issue 67, item 2: the same 24 files and seed from ``d`` and from ``copy/d`` trained 19
    users against 15, with disjoint held-out sets, and epsilon moved with N: a file's user was
    its absolute path. Now it is its path inside the folder the spec names."""
    write_corpus(tmp_path / "here" / "corpus")
    shutil.copytree(tmp_path / "here" / "corpus", tmp_path / "there" / "copy" / "corpus")
    seen = []
    for where in ("here", "there/copy"):
        folder = tmp_path / where / "corpus"
        seen.append(outcome(capsys, tmp_path, where.replace("/", "-"), [*LM, "--dataset", f"text:{folder}"]))
        assert seen[-1]["code"] == 0, seen[-1]["printed"][-3:]
    first, second = (
        json.loads((tmp_path / run / "summary.json").read_text()) for run in ("here", "there-copy")
    )
    assert first["privacy_units"] == FILES - 3 and first["epsilon"] > 0
    for key in ("privacy_units", "epsilon", "delta", "sampling_prob", "eval_loss"):
        assert first[key] == second[key], key


# -- issue 60: a profile, special files and a refusal, each the same for neighbouring datasets ---
PROFILE = ("--steps", "4", "--profile", "2:3", "--set", "train.eval_every=3")  # step 3 evaluates


@pytest.mark.usefixtures("no_compile_cache")  # both runs compile: the same compile events
def test_a_profile_under_dp_holds_the_same_events_for_neighbours_and_no_python(capsys, tmp_path):
    """Issue 60, item 1: the Python tracer recorded the loader (a user is sorted only when it
    holds more than k records) and, at an eval step, the accountant: 478,942 against 478,610
    events. Planted: the trace started with the Python tracer on fails both assertions."""
    a, b = neighbour_users(capsys, tmp_path, PROFILE)
    assert a["code"] == 0, a["printed"][-3:]
    assert a["profile"] and not [name for name in a["profile"] if name.startswith("$")]  # "$file:line f"
    assert a == b


def special_pair(capsys, tmp_path, special: str) -> tuple[dict, dict]:
    """``write_corpus``'s folder, and the same with one more entry that is not a regular file."""
    import os

    paths = write_corpus(tmp_path / "corpus")
    argv = [*LM, "--dataset", f"text:{tmp_path / 'corpus'}"]
    first = outcome(capsys, tmp_path, "run0", argv)
    odd = paths[0].parent / "zz.txt"
    os.mkfifo(odd) if special == "fifo" else odd.symlink_to(tmp_path / "gone.txt")
    return first, outcome(capsys, tmp_path, "run1", argv)


@pytest.mark.parametrize("special", ["fifo", "dangling link"])
def test_a_file_that_cannot_be_read_is_a_user_with_no_record(capsys, tmp_path, special):
    """Issue 60, items 4 and 5: a FIFO in text:DIR blocked the DP run forever in open(), and a
    dangling link ended in a traceback, so the exit status depended on one user's file. Under DP
    either is read as empty text: the run releases what it does without that user."""
    a, b = special_pair(capsys, tmp_path, special)
    assert a["code"] == 0, a["printed"][-3:]
    assert a == b


SHORT = [*LM, "--set", "data.seq_len=64", "--set", "model.max_len=64"]


def short_users_corpus(root, extra: bool) -> None:
    """Users too short for one window of 65 tokens (all of them together too), and held-out users
    long enough for the eval split; ``extra``: one more short user, in the training split. The
    users (each file's name in the folder) are picked from 40 names by :func:`held_out` itself."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir()
    names = [root / f"{user:02d}.txt" for user in range(40)]
    held = held_out([path.name for path in names], 0.25, 0)
    long_users, short_users = np.flatnonzero(held)[:3], np.flatnonzero(~held)[:10]
    assert len(long_users) == 3 and len(short_users) == 10, "40 names hold 3 held-out and 10 kept users"
    chosen = [*long_users, *short_users[: 10 if extra else 9]]
    for user in chosen:
        text = "a long held-out text\n" * 8 if held[user] else f"u{user}\n" * (1 + user % 3)
        names[user].write_text(text)


def test_a_refusal_for_users_too_short_for_a_window_releases_no_token_count(capsys, tmp_path):
    """Issue 60, item 3: the refusal printed the training tokens ("72" against "91 train
    tokens"), which count users too short to give a record, while N = 0 in both. Now both are
    refused by the public count of units, N = 0, in the same line."""
    seen = []
    for extra in (False, True):
        short_users_corpus(tmp_path / "corpus", extra)  # the same spec for both
        seen.append(
            outcome(capsys, tmp_path, f"run{extra}", [*SHORT, "--dataset", f"text:{tmp_path / 'corpus'}"])
        )
    assert seen[0] == seen[1]
    assert seen[0]["code"] == 2 and "num_examples=0" in seen[0]["printed"][-1], seen[0]["printed"]
