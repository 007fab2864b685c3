"""``zoo.cache``: the one reader and writer of the measured-choice files under ``$ZOO_CACHE_DIR``."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from zoo.cache import ChoiceCache, cache_dir, digest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_CACHE_DIR", str(tmp_path / "zoo-cache"))
    return ChoiceCache("choices.json")


def test_the_folder_is_zoo_cache_dir_else_home(tmp_path, monkeypatch, cache):
    assert cache_dir() == tmp_path / "zoo-cache" and cache.path == tmp_path / "zoo-cache" / "choices.json"
    cache.put("k", {"v": 1})
    assert json.loads((tmp_path / "zoo-cache" / "choices.json").read_text()) == {"k": {"v": 1}}
    monkeypatch.delenv("ZOO_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.path == tmp_path / "home" / ".cache" / "zoo" / "choices.json"
    monkeypatch.setenv("ZOO_CACHE_DIR", "")  # set but empty: the default, not the working folder
    assert cache_dir() == tmp_path / "home" / ".cache" / "zoo"


def test_the_key_is_a_digest_of_the_parts_whatever_their_order():
    assert digest({"a": 1, "b": [2, 3]}) == digest({"b": [2, 3], "a": 1}) != digest({"a": 1, "b": [3, 2]})
    assert len(digest({})) == 24


@pytest.mark.parametrize("text", ["{not json", "[" * 200_000, "[1, 2]", '"a string"', ""])
def test_a_corrupt_file_reads_as_empty_and_is_replaced_by_the_next_write(cache, text):
    cache.path.parent.mkdir(parents=True)
    cache.path.write_text(text)
    assert cache.read() == {} and cache.get("k") is None
    cache.put("k", {"v": 1})
    assert json.loads(cache.path.read_text()) == {"k": {"v": 1}} and cache.get("k") == {"v": 1}


def test_a_missing_or_partial_entry_is_none(cache):
    assert cache.read() == {} and cache.get("k") is None  # no file at all
    cache.put("k", {"form": "gram"})  # an entry cut short, or written by hand
    whole = lambda entry: isinstance(entry["ms"], dict)  # noqa: E731  (raises KeyError here)
    assert cache.get("k", whole) is None and cache.get("k") == {"form": "gram"}
    assert cache.get("k", lambda entry: entry["form"] == "materialise") is None
    assert cache.get("other") is None


def test_a_write_merges_into_the_file_as_it_is_on_disk(cache):
    """Two runs hold the cache at once: what one wrote since the other read is kept."""
    first, second = ChoiceCache("choices.json"), ChoiceCache("choices.json")
    assert first.read() == second.read() == {}
    first.put("a", 1)
    second.put("b", 2)
    first.put("a", 3)  # a key is replaced, the others kept
    assert cache.read() == {"a": 3, "b": 2}
    assert not list(cache.path.parent.glob("*.tmp"))  # no temporary file left behind


WRITER = """
import sys
from zoo.cache import ChoiceCache
name, count = sys.argv[1], int(sys.argv[2])
cache = ChoiceCache("choices.json")
for i in range(count):
    cache.put(f"{name}-{i}", {"writer": name, "i": i})
"""


def test_writers_in_parallel_processes_keep_every_entry(cache):
    """Four processes writing at once: every entry of every writer is in the file at the end
    (reading, merging and renaming without the lock loses entries to the race)."""
    writers, count = 4, 40
    env = {"ZOO_CACHE_DIR": str(cache.path.parent), "PYTHONPATH": str(REPO), "PATH": ""}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, f"w{n}", str(count)], env=env) for n in range(writers)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * writers
    doc = cache.read()
    assert set(doc) == {f"w{n}-{i}" for n in range(writers) for i in range(count)}
